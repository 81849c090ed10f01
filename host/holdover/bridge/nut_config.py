"""`holdover nut-config`: the NUT server config that serves each sentinel as a UPS.

ups.conf (a dummy-ups device per sentinel, reading the file bridge/nut_serve.py keeps current),
upsd.conf (where upsd listens) and upsd.users (a `upsmon secondary` user per client machine, a
password each, kept in CLIENT.password, 0600). A re-run keeps every password it finds, so adding a
client never breaks one already following; `rotate` replaces the named ones on purpose.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from pathlib import Path

from holdover.bridge.nut_serve import dev_path
from holdover.errors import HoldoverError
from holdover.files import kept_secret, write_private
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


def write(s: NutServerSettings, sids: list[str], out: Path, rotate: list[str] | None = None) -> NutWritten:
    if not sids:
        raise NutConfigError("no [[sentinels]] to serve")
    if not s.clients:
        raise NutConfigError('no [nut_server] clients: name the machines that follow, e.g. clients = ["nas", "gpu2"]')
    unknown = sorted(set(rotate or []) - set(s.clients))
    if unknown:
        raise NutConfigError(f"--rotate {', '.join(unknown)}: no such client (the clients: {', '.join(s.clients)})")
    try:
        out.mkdir(parents=True, exist_ok=True)
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
        for name, text, private in (
            ("ups.conf", ups_conf(s, sids), False),
            ("upsd.conf", upsd_conf(s), True),
            ("upsd.users", upsd_users(w.passwords), True),
            ("nut.conf", "MODE=netserver\n", False),
        ):
            path = out / name
            if private:
                write_private(path, text)
            else:
                path.write_text(text)
            w.files.append(path)
    except OSError as e:
        raise NutConfigError(f"{e.filename or out}: {e.strerror or e}") from None
    return w
