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
from typing import TYPE_CHECKING, Any

from holdover import events
from holdover.events import Polling
from holdover.journal import Journal, Ledger
from holdover.node.dongle import Dongle, DongleError
from holdover.settings import DongleSettings

if TYPE_CHECKING:
    from holdover.node.failover import Failover

log = logging.getLogger("holdover.datacap")

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


class DataUsage(Ledger):
    """The month's bytes through each device, kept in the journal, and the share last alerted."""

    DDL = """
    CREATE TABLE IF NOT EXISTS data_usage (
        month TEXT,
        dev TEXT,
        bytes INTEGER NOT NULL DEFAULT 0,
        counter INTEGER,
        alerted REAL NOT NULL DEFAULT 0,
        PRIMARY KEY (month, dev)
    );
    """

    def add(self, month: str, dev: str, counter: int) -> int:
        """The month's bytes through `dev` after the kernel's counter read `counter` now. A counter
        below the last one was reset (a reboot, the device re-plugged): all of it is new."""
        row = self.db.execute("SELECT bytes, counter FROM data_usage WHERE month=? AND dev=?", (month, dev)).fetchone()
        if row is None:
            # The first look of the month: earlier bytes belong to last month (or to before the watch).
            last = self.db.execute(
                "SELECT counter FROM data_usage WHERE dev=? ORDER BY month DESC LIMIT 1", (dev,)
            ).fetchone()
            base = 0 if last is None or last[0] is None or counter < last[0] else counter - last[0]
            q = "INSERT INTO data_usage (month, dev, bytes, counter) VALUES (?,?,?,?)"
            self.db.execute(q, (month, dev, base, counter))
            return base
        total, before = row
        total += counter - before if before is not None and counter >= before else counter
        q = "UPDATE data_usage SET bytes=?, counter=? WHERE month=? AND dev=?"
        self.db.execute(q, (total, counter, month, dev))
        return total

    def alerted(self, month: str, dev: str) -> float:
        if not self.present:
            return 0.0
        row = self.db.execute("SELECT alerted FROM data_usage WHERE month=? AND dev=?", (month, dev)).fetchone()
        return row[0] if row else 0.0

    def set_alerted(self, month: str, dev: str, level: float) -> None:
        self.db.execute("UPDATE data_usage SET alerted=? WHERE month=? AND dev=?", (level, month, dev))


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
        self.usage = DataUsage(journal)
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
        kernel = self.usage.add(month, self.uplink.dev, counter) if counter is not None else None
        stick = None
        if self.dongle is not None:
            with contextlib.suppress(DongleError):
                stick = (await self.dongle.astatus()).month_bytes
        used = max(b for b in (kernel or 0, stick or 0))
        cap = self.s.data_cap_mb * MB
        share = used / cap if cap else 0.0
        level = 1.0 if share >= 1.0 else self.s.cap_warn if share >= self.s.cap_warn else 0.0
        said = self.usage.alerted(month, self.uplink.dev)
        if level > said:
            self.usage.set_alerted(month, self.uplink.dev, level)
            at_cap = level >= 1.0
            self.emit(
                events.DATA_CAP,
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
