"""The client side of NUT's network protocol (upsd, port 3493): what `upsc` asks, and nothing more.

Written here rather than taken from PyPI's `pynutclient` (the NUT project's own binding) because
its reader loops on `recv()` until it sees the end of a line and never checks for a closed
connection: a upsd that goes away mid-answer leaves it spinning on a core, forever, in the thread
that was to tell us the UPS's runtime. The protocol (NUT's docs/net-protocol.txt) is a few lines:

    LIST VAR myups                     BEGIN LIST VAR myups
                                       VAR myups ups.status "OB DISCHRG"
                                       ...
                                       END LIST VAR myups
    (or)                               ERR UNKNOWN-UPS

Every read is bounded (a line, a list, the time), so a garbage answer is an error, never a hang.
"""

from __future__ import annotations

import contextlib
import re
import socket

from holdover.errors import FAILED, HoldoverError

MAX_LINE = 4096
MAX_VARS = 1000
_VAR = re.compile(r'^VAR (?P<ups>\S+) (?P<name>\S+) "(?P<value>(?:[^"\\]|\\.)*)"$')

# upsd's ERR words (docs/net-protocol.txt), in words a person can act on.
ERRORS = {
    "UNKNOWN-UPS": "has no UPS of that name (upsc -l HOST lists them)",
    "DATA-STALE": "has stale data for it: its driver lost the UPS (check the cable, the driver's log)",
    "DRIVER-NOT-CONNECTED": "has no driver running for it (start the driver: upsdrvctl start)",
    "ACCESS-DENIED": "refused: access denied (check [ups] username and password against upsd.users)",
    "USERNAME-REQUIRED": "wants a user first ([ups] username)",
    "PASSWORD-REQUIRED": "wants a password ([ups] password_file)",
    "INVALID-PASSWORD": "refused the password",
}


class NutError(HoldoverError):
    exit_code = FAILED


class NutClient:
    def __init__(self, host: str, port: int = 3493, timeout: float = 2.0) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self.where = f"upsd at {host}:{port}"
        self._sock: socket.socket | None = None
        self._rx = b""

    def connect(self, username: str = "", password: str = "") -> None:
        try:
            self._sock = socket.create_connection((self.host, self.port), self.timeout)
        except OSError as e:
            raise NutError(f"cannot reach {self.where}: {e.strerror or e}") from None
        if username:
            self._ask(f"USERNAME {username}", "")
        if password:
            self._ask(f"PASSWORD {password}", "")

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.sendall(b"LOGOUT\n")
            self._sock.close()
            self._sock, self._rx = None, b""

    def __enter__(self) -> NutClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def list_vars(self, ups: str) -> dict[str, str]:
        """Every variable of one UPS, as `upsc ups@host` prints them."""
        self._ask(f"LIST VAR {ups}", ups)
        out: dict[str, str] = {}
        while True:
            line = self._line()
            if line == f"END LIST VAR {ups}":
                return out
            m = _VAR.match(line)
            if m is None or m["ups"] != ups or len(out) >= MAX_VARS:
                raise NutError(f"{self.where} answered garbage to LIST VAR {ups}: {line[:80]!r}")
            out[m["name"]] = re.sub(r"\\(.)", r"\1", m["value"])

    def _ask(self, command: str, ups: str) -> None:
        if self._sock is None:
            raise NutError(f"{self.where}: not connected")
        try:
            self._sock.sendall(command.encode() + b"\n")
        except OSError as e:
            raise NutError(f"{self.where}: {e.strerror or e}") from None
        line = self._line()
        if line.startswith("ERR "):
            word = line[4:].split()[0] if line[4:].split() else "?"
            what = f"{self.where} " + ERRORS.get(word, f"said {line[4:]!r}")
            raise NutError(what.replace("of that name", repr(ups)) if ups else what)
        want = f"BEGIN LIST VAR {ups}" if command.startswith("LIST VAR") else "OK"
        if not line.startswith(want):
            raise NutError(f"{self.where} answered garbage to {command.split()[0]}: {line[:80]!r}")

    def _line(self) -> str:
        assert self._sock is not None
        while b"\n" not in self._rx:
            if len(self._rx) > MAX_LINE:
                raise NutError(f"{self.where} sent a line longer than {MAX_LINE} bytes: not NUT")
            try:
                chunk = self._sock.recv(4096)
            except TimeoutError:
                raise NutError(f"{self.where} did not answer within {self.timeout:g} s") from None
            except OSError as e:
                raise NutError(f"{self.where}: {e.strerror or e}") from None
            if not chunk:
                raise NutError(f"{self.where} closed the connection")
            self._rx += chunk
        line, self._rx = self._rx.split(b"\n", 1)
        return line.decode("utf-8", "replace").rstrip("\r")
