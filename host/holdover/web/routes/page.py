"""GET /: the dashboard, one page with no build step, live from the event stream."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, HTMLResponse

from holdover import events

router = APIRouter(tags=["dashboard"])
STATIC = Path(__file__).resolve().parents[1] / "static"
PAGE = STATIC / "index.html"
ICON = STATIC / "icon.svg"


@cache
def _page() -> str:
    return PAGE.read_text().replace("/*KINDS*/[]", json.dumps(sorted(events.TABLE)))


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
async def dashboard() -> HTMLResponse:
    return HTMLResponse(_page())


@router.get("/favicon.ico", include_in_schema=False)
async def favicon() -> FileResponse:
    # Browsers ask for it on every load whatever the page says; an SVG is what Chromium and Firefox show.
    return FileResponse(ICON, media_type="image/svg+xml")
