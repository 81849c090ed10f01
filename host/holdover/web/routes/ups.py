"""GET /api/ups: the host's UPS, the rescue's clock, as the bridge last read it (every poll_s)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from holdover.bridge.service import Bridge
from holdover.web import snapshot
from holdover.web.routes.deps import bridge

router = APIRouter(prefix="/api/ups", tags=["ups"])


@router.get("")
async def ups_state(b: Bridge = Depends(bridge)) -> dict[str, Any]:
    return snapshot.watched_ups(b.settings, b.ups)
