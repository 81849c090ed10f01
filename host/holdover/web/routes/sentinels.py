"""GET /api/sentinels: every sentinel's presence, power, battery, uplink and relay.

Every handler in web/routes is `async def`: it runs on the bridge's loop, the one thread that
uses the journal's connection. Blocking work goes to a thread explicitly.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query

from holdover.bridge.service import Bridge
from holdover.web import snapshot
from holdover.web.routes.deps import bridge

router = APIRouter(prefix="/api/sentinels", tags=["sentinels"])


def _all(b: Bridge) -> list[dict[str, Any]]:
    out = snapshot.sentinels(b.journal, [s.id for s in b.settings.sentinels])
    for s in out:
        view = b.sentinels.get(s["sid"])
        lost = b.gaps.lost.get(s["sid"], 0)  # events named by a later one and never heard
        s["counters"] = (
            {"events": view.events, "rejected": view.rejected, "duplicates": view.duplicates, "gaps": lost}
            if view
            else None
        )
    return out


@router.get("")
async def list_sentinels(b: Bridge = Depends(bridge)) -> list[dict[str, Any]]:
    return _all(b)


@router.get("/{sid}/history")
async def history(sid: str, hours: float = Query(6.0, gt=0, le=168), b: Bridge = Depends(bridge)) -> dict[str, Any]:
    """The sentinel's own battery (percent, volts) and its probes' best RTT (ms) and loss (percent)
    over the last hours, as columns: `t` (unix seconds, each a bucket's start) and one list per series."""
    return {"sid": sid, "hours": hours, **b.gate.history.series(sid, hours)}


@router.get("/{sid}")
async def one_sentinel(sid: str, b: Bridge = Depends(bridge)) -> dict[str, Any]:
    for s in _all(b):
        if s["sid"] == sid:
            return s
    raise HTTPException(404, f"no sentinel {sid!r}")
