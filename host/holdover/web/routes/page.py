"""GET /: the dashboard, one page with no build step, live from the event stream."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from holdover import events

router = APIRouter(tags=["dashboard"])
STATIC = Path(__file__).resolve().parents[1] / "static"
PAGE = STATIC / "index.html"


@cache
def _page() -> str:
    return PAGE.read_text().replace("/*KINDS*/[]", json.dumps(sorted(events.TABLE)))


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
async def dashboard() -> HTMLResponse:
    return HTMLResponse(_page())
