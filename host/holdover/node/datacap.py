"""The 4G uplink's data cap: bytes through it this month, from the kernel's interface counters
(and the dongle's own count when it has one), an alert at a share of the cap and at the cap, and
at the cap, if configured, the backup barred so the route stays on the primary.

The month's total lives in the journal, so a bridge restart or a reboot (which resets the
kernel's counters) loses nothing already counted.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from holdover.events import Polling
from holdover.journal import Journal
from holdover.node.dongle import Dongle, DongleError
from holdover.node.failover import Failover
from holdover.settings import DongleSettings

log = logging.getLogger("holdover.datacap")

DATA_CAP = "data_cap"
MB = 1_000_000


def counters(ipr: Any, dev: str) -> int | None:
    """rx + tx bytes of `dev` from the kernel (IFLA_STATS64), or None if it is not there."""
    idx = ipr.link_lookup(ifname=dev)
    if not idx:
        return None
    stats = ipr.link("get", index=idx[0])[0].get_attr("IFLA_STATS64")
    return int(stats["rx_bytes"]) + int(stats["tx_bytes"])


def month_of(ts: float) -> str:
    return time.strftime("%Y-%m", time.localtime(ts))


class DataCap(Polling):
    """A Reaction: counts, alerts through host events, bars the backup at the cap."""

    def __init__(
        self,
        settings: DongleSettings,
        failover: Failover,
        journal: Journal,
        emit: Callable[[str, dict[str, Any]], object],
        dongle: Dongle | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.s = settings
        self.failover = failover
        self.journal = journal
        self.emit = emit
        self.dongle = dongle
        self.clock = clock
        self.uplink = next(u for u in failover.uplinks if u.name == settings.uplink)
        self.interval = settings.cap_interval

    async def look(self) -> None:
        await self.check()

    async def check(self) -> dict[str, Any]:
        """Count once, alert and bar as the share says; what was found."""
        now = self.clock()
        month = month_of(now)
        counter = await self.failover.netlink(counters, self.failover.ipr, self.uplink.dev)
        kernel = self.journal.usage_add(month, self.uplink.dev, counter) if counter is not None else None
        stick = None
        if self.dongle is not None:
            with contextlib.suppress(DongleError):
                stick = (await self.dongle.astatus()).month_bytes
        used = max(b for b in (kernel or 0, stick or 0))
        cap = self.s.data_cap_mb * MB
        share = used / cap if cap else 0.0
        level = 1.0 if share >= 1.0 else self.s.cap_warn if share >= self.s.cap_warn else 0.0
        said = self.journal.usage_alerted(month, self.uplink.dev)
        if level > said:
            self.journal.usage_set_alerted(month, self.uplink.dev, level)
            at_cap = level >= 1.0
            self.emit(
                DATA_CAP,
                {
                    "uplink": self.uplink.name,
                    "share": f"{min(share, 9.99):.0%}",
                    "used_mb": round(used / MB, 1),
                    "cap_mb": self.s.data_cap_mb,
                    "action": ("barred: traffic stays on the primary" if self.s.at_cap == "alert_only" else "stays")
                    if at_cap
                    else "",
                },
            )
        barred = cap > 0 and share >= 1.0 and self.s.at_cap == "alert_only"
        self.failover.bar(self.uplink.name, barred, "its data cap is used up" if barred else "")
        return {"month": month, "kernel_bytes": kernel, "dongle_bytes": stick, "used": used, "share": share}
