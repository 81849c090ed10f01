"""Probes out of one uplink: a TCP connect or an ICMP echo bound to its interface, so each
uplink's health is known separately (the backup's before it is needed), whichever one the default
route uses.

The echo is written here (a header and a checksum) rather than taken from icmplib, which binds
to a source address but not to an interface: SO_BINDTODEVICE is what keeps a probe on its uplink
whatever the routing table says.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import struct
import time

from holdover.node.netlink import in_netns


async def tcp(dev: str, host: str, port: int, timeout: float, netns: str | None = None) -> float | None:
    """Round-trip time in ms of a TCP connect out of `dev`, or None: refused, unreachable or timed out."""
    with in_netns(netns):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, dev.encode())
        s.setblocking(False)
        t0 = time.monotonic()
        await asyncio.wait_for(asyncio.get_running_loop().sock_connect(s, (host, port)), timeout)
        return (time.monotonic() - t0) * 1000
    except (TimeoutError, OSError) as e:
        if isinstance(e, OSError) and e.errno == errno.EPERM:
            raise  # SO_BINDTODEVICE needs CAP_NET_RAW: a setup problem, not a dead uplink
        return None
    finally:
        s.close()


ECHO_REQUEST, ECHO_REPLY = 8, 0


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def echo_request(ident: int, seq: int, payload: bytes) -> bytes:
    head = struct.pack("!BBHHH", ECHO_REQUEST, 0, 0, ident, seq)
    return struct.pack("!BBHHH", ECHO_REQUEST, 0, _checksum(head + payload), ident, seq) + payload


def _icmp_socket() -> tuple[socket.socket, bool]:
    """An unprivileged ICMP socket where net.ipv4.ping_group_range allows it (the kernel then picks
    the id and hands this socket only its own replies), else a raw one (CAP_NET_RAW, which
    SO_BINDTODEVICE needs anyway). Returns (socket, raw)."""
    try:
        return socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP), False
    except PermissionError:
        return socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP), True


async def icmp(dev: str, host: str, timeout: float, netns: str | None = None) -> float | None:
    """Round-trip time in ms of an ICMP echo out of `dev`, or None: no reply within `timeout`."""
    with in_netns(netns):
        s, raw = _icmp_socket()
    loop = asyncio.get_running_loop()
    ident, seq = int.from_bytes(os.urandom(2), "big"), int.from_bytes(os.urandom(2), "big")
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, dev.encode())
        s.setblocking(False)
        t0 = time.monotonic()
        await loop.sock_sendto(s, echo_request(ident, seq, b"holdover"), (host, 0))

        async def reply() -> None:
            while True:
                data = await loop.sock_recv(s, 2048)
                if raw:  # every ICMP packet on the device comes here, with its IP header
                    data = data[(data[0] & 0x0F) * 4 :]
                if len(data) < 8:
                    continue
                kind, _code, _sum, rid, rseq = struct.unpack("!BBHHH", data[:8])
                # An unprivileged socket's id is the kernel's, and the socket sees only its own.
                if kind == ECHO_REPLY and rseq == seq and (rid == ident or not raw):
                    return

        await asyncio.wait_for(reply(), timeout)
        return (time.monotonic() - t0) * 1000
    except (TimeoutError, OSError) as e:
        if isinstance(e, OSError) and e.errno == errno.EPERM:
            raise  # SO_BINDTODEVICE and raw sockets need CAP_NET_RAW: a setup problem
        return None
    finally:
        s.close()
