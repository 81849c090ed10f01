"""`holdover broker-config`: a Mosquitto that lets each sentinel speak only for itself.

A password per client and an ACL per sentinel: a sentinel may publish only under its own id (its
status, state, events, command answers and its Home Assistant entities) and read only its own
commands; the bridge reads and writes everything under holdover/ and the discovery prefix. The
signatures already stop a forged event at the bridge; the ACL stops a stolen board's credentials
from even reaching the other sentinels' topics or filling the broker with them.

Passwords are hashed by `mosquitto_passwd` (Mosquitto's own PBKDF2-SHA512 format), not here.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from holdover import proc
from holdover.errors import HoldoverError
from holdover.files import kept_secret, write_private
from holdover.firmware import protocol

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


def acl(sids: list[str], ha_prefix: str = protocol.HA_PREFIX, ha: bool = False) -> str:
    root = protocol.ROOT
    out = [
        "# Written by `holdover broker-config`. Mosquitto denies whatever is not granted here.",
        "",
        f"user {BRIDGE_USER}",
        f"topic readwrite {root}/#",
        f"topic readwrite {ha_prefix}/#",
    ]
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
) -> Written:
    """mosquitto.conf, passwd and acl in `directory`; a password per user, kept in USER.password
    (0600) for the configs that need it. A user that already has one keeps it, so adding a
    sentinel never locks out a board already deployed; `rotate` names those to replace."""
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
    users = [BRIDGE_USER, *([HA_USER] if ha else []), *sids]
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
    _private(w.acl, acl(sids, ha=ha), owner)
    w.conf.write_text(conf(directory, listen, port, persistence))
    w.fragment.write_text(fragment(directory, listen, port))
    return w
