"""Interfaces plugged and pulled (a USB NIC, a 4G dongle), heard from netlink as they happen:
journaled as link_added / link_removed, and the failover told at once when one of its uplinks
goes or comes back, rather than after its probes have failed three rounds.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Callable
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink import NETLINK_ROUTE
from pyroute2.netlink.rtnl import RTMGRP_LINK
from pyroute2.netlink.rtnl.marshal import MarshalRtnl

from holdover import events
from holdover.journal import Event
from holdover.node.netlink import configured, in_netns

configured()  # before any namespace's socket: pyroute2's forked child must not take our signals

log = logging.getLogger("holdover.hotplug")

NEWLINK, DELLINK = 16, 17


class Hotplug:
    """A Reaction: a thread of its own reads link messages from a netlink socket in `netns` (this
    machine's when None) and hands each change to the loop."""

    def __init__(
        self,
        netns: str | None,
        emit: Callable[[str, dict[str, Any]], object],
        on_link: Callable[[str, bool], None] | None = None,
    ) -> None:
        self.netns = netns
        self.emit = emit
        self.on_link = on_link  # (dev, present): the failover's view
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.ready = threading.Event()  # the socket is listening: changes from now on are heard

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._watch, name="holdover-hotplug", daemon=True)
        self._thread.start()

    def on_event(self, event: Event) -> None:
        pass

    async def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5)

    def _watch(self) -> None:
        # A plain netlink socket read here, parsed by pyroute2's marshal: its sync IPRoute buffers
        # messages behind an event loop of its own, which a select() on its fd cannot see.
        with in_netns(self.netns):
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
            ipr = IPRoute()
        marshal = MarshalRtnl()
        try:
            sock.bind((0, RTMGRP_LINK))
            sock.settimeout(0.3)
            known = {link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
            ipr.close()
            self.ready.set()
            while not self._stop.is_set():
                try:
                    data = sock.recv(65536)
                except TimeoutError:
                    continue
                for msg in marshal.parse(data):
                    dev = msg.get_attr("IFLA_IFNAME")
                    kind = msg["header"]["type"]
                    if kind == NEWLINK and dev not in known:
                        known.add(dev)
                        self._tell(events.LINK_ADDED, dev, True)
                    elif kind == DELLINK and dev in known:
                        known.discard(dev)
                        self._tell(events.LINK_REMOVED, dev, False)
        except Exception:  # a netlink failure ends hotplug, never the bridge
            log.exception("hotplug watch stopped")
        finally:
            ipr.close()
            sock.close()

    def _tell(self, kind: str, dev: str, present: bool) -> None:
        (log.info if present else log.warning)("%s: %s", kind, dev)
        assert self._loop is not None

        def on_loop() -> None:  # the journal and the failover's state live on the loop's thread
            self.emit(kind, {"dev": dev})
            if self.on_link is not None:
                self.on_link(dev, present)

        self._loop.call_soon_threadsafe(on_loop)
