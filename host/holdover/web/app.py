"""The HTTP API (and the dashboard page), built from a running bridge by `build`.

Runs on the bridge's own event loop (web/server.py), so every handler reads the journal and the
bridge's views on the thread that owns them. The bridge knows nothing of this layer: the live
event feed is one more reaction this module appends to the bridge's list.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles

import holdover
from holdover.bridge.service import Bridge
from holdover.settings import WebSettings
from holdover.web.feed import Feed
from holdover.web.routes import (
    actions,
    checkpoints,
    events,
    failover,
    health,
    metrics,
    outages,
    page,
    runs,
    sentinels,
    slurm,
    ups,
)


def build(bridge: Bridge, settings: WebSettings) -> FastAPI:
    app = FastAPI(
        title="holdover",
        version=holdover.__version__,
        description="Sentinels, protected training runs, uplinks and the event journal of one node.",
    )
    app.state.bridge = bridge
    app.state.settings = settings
    app.state.feed = Feed()
    bridge.reactions.append(app.state.feed)
    for module in (outages, sentinels, ups, runs, checkpoints, failover, slurm, events, actions, health, metrics, page):
        app.include_router(module.router)
    # The page's charting library (uPlot), vendored: a dashboard during an outage fetches nothing
    # from outside, and the uplink may be what is down.
    app.mount("/static", StaticFiles(directory=page.STATIC), name="static")
    app.add_exception_handler(RequestValidationError, _invalid)
    return app


def _finite(v: Any) -> Any:
    # JSON has no inf or nan: a 422 that echoes one ("ms": 1e400) must say it, not fail as a 500.
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_finite(x) for x in v]
    return v


async def _invalid(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return JSONResponse({"detail": _finite(jsonable_encoder(_finite(list(exc.errors()))))}, status_code=422)
