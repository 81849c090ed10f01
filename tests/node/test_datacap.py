"""The 4G uplink's data cap, counted from the kernel's counters of a real interface in the
namespace lab: an alert at a share, one at the cap, and then the backup barred (the route stays on
the primary even when the primary dies). Nothing here touches the namespace the test runs in."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

from holdover.journal import Journal
from holdover.lab.netlab import BACKUP, PRIMARY, TARGET, NetLab
from holdover.node import routes
from holdover.node.datacap import DataCap, DataUsage, month_of
from holdover.node.failover import Failover
from holdover.node.probe import in_netns
from holdover.settings import DongleSettings, FailoverSettings

PORT = 8443


def _send(lab: NetLab, dev: str, nbytes: int) -> None:
    """Datagrams out of `dev` from the node, as a training job's traffic would leave."""
    with in_netns(lab.node_name):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, dev.encode())
    for _ in range(nbytes // 1000):
        s.sendto(b"x" * 1000, (TARGET, 9))
    s.close()


def test_the_cap_alerts_at_its_share_and_at_the_cap_then_bars_the_backup(tmp_path: Path) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    with NetLab() as lab, Journal(tmp_path / "j.db") as j:
        lab.serve(PORT)
        fo_settings = FailoverSettings.model_validate(
            {
                "netns": lab.node_name,
                "targets": [f"{TARGET}:{PORT}"],
                "uplinks": [{"name": u["name"], "dev": u["dev"], "gateway": u["gateway"]} for u in (PRIMARY, BACKUP)],
                "dwell": 0.0,
                "failback_after": 1.0,
            }
        )
        cap = DongleSettings(enabled=True, url="http://127.0.0.1:9/", uplink="usb", data_cap_mb=1, cap_warn=0.5)

        async def run() -> dict[str, Any]:
            fo = Failover(fo_settings, lab.node, lambda k, d: events.append((k, d)))
            dc = DataCap(cap, fo, j, lambda k, d: events.append((k, d)))
            first = await dc.check()
            assert first["used"] == 0  # counting starts when the watch does
            await asyncio.to_thread(_send, lab, BACKUP["dev"], 600_000)
            half = await dc.check()
            assert 600_000 <= half["kernel_bytes"] < 700_000, half  # the datagrams and their headers
            await dc.check()  # the same share again: said once
            await asyncio.to_thread(_send, lab, BACKUP["dev"], 500_000)
            await dc.check()
            # At the cap, alert-only: the primary dies and traffic stays on it all the same.
            fo.start()
            await asyncio.to_thread(lab.silence, PRIMARY)
            await asyncio.sleep(3.0)
            st = await fo.netlink(fo.status)
            await fo.close()
            return st

        st = asyncio.run(run())
        kinds = [k for k, _ in events]
        assert kinds == ["data_cap", "data_cap"], events  # no failover to the barred backup
        assert events[0][1]["share"].startswith("6") and events[0][1]["action"] == ""
        assert events[1][1]["share"].startswith("1") and events[1][1]["action"].startswith("barred")
        assert st["active"] == "wan" and routes.ours(lab.node) == []
        assert DataUsage(j).alerted(month_of(time.time()), "usb0") == 1.0  # kept: a restart says nothing again
