"""The sentinel's USB serial port, read with pyserial: the path that still works when the LAN is dead.

``serial_for_url`` opens a real port (``/dev/ttyUSB0``) and the emulator's TCP stand-in
(``socket://127.0.0.1:7301``) alike, so the same code is exercised in the tests as on a desk.
Lines starting with ``{`` are signed envelopes and go to the gate, which rejects a garbled
or forged one with its reason; everything else (the firmware's ``#`` logs, the ESP32 ROM's
boot chatter after a reset) is console output and only logged.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import serial

from holdover.bridge.mqtt_link import Inbound
from holdover.firmware import protocol

log = logging.getLogger("holdover.serial")

MAX_LINE = protocol.MAX_PAYLOAD + 64  # a longer line is noise; the gate would refuse it anyway
SOURCE = "serial"
NOISE_EVERY_S = 60.0


class SerialLink:
    def __init__(self, url: str, baud: int, queue: asyncio.Queue[Inbound], loop: asyncio.AbstractEventLoop) -> None:
        self.url = url
        self.baud = baud
        self.queue = queue
        self.loop = loop
        self.connected = threading.Event()
        self.lines = 0
        self.noise_lines = 0
        self._noise_said = -NOISE_EVERY_S
        self._noise_held = 0
        self._port: serial.SerialBase | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"holdover-serial {url}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            if self._port is not None:
                self._port.close()
        self._thread.join(5)

    def write(self, line: bytes) -> bool:
        """Send one line (a signed command) to the sentinel; False when the port is not open."""
        with self._lock:
            if self._port is None:
                return False
            try:
                self._port.write(line.rstrip(b"\n") + b"\n")
                self._port.flush()
            except (serial.SerialException, OSError) as e:
                log.warning("serial %s: write failed: %s", self.url, e)
                return False
        return True

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                port = serial.serial_for_url(self.url, baudrate=self.baud, timeout=0.2)
            except (serial.SerialException, OSError, ValueError) as e:
                log.warning("serial %s: cannot open (%s); retrying in %.1fs", self.url, e, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            with self._lock:
                self._port = port
            self.connected.set()
            log.info("serial %s: open", self.url)
            backoff = 0.5
            try:
                self._read(port)
            except Exception as e:  # pyserial raises AttributeError too when stop() closes the port under a read
                if not self._stop.is_set():
                    log.warning("serial %s: lost (%s); reopening", self.url, e)
            finally:
                self.connected.clear()
                with self._lock:
                    self._port = None
                port.close()
            self._stop.wait(backoff)

    def _read(self, port: serial.SerialBase) -> None:
        buf = b""
        noise = 0  # bytes of an overlong line dropped so far: skipped up to its newline
        while not self._stop.is_set():
            chunk = port.read(max(1, port.in_waiting))
            if not chunk:
                continue
            if noise:
                head, nl, chunk = chunk.partition(b"\n")
                noise += len(head)
                if not nl:
                    continue
                self._noise(noise)
                noise = 0
            buf += chunk
            while b"\n" in buf:
                line, _, buf = buf.partition(b"\n")
                self._line(line.rstrip(b"\r"))
            if len(buf) > MAX_LINE:
                noise, buf = len(buf), b""

    def _noise(self, n: int) -> None:
        # One line per overlong line (however long), and at most one a minute while they go on:
        # a babbling port must not flood the log the operator reads in an outage.
        self.noise_lines += 1
        now = time.monotonic()
        if now - self._noise_said < NOISE_EVERY_S:
            self._noise_held += 1
            return
        more = f" (and {self._noise_held} more since the last report)" if self._noise_held else ""
        log.warning("serial %s: a line of %d bytes dropped as noise%s", self.url, n, more)
        self._noise_said, self._noise_held = now, 0

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"{"):
            if line:
                log.debug("serial %s: %s", self.url, line.decode(errors="replace"))
            return
        self.lines += 1
        item = Inbound(None, line, False, time.time(), SOURCE, self.url)
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
