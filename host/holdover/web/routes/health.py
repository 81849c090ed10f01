"""GET /healthz: is the bridge able to do its job (journal writable, broker connected)."""

from __future__ import annotations

import sqlite3
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from holdover.bridge.service import Bridge
from holdover.web.routes.deps import bridge

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz(b: Bridge = Depends(bridge)) -> JSONResponse:
    checks: dict[str, Any] = {}
    try:
        b.journal.ping()
        checks["journal"] = "ok" if b.journal.broken is None else f"error: {b.journal.broken}"
    except sqlite3.Error as e:
        checks["journal"] = f"error: {e}"
    if b.journal.held:
        checks["held_events"] = len(b.journal.held)
    checks["broker"] = "connected" if b.link is not None and b.link.connected.is_set() else "not connected"
    # A bridge without its broker still hears the serial line and still protects runs: degraded,
    # not down. Without its journal it still acts, but keeps nothing: down, for whoever watches.
    ok = checks["journal"] == "ok"
    return JSONResponse({"ok": ok, **checks}, status_code=200 if ok else 503)
