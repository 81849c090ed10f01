"""The demo's own control port, for a person playing with a held demo (`holdover lab ...`): the
mains, a flicker and the WiFi go on to the emulator's control port as they are; the uplink beyond
the LAN is the demo's (its probe targets), so the emulator alone could not drop it. One JSON line
in, one JSON line back, a connection each, as the emulator's port takes them."""

from __future__ import annotations

import json
import socket
import socketserver
import threading
from collections.abc import Callable, Sequence
from typing import Any

from holdover.board.emulator import Control, EmulatorError
from holdover.errors import HoldoverError
from holdover.lab.targets import TcpTarget

# What the emulator's port takes from a person here; the rest of its commands (a stall, a reset,
# the battery) are the tests' and the benches'.
FORWARDED = ("mains", "wlan", "dip_ms")


class LabError(HoldoverError):
    """The demo's control port could not be reached, or refused what was asked (said why)."""


class LabControls:
    """Serves the port on loopback until close(); `on_change` hears each change made (for the
    demo's timeline)."""

    def __init__(self, control: Control, targets: Sequence[TcpTarget], on_change: Callable[[str], None]) -> None:
        self._control = control
        self._targets = targets
        self._on_change = on_change
        self._lock = threading.Lock()  # the emulator's control client is one socket
        outer = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                line = self.rfile.readline(4096)
                self.wfile.write(json.dumps(outer.take(line)).encode() + b"\n")

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port: int = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, name="lab-controls", daemon=True).start()

    def take(self, line: bytes) -> dict[str, Any]:
        try:
            cmd = json.loads(line)
        except ValueError:
            return {"ok": False, "error": "not a JSON line"}
        if not isinstance(cmd, dict) or len(cmd) != 1:
            return {"ok": False, "error": 'one key a line: {"mains": false}, {"dip_ms": 100}, {"uplink": false}'}
        [(key, value)] = cmd.items()
        with self._lock:
            if key == "uplink":
                if not isinstance(value, bool):
                    return {"ok": False, "error": "uplink: expected true or false"}
                for t in self._targets:
                    if not value:
                        t.stop()
                    elif t.sock is None:  # up twice is up
                        t.start()
                said = "up (the probe targets answer again)" if value else "down (the probe targets stop answering)"
                self._on_change(f"by hand: uplink {said}")
                return {"ok": True, "uplink": value}
            if key not in FORWARDED:
                return {"ok": False, "error": f"{key}: not one of {', '.join((*FORWARDED, 'uplink'))}"}
            try:
                reply = self._control.send(**cmd)
            except (EmulatorError, OSError) as e:
                return {"ok": False, "error": str(e)}
        self._on_change(f"by hand: {_in_words(key, value)}")
        return reply

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _in_words(key: str, value: Any) -> str:
    if key == "dip_ms":
        return f"a {value} ms flicker"
    return f"{'mains' if key == 'mains' else 'wifi'} {'on' if value else 'off'}"


def ask(port: int, cmd: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    """One command to a held demo's control port; LabError naming what went wrong."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(json.dumps(cmd).encode() + b"\n")
            reply = s.makefile("rb").readline()
    except OSError as e:
        raise LabError(
            f"no held demo on 127.0.0.1:{port} ({e.strerror or e}): start one with holdover demo --hold"
        ) from e
    try:
        out = json.loads(reply)
    except ValueError:
        raise LabError(f"127.0.0.1:{port} is not a demo's control port (it answered {reply[:60]!r})") from None
    if not out.get("ok"):
        raise LabError(str(out.get("error")))
    return out
