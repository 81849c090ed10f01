"""GET /api/runs: every protected training run, alive or not, and its newest verified checkpoint."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends

from holdover.bridge.service import Bridge
from holdover.node import launch
from holdover.web.routes.deps import bridge

router = APIRouter(prefix="/api/runs", tags=["runs"])


@router.get("")
async def list_runs(b: Bridge = Depends(bridge)) -> list[dict[str, Any]]:
    # Verifying the newest checkpoint of each run reads its manifest: off the loop.
    return await asyncio.to_thread(launch.recover, b.settings.protect.registry)
