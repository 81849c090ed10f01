"""GET /api/slurm: each circuit's nodes as holdover left them, and the jobs it told to checkpoint."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from holdover.bridge.service import Bridge
from holdover.web import snapshot
from holdover.web.routes.deps import bridge

router = APIRouter(prefix="/api/slurm", tags=["slurm"])


@router.get("")
async def slurm_state(b: Bridge = Depends(bridge)) -> list[dict[str, Any]]:
    """Per circuit: drained (since, reason) or not, and each job told: saved at step N and what
    then, not saved (which nodes had no checkpoint), or still told. Empty without [slurm]."""
    return snapshot.slurm(b.journal, b.settings)
