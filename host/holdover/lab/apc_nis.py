"""A stand-in for apcupsd's network information server (NIS): the bytes apcupsd sends, with the
fields a test sets, for the apcupsd source of the host's UPS.

apcupsd itself needs a UPS on a cable (USB, serial, SNMP, a PowerChute card) that this machine
does not have, so the peer is faked at its wire: a request is a 2-byte big-endian length and a
command ("status"), the answer one record per field (2-byte length, `NAME     : value\\n`, as
apcupsd's output.c pads it) and a zero length at the end. Debian's own `apcaccess` reading it
(tests/node/test_ups.py) is what says the bytes are right.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

ONLINE = {
    "UPSNAME": "hostups",
    "MODEL": "Back-UPS XS 1400U",
    "STATUS": "ONLINE",
    "BCHARGE": "100.0 Percent",
    "TIMELEFT": "15.0 Minutes",
    "LOADPCT": "30.0 Percent",
}


def records(fields: dict[str, str]) -> bytes:
    out = b""
    for name, value in fields.items():
        line = f"{name:<9}: {value}\n".encode()
        out += struct.pack(">H", len(line)) + line
    return out + b"\x00\x00"


class NisPeer:
    """Serves `status` on 127.0.0.1 from a thread; `fields` is what it says; `raw`, when set,
    is sent instead (garbage, a half answer); `silent` answers nothing."""

    def __init__(self, fields: dict[str, str] | None = None) -> None:
        self.fields = dict(ONLINE if fields is None else fields)
        self.raw: bytes | None = None
        self.silent = False
        self._srv = socket.create_server(("127.0.0.1", 0))
        self.port = self._srv.getsockname()[1]
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True, name="nis-peer").start()

    def set(self, **fields: str) -> None:
        self.fields = {**self.fields, **fields}

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._srv.accept()
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError, struct.error), conn:
            while True:
                head = conn.recv(2, socket.MSG_WAITALL)
                if len(head) < 2:
                    return
                (n,) = struct.unpack(">H", head)
                command = conn.recv(n, socket.MSG_WAITALL).decode(errors="replace")
                if self.silent:
                    continue
                if self.raw is not None:
                    conn.sendall(self.raw)
                    return
                # apcupsd answers "events" too (its event log); nothing here has any.
                conn.sendall(records(self.fields) if command == "status" else b"\x00\x00")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._srv.shutdown(socket.SHUT_RDWR)  # wakes the accept (close alone leaves it listening)
        self._srv.close()
        for c in self._conns:
            with contextlib.suppress(OSError):
                c.close()

    def __enter__(self) -> NisPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
