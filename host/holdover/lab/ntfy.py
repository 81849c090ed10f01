"""An ntfy server on loopback as apprise talks to it: where the tests and benchmarks send alerts."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from holdover.lab.broker import free_port


class Ntfy:
    """What an ntfy server does with apprise's POST: take the JSON, answer 200. Records each, and
    when it came (the tests read what was said; bench/site_scale.py counts them a cut)."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.got: list[dict[str, Any]] = []
        self.at: list[float] = []
        self.server: ThreadingHTTPServer | None = None

    def start(self) -> Ntfy:
        got, at = self.got, self.at

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                got.append(json.loads(body))
                at.append(time.time())
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"id":"x"}')

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def url(self, topic: str) -> str:
        return f"ntfy://127.0.0.1:{self.port}/{topic}"

    def on(self, topic: str) -> list[dict[str, Any]]:
        return [m for m in self.got if m["topic"] == topic]
