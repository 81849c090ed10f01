"""Interfaces plugged and pulled, heard from netlink within a second, in namespaces of the test's
own; the failover told at once when an uplink's interface goes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pyroute2 import NetNS
from pyroute2 import netns as pr_netns

from holdover.lab.netlab import BACKUP, PRIMARY, TARGET, NetLab
from holdover.node.failover import Failover
from holdover.node.hotplug import Hotplug
from holdover.settings import FailoverSettings
from support import until

PORT = 8443


def test_a_nic_plugged_and_pulled_is_heard_within_a_second() -> None:
    name = f"hhot{os.getpid()}"
    pr_netns.create(name)
    got: list[tuple[str, str, float]] = []
    try:

        async def run() -> tuple[float, float]:
            hp = Hotplug(name, lambda k, d: got.append((k, d["dev"], time.monotonic())))
            hp.start()
            await asyncio.to_thread(hp.ready.wait, 5)
            # pyroute2's sync API refuses a thread with a running loop: its own thread, every call there.
            one = ThreadPoolExecutor(1)
            loop = asyncio.get_running_loop()
            ns = await loop.run_in_executor(one, NetNS, name)
            try:
                add = {"ifname": "usb9", "kind": "veth", "peer": {"ifname": "usb9p"}}
                await loop.run_in_executor(one, lambda: ns.link("add", **add))
                plugged = await until(lambda: ("link_added", "usb9") in [(k, d) for k, d, _ in got], 1.0, "plug")
                await loop.run_in_executor(one, lambda: ns.link("del", ifname="usb9"))
                pulled = await until(lambda: ("link_removed", "usb9") in [(k, d) for k, d, _ in got], 1.0, "pull")
            finally:
                await loop.run_in_executor(one, ns.close)
                one.shutdown()
                await hp.close()
            return plugged, pulled

        plugged, pulled = asyncio.run(run())
        assert plugged < 1.0 and pulled < 1.0
        assert {d for k, d, _ in got if k == "link_added"} == {"usb9", "usb9p"}
    finally:
        with contextlib.suppress(OSError):
            pr_netns.remove(name)


def test_the_failover_marks_an_uplink_down_the_moment_its_interface_goes() -> None:
    with NetLab() as lab:
        lab.serve(PORT)
        settings = FailoverSettings.model_validate(
            {
                "netns": lab.node_name,
                "targets": [f"{TARGET}:{PORT}"],
                "uplinks": [{"name": u["name"], "dev": u["dev"], "gateway": u["gateway"]} for u in (PRIMARY, BACKUP)],
            }
        )
        events: list[tuple[str, dict[str, Any]]] = []

        async def run() -> float:
            fo = Failover(settings, lab.node, lambda k, d: events.append((k, d)))
            hp = Hotplug(lab.node_name, lambda k, d: events.append((k, d)), on_link=fo.link)
            fo.start()
            hp.start()
            try:
                await asyncio.to_thread(hp.ready.wait, 5)
                await until(lambda: fo.health["usb"].up is True, 10, "the backup up")
                await fo.netlink(lambda: lab.node.link("del", ifname=BACKUP["dev"]))
                return await until(lambda: fo.health["usb"].up is False, 1.0, "the backup marked down")
            finally:
                await hp.close()
                await fo.close()

        took = asyncio.run(run())
        assert took < 1.0 and ("link_removed", {"dev": "usb0"}) in events
