"""Probes out of one uplink: a TCP connect bound to its interface, so each uplink's health is
known separately (the backup's before it is needed), whichever one the default route uses."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import time
from collections.abc import Iterator

from pyroute2 import netns as pr_netns


@contextlib.contextmanager
def in_netns(name: str | None) -> Iterator[None]:
    """Sockets made inside belong to namespace `name` (this thread switches only while inside)."""
    if name is None:
        yield
        return
    pr_netns.pushns(name)
    try:
        yield
    finally:
        pr_netns.popns()


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
