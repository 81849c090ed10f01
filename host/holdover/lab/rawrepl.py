"""A board on a pseudo-terminal: MicroPython's REPL protocol, the code run by the real MicroPython.

What `holdover deploy` and mpremote talk to when no ESP32 is plugged in. The pty speaks the
protocol of MicroPython's `shared/runtime/pyexec.c` as mpremote uses it: Ctrl-C, Ctrl-A into the
raw REPL, Ctrl-D for a soft reset (or to run what was sent: "OK", output, 0x04, error, 0x04, ">"),
raw-paste mode with its flow-control window, Ctrl-B back to the friendly REPL. The code itself is
run by the MicroPython unix port (one interpreter per soft reset, the board's files in its working
directory), so what mpremote sends for listdir, write, hash and remove meets MicroPython's own
os, hashlib and file objects. `machine.reset()` boots the board: the emulated sentinel starts from
the files the REPL wrote (their .mpy and config.json) and its console is this pty, until Ctrl-C.

The unix port has no raw REPL of its own (its REPL is readline's), hence this peer.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import struct
import subprocess
import threading
import time
import tty
from collections.abc import Callable
from pathlib import Path

from holdover import proc
from holdover.board.emulator import micropython_binary

BANNER = b"raw REPL; CTRL-B to exit\r\n"
FRIENDLY = b"\r\nMicroPython on the holdover raw-REPL peer\r\n>>> "  # the friendly REPL's prompt
WINDOW = 128  # raw-paste window, as a small board announces it
RESET_EXIT = 42

# Runs inside MicroPython: reads length-prefixed code from stdin, runs it, ends stdout and the error
# text with 0x04 each, as the raw REPL does. machine.reset() ends the interpreter with RESET_EXIT.
DRIVER = """
import sys
class _Machine:
    def reset(self):
        sys.exit(RESET_EXIT)
    soft_reset = reset
sys.modules["machine"] = _Machine()
g = {"__name__": "__main__"}
inp = sys.stdin.buffer
out = sys.stdout
while True:
    n = inp.readline()
    if not n:
        break
    n = int(n)
    code = b""
    while len(code) < n:
        code += inp.read(n - len(code))
    try:
        exec(code, g)
        out.write("\\x04")
    except SystemExit:
        raise
    except BaseException as e:
        out.write("\\x04")
        sys.print_exception(e, out)
    out.write("\\x04")
""".replace("RESET_EXIT", str(RESET_EXIT))


class RawReplBoard:
    def __init__(self, root: Path, boot: Callable[[RawReplBoard], None] | None = None) -> None:
        self.root = Path(root)  # the board's filesystem
        self.root.mkdir(parents=True, exist_ok=True)
        self.boot = boot  # called on machine.reset(): start the firmware, feeding console() and stop()
        self.master, self.slave = os.openpty()
        tty.setraw(self.slave)
        os.set_blocking(self.master, False)
        self.device = os.ttyname(self.slave)
        self.mode = "friendly"
        self.code = bytearray()
        self.paste_count = 0
        self.driver: subprocess.Popen[bytes] | None = None
        self.running: Callable[[], None] | None = None  # stops the booted firmware
        self.to_firmware: Callable[[bytes], None] | None = None
        self.execs = 0
        self.resets = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._script = self.root.parent / f".{self.root.name}-repl.py"
        self._script.write_text(DRIVER)
        self._thread = threading.Thread(target=self._run, name="rawrepl", daemon=True)

    def start(self) -> RawReplBoard:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._halt_firmware()
        self._end_driver()
        for fd in (self.master, self.slave):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._script.unlink(missing_ok=True)

    # --- what the booted firmware uses -------------------------------------------------------

    def console(self, data: bytes) -> None:
        """Bytes the firmware writes to its USB serial port; with nobody reading the port and its
        buffer full they are lost, as a UART's are (a blocked writer would stall the firmware)."""
        with self._lock, contextlib.suppress(OSError):  # BlockingIOError included: the buffer is full
            os.write(self.master, data)

    # --- the protocol -----------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        # The REPL's answers: the host is reading them, so waiting for room is bounded.
        deadline = time.monotonic() + 5
        with self._lock:
            view = memoryview(data)
            while view and time.monotonic() < deadline:
                try:
                    view = view[os.write(self.master, view) :]
                except BlockingIOError:
                    time.sleep(0.001)

    def _run(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if not ready:
                continue
            try:
                data = os.read(self.master, 4096)
            except OSError:
                return
            for b in data:
                self._byte(b)

    def _byte(self, b: int) -> None:
        if self.running is not None:
            if b == 0x03:  # Ctrl-C stops the program, as on the board
                self._halt_firmware()
                self._write(b"\r\nKeyboardInterrupt: " + FRIENDLY)
                self.mode = "friendly"
            elif self.to_firmware:
                self.to_firmware(bytes([b]))
            return
        if self.mode == "paste":
            if b == 0x04:
                self._write(b"\x04")
                self.mode = "raw"
                self._exec(bytes(self.code), ok=b"")
                return
            self.code.append(b)
            self.paste_count += 1
            if self.paste_count >= WINDOW:
                self.paste_count -= WINDOW
                self._write(b"\x01")
            return
        if self.mode == "raw" and b == 0x01 and self.code == b"\x05A":  # raw-paste request
            self.code.clear()
            self.mode = "paste"
            self.paste_count = 0
            self._write(b"R\x01" + struct.pack("<H", WINDOW))
        elif b == 0x01:  # Ctrl-A: raw REPL
            self.mode = "raw"
            self.code.clear()
            self._write(b"\r\n" + BANNER + b">")
        elif b == 0x02:  # Ctrl-B: friendly REPL
            self.mode = "friendly"
            self._write(FRIENDLY)
        elif b == 0x03:
            self.code.clear()
            if self.mode == "friendly":
                self._write(b"\r\n>>> ")
        elif self.mode != "raw":
            return  # the friendly REPL's typing is not needed by anything here
        elif b == 0x04:
            if self.code:
                self._exec(bytes(self.code), ok=b"OK")
            else:
                self._soft_reset()
        else:
            self.code.append(b)

    def _soft_reset(self) -> None:
        self._end_driver()
        self.resets += 1
        self._write(b"OK\r\nMPY: soft reboot\r\n" + BANNER + b">")

    def _spawn(self) -> subprocess.Popen[bytes]:
        if self.driver is None or self.driver.poll() is not None:
            self.driver = proc.spawn(
                [micropython_binary(), str(self._script)],
                cwd=self.root,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        return self.driver

    def _end_driver(self) -> None:
        if self.driver is not None and self.driver.poll() is None:
            proc.stop(self.driver, grace=1)
        self.driver = None

    def _exec(self, code: bytes, ok: bytes) -> None:
        self.code.clear()
        self.execs += 1
        d = self._spawn()
        assert d.stdin is not None and d.stdout is not None
        self._write(ok)
        d.stdin.write(b"%d\n" % len(code) + code)
        d.stdin.flush()
        ends = 0
        while ends < 2:
            chunk = d.stdout.read1(4096)
            if not chunk:  # the interpreter ended: machine.reset(), or it died
                rc = d.wait()
                self.driver = None
                if rc == RESET_EXIT:
                    self._hard_reset()
                else:
                    self._write(b"\x04" * (2 - ends) + b">")
                return
            ends += chunk.count(b"\x04")
            self._write(chunk)
        self._write(b">")

    def _hard_reset(self) -> None:
        self.mode = "friendly"
        self.resets += 1
        if self.boot is None:
            self._write(FRIENDLY)
            return
        self.boot(self)

    def _halt_firmware(self) -> None:
        stop, self.running, self.to_firmware = self.running, None, None
        if stop:
            stop()


def boot_emulated_sentinel(board: RawReplBoard, heap: str | None = None) -> None:
    """machine.reset() on the peer: the emulated board runs the files now on the board, with its
    config.json, and its USB serial port is the pty."""
    from holdover.board.emulator import DEFAULT_HEAP, Emulator
    from holdover.lab.rig import free_port

    serial_addr = ("127.0.0.1", free_port())
    emu = Emulator(
        board.root / "config.json",
        ("127.0.0.1", free_port()),
        heap=heap or DEFAULT_HEAP,
        state_dir=board.root.parent / f".{board.root.name}-state",
        on_line=lambda line: None,
        serial=serial_addr,
        firmware=board.root,
    )
    emu.start_thread()
    stop = threading.Event()
    sock: list[socket.socket] = []

    def pump() -> None:
        deadline = time.monotonic() + 30
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                s = socket.create_connection(serial_addr, timeout=0.5)
                break
            except OSError:
                time.sleep(0.05)
        else:
            return
        sock.append(s)
        s.settimeout(0.2)
        while not stop.is_set():
            try:
                data = s.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            board.console(data.replace(b"\n", b"\r\n"))

    t = threading.Thread(target=pump, name="rawrepl-console", daemon=True)
    t.start()

    def halt() -> None:
        stop.set()
        for s in sock:
            s.close()
        emu.stop()
        t.join(timeout=5)

    board.running = halt
    board.to_firmware = lambda data: sock[0].sendall(data) if sock else None
