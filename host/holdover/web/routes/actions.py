"""POST /api/actions/...: a test alert, a manual emergency checkpoint, a relay command.

Each needs the bearer token from [web]; without one configured, actions are off.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Request
from pydantic import BaseModel, Field

from holdover import events
from holdover.bridge import commands, notify
from holdover.bridge.service import Bridge
from holdover.firmware import protocol
from holdover.web.routes.deps import bridge, token

router = APIRouter(prefix="/api/actions", tags=["actions"], dependencies=[Depends(token)])


def _who(request: Request) -> str:
    """Who pressed, for the journal: the token's holder, from where (one token, so no name)."""
    return f"api (token, from {request.client.host if request.client else 'an unknown address'})"


class RelayCommand(BaseModel):
    op: Literal["on", "off", "pulse"]
    ms: int = Field(0, ge=0, le=protocol.PULSE_MAX_MS)


@router.post("/test-alert")
async def test_alert(b: Bridge = Depends(bridge)) -> dict[str, Any]:
    """Send one test message through every alert channel now (not queued); each one's result."""
    out = {}
    for c in b.settings.alerts.channels:
        body = f"from {socket.gethostname()}, asked on the API: channel {c.name!r} works"
        r = await asyncio.to_thread(notify.send, c.url, "holdover test alert", body, "critical")
        out[c.name] = "sent" if r.ok else f"failed: {r.error}"
    return {"channels": out}


@router.post("/checkpoint", status_code=202)
async def checkpoint(request: Request, b: Bridge = Depends(bridge)) -> dict[str, Any]:
    """An emergency checkpoint of every protected run, as if the UPS had said so."""
    if not b.settings.protect.enabled:
        raise HTTPException(409, "[protect] is disabled in the config: no emergency checkpoints")
    event = b.node_event(events.CHECKPOINT_REQUESTED, {"by": _who(request)})
    return {"event_id": event.id}


@router.post("/relay/{sid}", status_code=202)
async def relay(sid: str, cmd: RelayCommand, request: Request, b: Bridge = Depends(bridge)) -> dict[str, Any]:
    """A signed relay command to the sentinel; its answer comes back as an ack (see /api/sentinels)."""
    keys = b.settings.keys()  # Settings.keys(): the sentinels' keys by id, not a dict's
    if sid not in keys:
        raise HTTPException(404, f"no sentinel {sid!r} in the config")
    if cmd.op == protocol.OP_PULSE and cmd.ms <= 0:
        raise HTTPException(422, "a pulse needs ms > 0")
    try:
        cid = b.send_command(sid, cmd.op, cmd.ms, by=_who(request))
    except commands.CommandError as e:
        raise HTTPException(409, str(e)) from None
    return {"command_id": cid}
