"""Serve the API on the bridge's own event loop, next to it, and stop with it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator

import uvicorn

from holdover.bridge.service import Bridge
from holdover.settings import WebSettings
from holdover.web.app import build

log = logging.getLogger("holdover.web")


class _Server(uvicorn.Server):
    # The bridge owns SIGINT/SIGTERM; uvicorn must not take them over.
    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[override]
        yield


def bind(settings: WebSettings) -> socket.socket | None:
    """The listening socket, bound here so that a port in use is a warning, not the bridge's end
    (uvicorn would exit the process)."""
    try:
        sock = socket.socket(socket.AF_INET6 if ":" in settings.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((settings.host, settings.port))
    except OSError as e:
        log.error("web: cannot listen on %s:%d: %s; the bridge runs without its API", settings.host, settings.port, e)
        return None
    sock.set_inheritable(True)
    return sock


@contextlib.asynccontextmanager
async def serving(bridge: Bridge, settings: WebSettings) -> AsyncIterator[None]:
    """The API and dashboard served on the bridge's loop while it runs: `Bridge.run(beside=...)`."""
    made = make_server(bridge, settings) if settings.enabled else None
    if made is None:
        yield
        return
    server, sock = made
    web = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    host, port = sock.getsockname()[:2]
    log.info("web: API and dashboard on http://%s:%d/ (OpenAPI at /docs)", host, port)
    try:
        yield
    finally:
        server.should_exit = True
        await web
        sock.close()


def make_server(bridge: Bridge, settings: WebSettings) -> tuple[uvicorn.Server, socket.socket] | None:
    """The server for a bridge and its bound socket (None if it cannot listen); the caller runs
    `server.serve(sockets=[sock])` on the bridge's loop and sets `should_exit` to stop it."""
    sock = bind(settings)
    if sock is None:
        return None
    return _Server(uvicorn.Config(build(bridge, settings), log_level="warning", lifespan="off")), sock
