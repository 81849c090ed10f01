"""GET /api/outages: every outage and what holdover did in it; GET /api/outages/now: the banner."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Depends, Query

from holdover.bridge.service import Bridge
from holdover.web import outages, snapshot
from holdover.web.routes.deps import bridge

router = APIRouter(prefix="/api/outages", tags=["outages"])


@router.get("")
async def list_outages(
    limit: int = Query(50, ge=1, le=1000), days: float = Query(365.0, gt=0, le=3650), b: Bridge = Depends(bridge)
) -> list[dict[str, Any]]:
    """Newest first; an outage still going on is first of all, `open`, its length counted to now."""
    return outages.history(b.journal, limit, since=time.time() - days * 86400)


@router.get("/now")
async def banner(b: Bridge = Depends(bridge)) -> dict[str, Any]:
    """What is wrong and since when, the host's time left, what holdover is doing, what to do."""
    seen = snapshot.sentinels(b.journal, [s.id for s in b.settings.sentinels])
    return outages.banner(b.journal, snapshot.watched_ups(b.settings, b.ups), b.rescuer.view(), seen)
