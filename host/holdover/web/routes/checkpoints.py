"""GET /api/checkpoints: emergency checkpoints the bridge verified, newest first."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query

from holdover.bridge.service import Bridge
from holdover.web import snapshot
from holdover.web.routes.deps import bridge

router = APIRouter(prefix="/api/checkpoints", tags=["checkpoints"])


@router.get("")
async def list_checkpoints(limit: int = Query(50, ge=1, le=1000), b: Bridge = Depends(bridge)) -> list[dict[str, Any]]:
    return snapshot.checkpoints(b.journal, limit)
