"""The HTTP API (and the dashboard page), built from a running bridge by `build`.

Runs on the bridge's own event loop (web/server.py), so every handler reads the journal and the
bridge's views on the thread that owns them. The bridge knows nothing of this layer: the live
event feed is one more reaction this module appends to the bridge's list.
"""

from __future__ import annotations

from fastapi import FastAPI

import holdover
from holdover.bridge.service import Bridge
from holdover.settings import WebSettings
from holdover.web.feed import Feed
from holdover.web.routes import actions, checkpoints, events, failover, health, metrics, page, runs, sentinels


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
    for module in (sentinels, runs, checkpoints, failover, events, actions, health, metrics, page):
        app.include_router(module.router)
    return app
