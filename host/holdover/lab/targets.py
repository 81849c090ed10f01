"""Uplink probe targets on loopback, started and stopped to cut the emulated sentinel's "uplink".

Tests and benchmarks use these, never a public address: a TCP listener (closed = a hard loss),
and a UDP responder (a DNS resolver by default) that can go silent or drop a share of requests.
"""

from __future__ import annotations

import random
import socket
import threading
from collections.abc import Callable

from holdover.lab.broker import free_port


class TcpTarget:
    """A listening socket: open = a reachable target, closed = connection refused (a hard loss)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.sock: socket.socket | None = None
        self.start()

    def start(self) -> None:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(64)
        self.sock = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def _accept(self, s: socket.socket) -> None:
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                return
            c.close()

    def stop(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


class UdpServer:
    """A UDP responder on loopback; answer(request) gives the reply or None to stay silent.

    `drop` is the share of requests left unanswered at random (probe loss); `alive` False
    silences it altogether (a hard loss).
    """

    def __init__(self, answer: Callable[[bytes], bytes | None], drop: float = 0.0, seed: int | None = None) -> None:
        self.answer = answer
        self.drop = drop
        self.dropped = 0
        self._rng = random.Random(seed)
        self.port = free_port()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", self.port))
        self.sock.settimeout(0.2)
        self.alive = True
        self.requests = 0
        self._run = True
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while self._run:
            try:
                data, addr = self.sock.recvfrom(2048)
            except TimeoutError:
                continue
            except OSError:
                return
            self.requests += 1
            if self.drop and self._rng.random() < self.drop:
                self.dropped += 1
                continue
            reply = self.answer(data) if self.alive else None
            if reply is not None:
                self.sock.sendto(reply, addr)

    def close(self) -> None:
        self._run = False
        self.sock.close()


def dns_answer(q: bytes) -> bytes | None:
    # Same id, QR set, RCODE 0 (NOERROR), the question echoed back: what a resolver sends.
    if len(q) < 12:
        return None
    return q[:2] + b"\x81\x80" + q[4:6] + b"\x00\x00\x00\x00\x00\x00" + q[12:]
