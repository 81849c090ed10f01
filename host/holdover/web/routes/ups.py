"""GET /api/ups: the host's UPS, the rescue's clock, as the bridge last read it (every poll_s), and
the rescue plan against it: what a cut now would save (node/plan.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query

from holdover.bridge.service import Bridge
from holdover.web import snapshot
from holdover.web.routes.deps import bridge

router = APIRouter(prefix="/api/ups", tags=["ups"])


@router.get("")
async def ups_state(b: Bridge = Depends(bridge)) -> dict[str, Any]:
    return {**snapshot.watched_ups(b.settings, b.ups), "plan": snapshot.watched_plan(b.settings, b.ups)}


@router.get("/history")
async def ups_history(hours: float = Query(6.0, gt=0, le=168), b: Bridge = Depends(bridge)) -> dict[str, Any]:
    """The UPS's runtime left (s, the least in each bucket), charge (percent) and whether it was on
    battery (1 or 0) over the last hours, as columns like a sentinel's history; empty without a UPS read."""
    name = b.settings.ups.name if b.ups is not None else None
    return {"ups": name, "hours": hours, **b.ups_history.series(name or "", hours)}
