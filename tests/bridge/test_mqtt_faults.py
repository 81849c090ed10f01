"""The firmware's MQTT client against a scripted broker: the faults found against independent brokers.

The broker here is a few lines of this test, speaking MQTT 3.1.1 over loopback and misbehaving on
purpose; the client is the firmware's own `mqtt.py`, in the MicroPython unix port.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable

from holdover.board.emulator import firmware_dir, micropython_binary
from support import MPY_DIR

CONNACK = b"\x20\x02\x00\x00"
PINGRESP = b"\xd0\x00"


def read_packet(conn: socket.socket) -> tuple[int, bytes]:
    head = conn.recv(1)
    if not head:
        raise EOFError
    n, shift = 0, 0
    while True:
        b = conn.recv(1)[0]
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
    body = b""
    while len(body) < n:
        chunk = conn.recv(n - len(body))
        if not chunk:
            raise EOFError
        body += chunk
    return head[0], body


def varlen(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def publish(topic: str, payload: bytes, pid: int | None = None) -> bytes:
    t = topic.encode()
    var = struct.pack("!H", len(t)) + t + (struct.pack("!H", pid) if pid is not None else b"")
    return bytes([0x32 if pid is not None else 0x30]) + varlen(len(var) + len(payload)) + var + payload


class ScriptedBroker:
    """Accepts connections on loopback and runs `script(conn, record)` on each, in a thread."""

    def __init__(self, script: Callable[[socket.socket, list], None]) -> None:
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.port = self.srv.getsockname()[1]
        self.script = script
        self.connects: list[float] = []
        self.seen: list = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.srv.accept()
            except OSError:
                return
            self.connects.append(time.monotonic())
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                kind, _ = read_packet(conn)
                assert kind == 0x10, kind
                self.script(conn, self.seen)
            except (EOFError, OSError):
                pass

    def close(self) -> None:
        self.srv.close()


def run_client(broker: ScriptedBroker, run_ms: int, every_ms: int = 0, sub: str = "") -> tuple[dict, str]:
    out = subprocess.run(
        [micropython_binary(), str(MPY_DIR / "mqtt_client.py"), "127.0.0.1", str(broker.port), str(run_ms),
         str(every_ms), sub],
        env={"MICROPYPATH": f"{firmware_dir()}:.frozen"},
        capture_output=True, text=True, timeout=run_ms / 1000 + 30,
    )  # fmt: skip
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    return json.loads(out.stdout.strip().splitlines()[-1]), text


def test_backoff_starts_again_after_a_connack() -> None:
    # Every session is accepted, then dropped 200 ms later: a radio that keeps cutting out.
    def script(conn: socket.socket, seen: list) -> None:
        conn.sendall(CONNACK)
        time.sleep(0.2)

    broker = ScriptedBroker(script)
    try:
        _result, log = run_client(broker, 6000)
    finally:
        broker.close()
    gaps = [b - a for a, b in zip(broker.connects, broker.connects[1:], strict=False)]
    # With backoff_min 200 ms a session that reached CONNACK is followed by a 200 ms wait, every
    # time; a backoff that only grew would wait 0.4, 0.8, 1.6, 3.2 s and reach 5 sessions at most.
    assert len(broker.connects) >= 10, (gaps, log)
    assert max(gaps) < 0.8, gaps
    # The reader's end (EOF on every drop) is retrieved, never a stray traceback.
    assert "Traceback" not in log and "never retrieved" not in log and "task died" not in log, log


def test_a_client_that_only_sends_pings_so_its_link_stays_up() -> None:
    # The broker answers PINGREQ and nothing else; the client publishes QoS 0 telemetry every
    # 300 ms, so it is never quiet itself, but it hears nothing unless it pings.
    def script(conn: socket.socket, seen: list) -> None:
        conn.sendall(CONNACK)
        while True:
            kind, _ = read_packet(conn)
            if kind == 0xC0:
                seen.append("ping")
                conn.sendall(PINGRESP)

    broker = ScriptedBroker(script)
    try:
        result, log = run_client(broker, 7000, every_ms=300)  # 3.5 keepalives of 2 s
    finally:
        broker.close()
    assert result["connects"] == 1, log
    assert broker.seen.count("ping") >= 3, (broker.seen, log)


def test_an_oversized_packet_is_discarded_and_acknowledged_not_fatal() -> None:
    def script(conn: socket.socket, seen: list) -> None:
        conn.sendall(CONNACK)
        kind, body = read_packet(conn)
        assert kind == 0x82
        conn.sendall(b"\x90\x03" + body[:2] + b"\x01")
        conn.sendall(publish("cmd/x", b"A" * 4096, pid=7))  # a 4 KB retained command, say
        conn.sendall(publish("cmd/x", b"small", pid=8))
        while True:
            kind, body = read_packet(conn)
            if kind == 0x40:
                seen.append(struct.unpack("!H", body)[0])
            elif kind == 0xC0:
                conn.sendall(PINGRESP)

    broker = ScriptedBroker(script)
    try:
        result, log = run_client(broker, 2500, sub="cmd/#")
    finally:
        broker.close()
    assert result["connects"] == 1, log
    assert result["oversized"] == 1
    assert result["got"] == [["cmd/x", 5]]
    assert sorted(broker.seen) == [7, 8], "both acknowledged, so the broker does not send them again"


def test_a_refused_subscription_is_logged_and_reported() -> None:
    def script(conn: socket.socket, seen: list) -> None:
        conn.sendall(CONNACK)
        kind, body = read_packet(conn)
        conn.sendall(b"\x90\x03" + body[:2] + b"\x80")  # failure: an ACL says no
        while True:
            kind, _ = read_packet(conn)
            if kind == 0xC0:
                conn.sendall(PINGRESP)

    broker = ScriptedBroker(script)
    try:
        result, log = run_client(broker, 1500, sub="holdover/rack1/cmd")
    finally:
        broker.close()
    assert result["sub_failed"] == ["holdover/rack1/cmd"]
    assert "broker refused subscription holdover/rack1/cmd" in log
