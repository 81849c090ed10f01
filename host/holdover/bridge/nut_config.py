"""`holdover nut-config`: the NUT server config that serves each sentinel as a UPS.

ups.conf (a dummy-ups device per sentinel, reading the file bridge/nut_serve.py keeps current),
upsd.conf (where upsd listens), upsd.users (a `upsmon secondary` user per client machine, a
password each, kept in CLIENT.password, 0600) and nut.conf (MODE=netserver). A re-run keeps every
password it finds, so adding a client never breaks one already following; `rotate` replaces the
named ones on purpose.

NUT's daemons drop to the packaged `nut` user before they read upsd.conf and upsd.users, so the
files are root:nut 0640, as Debian's nut-server ships its own: written root-only, upsd ran but
refused every client (ERR ACCESS-DENIED), and no machine following it would ever have shut down.
"""

from __future__ import annotations

import grp
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from holdover.bridge.nut_serve import dev_path
from holdover.errors import HoldoverError
from holdover.files import kept_secret, write_atomic, write_private
from holdover.settings import NutServerSettings


class NutConfigError(HoldoverError):
    pass


@dataclass
class NutWritten:
    dir: Path
    files: list[Path] = field(default_factory=list)
    passwords: dict[str, str] = field(default_factory=dict)
    new: list[str] = field(default_factory=list)
    rotated: list[str] = field(default_factory=list)


def ups_conf(s: NutServerSettings, sids: list[str]) -> str:
    out = ["# Written by `holdover nut-config`: each sentinel as a UPS, its file kept current by the bridge."]
    for sid in sids:
        out += [
            "",
            f"[{s.prefix}{sid}]",
            "  driver = dummy-ups",
            f"  port = {dev_path(s, sid)}",
            "  pollinterval = 1",  # the file is read each second (NUT's default: 2)
            f'  desc = "holdover sentinel {sid}"',
        ]
    return "\n".join(out) + "\n"


def upsd_conf(s: NutServerSettings) -> str:
    return f"# Written by `holdover nut-config`.\nLISTEN {s.listen} {s.port}\n"


def upsd_users(passwords: dict[str, str]) -> str:
    out = ["# Written by `holdover nut-config`: a upsmon secondary per machine that follows the sentinels."]
    for user, password in passwords.items():
        out += ["", f"[{user}]", f"  password = {password}", "  upsmon secondary"]
    return "\n".join(out) + "\n"


def monitor_line(s: NutServerSettings, sid: str, client: str, password: str, host: str) -> str:
    """The client's upsmon.conf line: it follows this sentinel as a secondary (power value 1)."""
    return f"MONITOR {s.prefix}{sid}@{host}:{s.port} 1 {client} {password} secondary"


DEBIAN_CONF = Path("/etc/nut")  # where Debian's nut-server units read their config


def start_line(out: Path) -> str:
    """The command that runs NUT on what `write` put in `out`, as it stands on Debian 12."""
    if out.resolve() == DEBIAN_CONF:
        # The packaged units: nut-driver-enumerator makes a driver unit per ups.conf section.
        return "systemctl restart nut-server"
    # Elsewhere Debian's units cannot look (they read /etc/nut), nor can its /usr/sbin/upsd wrapper,
    # which reads /etc/nut/nut.conf and, at the packaged MODE=none, prints "upsd disabled" and
    # exits 0. upsdrvctl is the binary itself; upsd is /lib/nut's. Both take NUT_CONFPATH, drop
    # to `nut` and daemonize.
    return f"NUT_CONFPATH={out} upsdrvctl start && NUT_CONFPATH={out} /lib/nut/upsd"


def _for_nut(path: Path, text: str, gid: int) -> None:
    write_atomic(path, text, mode=0o640)
    os.chown(path, 0, gid)


def write(
    s: NutServerSettings, sids: list[str], out: Path, rotate: list[str] | None = None, group: str = "nut"
) -> NutWritten:
    if not sids:
        raise NutConfigError("no [[sentinels]] to serve")
    if not s.clients:
        raise NutConfigError('no [nut_server] clients: name the machines that follow, e.g. clients = ["nas", "gpu2"]')
    unknown = sorted(set(rotate or []) - set(s.clients))
    if unknown:
        raise NutConfigError(f"--rotate {', '.join(unknown)}: no such client (the clients: {', '.join(s.clients)})")
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        raise NutConfigError(
            f"no group {group!r} on this machine: NUT's daemons run as it (apt-get install nut-server), "
            "or name the one yours run as with --group"
        ) from None
    try:
        if not out.is_dir():
            out.mkdir(parents=True)
            os.chown(out, 0, gid)
            out.chmod(0o750)
        w = NutWritten(out)
        for client in s.clients:
            path = out / f"{client}.password"
            kept = kept_secret(path)
            if kept and client not in (rotate or []):
                w.passwords[client] = kept
                continue
            (w.rotated if kept else w.new).append(client)
            w.passwords[client] = secrets.token_urlsafe(18)
            write_private(path, w.passwords[client] + "\n")
        for name, text in (
            ("ups.conf", ups_conf(s, sids)),
            ("upsd.conf", upsd_conf(s)),
            ("upsd.users", upsd_users(w.passwords)),
            ("nut.conf", "# Written by `holdover nut-config`: upsd serves the network.\nMODE=netserver\n"),
        ):
            _for_nut(out / name, text, gid)
            w.files.append(out / name)
    except PermissionError as e:
        why = f"NUT's files are root:{group} 0640; run as root"
        raise NutConfigError(f"{e.filename or out}: {e.strerror}: {why}") from None
    except OSError as e:
        raise NutConfigError(f"{e.filename or out}: {e.strerror or e}") from None
    return w
