"""GET /api/failover: which uplink carries the node's traffic and each uplink's health."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from holdover.bridge.service import Bridge
from holdover.web import snapshot
from holdover.web.routes.deps import bridge

router = APIRouter(prefix="/api/failover", tags=["failover"])


@router.get("")
async def failover_state(b: Bridge = Depends(bridge)) -> dict[str, Any]:
    fo = b.failover
    if fo is None:
        return {"configured": False, **snapshot.uplinks(b.journal)}
    live = await fo.netlink(fo.status)
    return {"configured": True, "switches": fo.switches, **live}
