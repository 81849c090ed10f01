"""Accepted events as they happen, for the API's server-sent event stream."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from holdover.journal import Event

QUEUE_MAX = 256  # a reader this far behind is dropped rather than holding the bridge's memory


class Feed:
    """A reaction (events.Reaction): hands every accepted event to each open stream."""

    def __init__(self) -> None:
        self.readers: set[asyncio.Queue[dict[str, Any] | None]] = set()

    def start(self) -> None:
        pass

    def on_event(self, event: Event) -> None:
        item = {"id": event.id, "rx_ts": event.rx_ts, "source": event.source, **event.body}
        for q in list(self.readers):
            try:
                q.put_nowait(item)
            except asyncio.QueueFull:
                self.readers.discard(q)  # its stream sees it is gone at its next keepalive, and ends

    def open(self) -> asyncio.Queue[dict[str, Any] | None]:
        q: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(QUEUE_MAX)
        self.readers.add(q)
        return q

    def close_reader(self, q: asyncio.Queue[dict[str, Any] | None]) -> None:
        self.readers.discard(q)

    async def close(self) -> None:
        for q in list(self.readers):
            with contextlib.suppress(asyncio.QueueFull):
                q.put_nowait(None)  # end of stream
        self.readers.clear()
