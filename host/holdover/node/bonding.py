"""The node's Linux bonds: a slave going down is an alert even though traffic still flows,
because the redundancy the bond was built for is gone.

Read from /proc/net/bonding under a root that tests point at fixture files (the way prometheus'
process collector takes `proc=`); polled, since the bonding driver sends no netlink event a
reader without privileges can rely on for every MII change.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from holdover import events
from holdover.events import Polling
from holdover.settings import BondingSettings

log = logging.getLogger("holdover.bonding")


def read(proc: Path) -> dict[str, dict[str, str]]:
    """{bond: {slave: its MII status}} from PROC/net/bonding/*; an unreadable bond is left out."""
    out: dict[str, dict[str, str]] = {}
    for f in sorted((proc / "net" / "bonding").glob("*")):
        try:
            text = f.read_text()
        except OSError:
            continue
        slaves: dict[str, str] = {}
        slave = None
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Slave Interface":
                slave = value.strip()
            elif key.strip() == "MII Status" and slave is not None:
                slaves[slave] = value.strip()
                slave = None
        out[f.name] = slaves
    return out


class BondWatch(Polling):
    """A Reaction that raises bond_slave_down / bond_slave_up host events on each change."""

    def __init__(self, settings: BondingSettings, emit: Callable[[str, dict[str, Any]], object]) -> None:
        self.s = settings
        self.interval = settings.interval
        self.emit = emit
        self.known: dict[tuple[str, str], str] = {}

    async def look(self) -> None:
        self.check()

    def check(self) -> None:
        """One look at the bonds; an event for every slave whose state changed (or that is down
        when first seen: a bond degraded before the bridge started is still news)."""
        for bond, slaves in read(self.s.proc).items():
            for slave, status in slaves.items():
                before = self.known.get((bond, slave))
                self.known[(bond, slave)] = status
                up = status == "up"
                was_up = None if before is None else before == "up"
                if was_up == up or (was_up is None and up):
                    continue
                left = [s for s, st in slaves.items() if st == "up"]
                kind = events.BOND_SLAVE_UP if up else events.BOND_SLAVE_DOWN
                (log.info if up else log.warning)("%s: bond %s slave %s is %s", kind, bond, slave, status)
                self.emit(kind, {"bond": bond, "slave": slave, "mii": status, "up": ", ".join(left) or "no slave"})
