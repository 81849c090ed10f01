"""The board's USB serial console, shown readably: `#` log lines and signed event lines.

`holdover console` and `holdover deploy` (while it watches the first boot) read the same port the
bridge's serial link reads. An event line is checked with the sentinel's key when one is given
(from the board config or the bridge's), so a line that would be refused says why here too.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import serial

from holdover.errors import USAGE, HoldoverError
from holdover.firmware import protocol


@dataclass(frozen=True)
class Shown:
    text: str
    kind: str  # "log", "event", "rejected", "other"


def board_keys(cfg: dict) -> dict[str, bytes]:
    """The key a board's own config.json holds, by its sentinel id: enough to check its lines."""
    return {str(cfg.get("sentinel_id", "")): str(cfg["key"]).encode()} if cfg.get("key") else {}


def readable(line: str, keys: dict[str, bytes] | None = None) -> Shown:
    line = line.rstrip("\r\n")
    if line.startswith(protocol.LOG):
        head, _, rest = line[1:].strip().partition(" ")
        if head.isdigit():
            return Shown(f"log   {int(head) / 1000:10.3f} s  {rest}", "log")
        return Shown(f"log   {line[1:].strip()}", "log")
    if not line.startswith("{"):
        return Shown(f"      {line}", "other")
    keys = keys or {}
    try:
        sid = protocol.peek_sid(line.encode())
        key = keys.get(sid or "")
        if key is not None:
            msg = protocol.open_envelope(line.encode(), protocol.Signer(key), sid)
            checked = "signature ok"
        else:
            _, raw = protocol.unframe(line.encode())
            msg = protocol.check_body(json.loads(raw))
            checked = "signature not checked: no key for it"
    except protocol.ProtocolError as e:
        return Shown(f"REJECTED {e}: {line[:120]}", "rejected")
    except ValueError as e:
        return Shown(f"REJECTED malformed: {e}: {line[:120]}", "rejected")
    data = " ".join(f"{k}={v}" for k, v in msg["data"].items())
    return Shown(f"event {msg['sid']} #{msg['seq']} {msg['kind']} {data} ({checked})", "event")


def open_port(url: str, wait: float = 5.0) -> serial.SerialBase:
    """Open the board's port; a native-USB board's port vanishes for a moment while it resets."""
    deadline = time.monotonic() + wait
    while True:
        try:
            return serial.serial_for_url(url, baudrate=115200, timeout=0.2)
        except (serial.SerialException, OSError) as e:
            if time.monotonic() >= deadline:
                raise ConsoleError(f"cannot open {url}: {e}") from None
            time.sleep(0.2)


class ConsoleError(HoldoverError, RuntimeError):
    exit_code = USAGE


def follow(
    url: str,
    show: Callable[[Shown], None],
    keys: dict[str, bytes] | None = None,
    seconds: float | None = None,
    until: Callable[[Shown], bool] | None = None,
    port: serial.SerialBase | None = None,
) -> Shown | None:
    """Show lines from the port for `seconds` (forever if None); returns the first line `until`
    accepts, or None when the time ran out."""
    port = port or open_port(url)
    end = time.monotonic() + seconds if seconds is not None else None
    buf = b""
    try:
        while end is None or time.monotonic() < end:
            buf += port.read(4096)
            while b"\n" in buf:
                raw, _, buf = buf.partition(b"\n")
                shown = readable(raw.decode(errors="replace"), keys)
                show(shown)
                if until and until(shown):
                    return shown
    finally:
        port.close()
    return None
