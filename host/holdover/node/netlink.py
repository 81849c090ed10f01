"""The one way holdover holds pyroute2: a handle on a routing table (this machine's, or a named
namespace's for tests), the one thread that uses it, and `in_netns`, the namespace a socket is
made in (a probe's, a peer check's, the hotplug watch's).

pyroute2 gives each thread that uses a namespace's handle a socket of its own, made by a forked
child (see disable_mp_signal below). One thread for every call, its socket made when the
thread first runs (before the bridge sets its signal handlers), forks once, rather than once per
worker thread at any time; and pyroute2's blocking calls stay off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def configured() -> Any:
    """pyroute2's netns, imported and set up at first use: 9 MB resident that a bridge with no
    uplinks and no namespace (a site's node bridges, bench/site_scale.py) never needs. Every module
    that holds pyroute2 calls it when imported (hotplug, failover, the lab's namespaces), before it
    can make a namespace's socket."""
    import pyroute2.config
    from pyroute2 import netns

    # pyroute2 makes a namespace's sockets in a forked child and then SIGTERMs it. By default the
    # child keeps the parent's handlers, and asyncio's handler writes the signal to a wakeup pipe
    # the child shares with the bridge: the bridge took the child's SIGTERM for its own and
    # stopped, a second after start, in CI. With this set, the child restores the default first.
    pyroute2.config.disable_mp_signal = True
    return netns


@contextlib.contextmanager
def in_netns(name: str | None) -> Iterator[None]:
    """Sockets made inside belong to namespace `name` (this thread switches only while inside)."""
    if name is None:
        yield
        return
    pr_netns = configured()
    pr_netns.pushns(name)
    try:
        yield
    finally:
        pr_netns.popns()


def open_handle(netns: str | None) -> Any:
    """An IPRoute on this machine's table, or a NetNS on the namespace `netns`."""
    configured()
    from pyroute2 import IPRoute, NetNS

    return NetNS(netns) if netns else IPRoute()


class NetlinkThread:
    def __init__(self, ipr: Any | None = None, netns: str | None = None) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="holdover-netlink")
        self._owned = ipr is None
        self.ipr = ipr if ipr is not None else self.run(open_handle, netns)

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) on the netlink thread, waited for (for callers without a loop)."""
        return self._pool.submit(fn, *args).result()

    async def arun(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) on the netlink thread, awaited (the loop goes on meanwhile)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        if self._owned:
            self.run(self.ipr.close)
        self._pool.shutdown()

    def __enter__(self) -> NetlinkThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
