"""The failover switch: a default route of our own, ahead of the system's, through the backup.

The system keeps its default routes (the primary's metric lowest); failing over adds one more
default route via the backup with a metric below all of them, so new connections leave through
the backup at once, and failing back deletes it. Nothing else in the table is touched. Our
route carries its own protocol number, so a start after a crash finds what a killed process
left and removes it (`repair`), and `holdover failover status` can tell ours from the system's.

The namespace is a parameter: a pyroute2 `NetNS` in tests, `IPRoute()` (this machine's own)
when run for real. This module never opens a namespace it was not handed.
"""

from __future__ import annotations

from dataclasses import dataclass
from socket import AF_INET
from typing import Any

RTPROT_HOLDOVER = 199  # /etc/iproute2/rt_protos: unassigned; `ip route` shows it as "proto 199"
FAILOVER_METRIC = 10  # below any metric a distribution gives its default routes
MAIN_TABLE = 254


@dataclass(frozen=True)
class Uplink:
    name: str
    dev: str
    gateway: str


def _defaults(ipr: Any) -> list[Any]:
    return [r for r in list(ipr.route("dump", table=MAIN_TABLE)) if r["dst_len"] == 0 and r["family"] == AF_INET]


def ours(ipr: Any) -> list[dict[str, Any]]:
    """Our default routes in the table: (gateway, dev index, metric) of each."""
    return [
        {"gateway": r.get_attr("RTA_GATEWAY"), "oif": r.get_attr("RTA_OIF"), "metric": r.get_attr("RTA_PRIORITY")}
        for r in _defaults(ipr)
        if r["proto"] == RTPROT_HOLDOVER
    ]


def repair(ipr: Any) -> int:
    """Remove every route of ours (what a killed process left); returns how many."""
    n = 0
    # The dump read to its end before the table changes under it.
    for r in list(ipr.route("dump", table=MAIN_TABLE)):
        if r["proto"] == RTPROT_HOLDOVER:
            metric = r.get_attr("RTA_PRIORITY")
            ipr.route("del", family=AF_INET, table=MAIN_TABLE, dst="0.0.0.0/0", proto=RTPROT_HOLDOVER, priority=metric)
            n += 1
    return n


def active(ipr: Any, uplinks: list[Uplink]) -> str | None:
    """The uplink carrying new connections: ours if we have a route, else the lowest-metric default."""
    index = {ipr.link_lookup(ifname=u.dev)[0]: u.name for u in uplinks if ipr.link_lookup(ifname=u.dev)}
    best = sorted(_defaults(ipr), key=lambda r: r.get_attr("RTA_PRIORITY") or 0)
    for r in best:
        name = index.get(r.get_attr("RTA_OIF"))
        if name is not None:
            return name
    return None


def switch_to(ipr: Any, uplink: Uplink) -> None:
    """New connections leave through `uplink` (replacing any route of ours through another)."""
    oif = ipr.link_lookup(ifname=uplink.dev)
    if not oif:
        raise OSError(f"{uplink.name}: no interface {uplink.dev}")
    ipr.route(
        "replace",
        family=AF_INET,
        table=MAIN_TABLE,
        dst="0.0.0.0/0",
        gateway=uplink.gateway,
        oif=oif[0],
        priority=FAILOVER_METRIC,
        proto=RTPROT_HOLDOVER,
    )


def switch_back(ipr: Any) -> None:
    """Drop our route: the system's own defaults (the primary first) carry traffic again."""
    repair(ipr)
