"""`holdover broker-config`: a Mosquitto that lets each sentinel and each node speak only for itself.

A password per client and an ACL per identity. A sentinel may publish only under its own id (its
status, state, events, command answers and its Home Assistant entities) and read only its own
commands. Every bridge reads everything under holdover/, and writes only its own node's leaves
(holdover/node/NAME/state, status, uplink), its node's Home Assistant entities and the alerts
topic; the sentinels' bridge (`holdover-bridge`, beside the sentinels) alone writes their command
topics (signed commands, event receipts), and every other node's bridge logs in as
`holdover-node-NAME`. Only Home Assistant's user may press a node's checkpoint button or a
sentinel's relay. The signatures already stop a forged event at the bridge; the ACL stops a
stolen board's or node's credentials from speaking for another: node reports are unsigned, and
what keeps one node from claiming another's job is saved is that the broker lets only that node's
identity publish under its name (MQTT tells a subscriber nothing of who published).

Passwords are hashed by `mosquitto_passwd` (Mosquitto's own PBKDF2-SHA512 format), not here.
"""

from __future__ import annotations

import os
import pwd
import re
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from holdover import proc
from holdover.errors import HoldoverError
from holdover.files import kept_secret, write_atomic, write_private
from holdover.firmware import protocol
from holdover.settings import NODE_NAME

BRIDGE_USER = "holdover-bridge"
HA_USER = "homeassistant"
# What a sentinel publishes under holdover/SID/ (its last will goes to STATUS too).
SENTINEL_WRITES = (protocol.STATUS, protocol.STATE, protocol.EVENT, protocol.CMD_ACK)


class BrokerConfigError(HoldoverError, RuntimeError):
    pass


@dataclass
class Written:
    dir: Path
    conf: Path
    passwd: Path
    acl: Path
    fragment: Path  # holdover.conf, for Debian's packaged mosquitto (conf.d)
    passwords: dict[str, str] = field(default_factory=dict)  # user -> password, to print once
    password_files: dict[str, Path] = field(default_factory=dict)
    new: list[str] = field(default_factory=list)  # users with no password before this run
    rotated: list[str] = field(default_factory=list)  # users whose password was replaced on purpose


NODE_USER = "holdover-node-"  # + the node's name: the bridge of a node other than the sentinels'
# A node's own retained leaves; not its checkpoint button, which is Home Assistant's to press.
NODE_WRITES = (protocol.STATE, protocol.STATUS, protocol.UPLINK)


def node_user(node: str) -> str:
    return NODE_USER + node


def _node_grants(node: str, ha_prefix: str) -> list[str]:
    out = [f"topic read {protocol.ROOT}/#"]
    out += [f"topic write {protocol.node_topic(node, leaf)}" for leaf in NODE_WRITES]
    out += [f"topic write {protocol.ALERTS}"]
    out += [f"topic write {protocol.ha_config_topic(ha_prefix, '+', protocol.ha_node_id(node), '+')}"]
    return out


def acl(
    sids: list[str], ha_prefix: str = protocol.HA_PREFIX, ha: bool = False, *, node: str, nodes: tuple[str, ...] = ()
) -> str:
    """`node`: the machine of the sentinels' bridge; `nodes`: every other node's bridge."""
    root = protocol.ROOT
    out = [
        "# Written by `holdover broker-config`. Mosquitto denies whatever is not granted here.",
        "",
        f"user {BRIDGE_USER}",
        *_node_grants(node, ha_prefix),
        *(f"topic write {protocol.topic(sid, protocol.CMD)}" for sid in sids),
        # The sentinels' entities in Home Assistant, emptied by `holdover ha-remove`.
        *(f"topic write {protocol.ha_config_topic(ha_prefix, '+', sid, '+')}" for sid in sids),
        f"topic read {ha_prefix}/#",
    ]
    for other in nodes:
        out += ["", f"user {node_user(other)}", *_node_grants(other, ha_prefix)]
    if ha:
        # Home Assistant: reads every state, announces itself, switches relays (the bridge signs
        # those) and presses a node's checkpoint button (the bridge rate-limits and journals it).
        out += ["", f"user {HA_USER}", f"topic read {root}/#", f"topic readwrite {ha_prefix}/#"]
        out += [f"topic write {protocol.topic('+', protocol.RELAY_SET)}"]
        out += [f"topic write {protocol.node_topic('+', protocol.NODE_CHECKPOINT)}"]
    for sid in sids:
        out += ["", f"user {sid}"]
        out += [f"topic write {protocol.topic(sid, leaf)}" for leaf in SENTINEL_WRITES]
        out += [f"topic read {protocol.topic(sid, protocol.CMD)}"]
        out += [f"topic write {ha_prefix}/+/holdover_{sid}/+/config"]  # its discovery messages only
    return "\n".join(out) + "\n"


def auth(directory: Path) -> str:
    """The lines that turn authentication and the ACL on (the test broker takes these alone)."""
    return f"allow_anonymous false\npassword_file {directory / 'passwd'}\nacl_file {directory / 'acl'}\n"


# Events are a few hundred bytes, each sent on its own the moment it happens: with Nagle's algorithm
# on, the broker holds one for the bridge until its last segment is acknowledged, a delayed ACK
# (measured here: a 20 ms tail on mains_suspect, bench/alert_latency.py).
NODELAY = "set_tcp_nodelay true\n"


def conf(directory: Path, listen: str, port: int, persistence: Path) -> str:
    return (
        "# Written by `holdover broker-config`: run with `mosquitto -c` this file.\n"
        "# A LAN broker: the sentinels reach it while the internet uplink is down.\n"
        f"listener {port} {listen}\n"
        "# Each event on its way at once, not held for the last segment's ACK (Nagle's algorithm).\n"
        + NODELAY
        + auth(directory)
        + "# Keep sessions and queued messages across a restart of the broker.\n"
        "persistence true\n"
        f"persistence_location {persistence}/\n"
        "log_dest stderr\nlog_type error\nlog_type warning\nlog_type notice\n"
    )


DEBIAN_CONF_D = Path("/etc/mosquitto/conf.d")


def fragment(directory: Path, listen: str, port: int) -> str:
    """The same broker as a conf.d file for Debian's packaged mosquitto.service: its own
    mosquitto.conf already sets persistence, the log and the pid file, and Mosquitto refuses a
    second persistence_location ("Duplicate persistence_location value"), so this has none."""
    return (
        "# Written by `holdover broker-config`: for Debian's mosquitto.service, linked into\n"
        f"# {DEBIAN_CONF_D}/ (its mosquitto.conf keeps the persistence, log and pid file).\n"
        f"listener {port} {listen}\n" + NODELAY + auth(directory)
    )


def _private(path: Path, text: str, owner: str | None) -> None:
    write_private(path, text)
    _own(path, owner)


def _kept_password(path: Path) -> str | None:
    try:
        return kept_secret(path)
    except OSError as e:
        raise BrokerConfigError(f"{path}: cannot read the password kept there: {e.strerror}") from None


def _own(path: Path, owner: str | None) -> None:
    """Mosquitto reads its password and ACL files as the user it drops to."""
    if owner is None or os.geteuid() != 0:
        return
    try:
        pw = pwd.getpwnam(owner)
    except KeyError:
        return
    os.chown(path, pw.pw_uid, pw.pw_gid)


def write(
    directory: Path,
    sids: list[str],
    listen: str = "0.0.0.0",
    port: int = 1883,
    persistence: Path = Path("/var/lib/mosquitto"),
    ha: bool = False,
    owner: str | None = "mosquitto",
    rotate: list[str] | None = None,
    *,
    node: str,
    nodes: list[str] | None = None,
) -> Written:
    """mosquitto.conf, passwd and acl in `directory`; a password per user, kept in USER.password
    (0600) for the configs that need it. A user that already has one keeps it, so adding a
    sentinel never locks out a board already deployed; `rotate` names those to replace. `node` is
    this machine (the sentinels' bridge runs here), `nodes` the site's other nodes, a user each."""
    tool = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"
    if not Path(tool).exists():
        raise BrokerConfigError("mosquitto_passwd is not installed: apt-get install mosquitto")
    bad = [s for s in sids if not protocol.valid_sid(s) or s in (BRIDGE_USER, HA_USER)]
    if not sids or bad:
        raise BrokerConfigError(f"sentinel ids to write users for: {sids or 'none'} {bad or ''}".strip())
    directory.mkdir(parents=True, exist_ok=True)
    w = Written(
        directory, directory / "mosquitto.conf", directory / "passwd", directory / "acl", directory / "holdover.conf"
    )
    others = [n for n in dict.fromkeys(nodes or []) if n != node]
    bad_nodes = [n for n in others if not re.match(NODE_NAME, n)]
    if bad_nodes:
        raise BrokerConfigError(f"--node {', '.join(bad_nodes)}: a node's name is its host name ([A-Za-z0-9_.-])")
    users = [BRIDGE_USER, *([HA_USER] if ha else []), *sids, *map(node_user, others)]
    unknown = sorted(set(rotate or []) - set(users))
    if unknown:
        raise BrokerConfigError(f"--rotate {', '.join(unknown)}: no such client (the clients: {', '.join(users)})")
    w.passwd.unlink(missing_ok=True)
    for i, user in enumerate(users):
        kept = _kept_password(directory / f"{user}.password")
        if kept and user not in (rotate or []):
            w.passwords[user] = kept
        else:
            (w.rotated if kept else w.new).append(user)
            w.passwords[user] = secrets.token_urlsafe(24)
        # -b takes the password as an argument (seen in this machine's process list for a moment);
        # without it mosquitto_passwd insists on a terminal.
        flags = ["-c"] if i == 0 else []
        r = proc.run_sync([tool, *flags, "-b", str(w.passwd), user, w.passwords[user]], timeout=30)
        if not r.ok:
            raise BrokerConfigError(f"mosquitto_passwd for {user}: {r.describe()}: {r.output.strip()}")
        w.password_files[user] = directory / f"{user}.password"
        _private(w.password_files[user], w.passwords[user] + "\n", None)
    os.chmod(w.passwd, 0o600)
    _own(w.passwd, owner)
    _private(w.acl, acl(sids, ha=ha, node=node, nodes=tuple(others)), owner)
    write_atomic(w.conf, conf(directory, listen, port, persistence))  # a running broker may re-read it
    write_atomic(w.fragment, fragment(directory, listen, port))
    return w
