"""GET /api/events: the journal, paged and filtered; GET /api/events/stream: live, as server-sent events."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse

from holdover import events as kinds
from holdover.bridge.service import Bridge
from holdover.web import snapshot
from holdover.web.routes.deps import bridge

router = APIRouter(prefix="/api/events", tags=["events"])
KEEPALIVE_S = 15.0


def _row(e: Any) -> dict[str, Any]:
    k = kinds.kind(e.kind)
    return {
        "id": e.id,
        "rx_ts": e.rx_ts,
        "source": e.source,
        "sid": e.sid,
        "boot": e.boot,
        "seq": e.seq,
        "kind": e.kind,
        "severity": k.severity,
        "text": k.describe(sid=e.sid, **e.data),
        "ts": e.ts,
        "data": e.data,
    }


@router.get("")
async def list_events(
    kind: str | None = Query(None, description="only this kind"),
    sentinel: str | None = Query(None, description="only this sentinel (node: this machine)"),
    # SQLite's INTEGER is 64-bit: a larger id is a 422, not an OverflowError.
    before: int | None = Query(None, ge=1, le=2**63 - 1, description="page: events with an id below this"),
    limit: int = Query(100, ge=1, le=1000),
    routine: bool = Query(False, description="also the routine kinds (heartbeats), otherwise only counted"),
    b: Bridge = Depends(bridge),
) -> dict[str, Any]:
    """Newest first. Unless `routine` or a `kind` is asked for, heartbeats are left out and counted
    over the span the page covers (`folded`), so a cut is not pushed off the screen by them."""
    exclude = () if routine or kind else tuple(kinds.ROUTINE)
    rows = b.journal.events(sid=sentinel, kind=kind, limit=limit, before=before, exclude=exclude)
    items = [_row(e) for e in rows]
    folded = snapshot.folded(b.journal, exclude, sentinel, rows, limit, before)
    return {"items": items, "next_before": items[-1]["id"] if len(items) == limit else None, "folded": folded}


@router.get("/stream", response_class=StreamingResponse)
async def stream(request: Request) -> StreamingResponse:
    """One `event: <kind>` per accepted event, as it is journaled; a comment every 15 s keeps
    proxies from closing the connection."""
    feed = request.app.state.feed
    q = feed.open()

    async def gen() -> AsyncIterator[str]:
        try:
            yield ": holdover event stream\n\n"
            while q in feed.readers:
                try:
                    async with asyncio.timeout(KEEPALIVE_S):
                        item = await q.get()
                except TimeoutError:
                    yield ": keepalive\n\n"
                    continue
                if item is None:
                    return
                k = kinds.kind(item["kind"])
                item = {**item, "severity": k.severity, "text": k.describe(sid=item["sid"], **item["data"])}
                yield f"id: {item['id']}\nevent: {item['kind']}\ndata: {json.dumps(item)}\n\n"
        finally:
            feed.close_reader(q)

    return StreamingResponse(gen(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
