"""A fake Huawei HiLink stick on loopback: the part of its web API holdover uses, spoken the way
the sticks speak it (XML in <response>/<error>, a CSRF token in the home page and rotated on
every POST), so the real `huawei-lte-api` client drives it in tests and the demo.

It can hang (accept and never answer), answer every request with a HiLink error code, and it
records the SMS it was asked to send and the data switch it was asked to flip.
"""

from __future__ import annotations

import secrets
import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from holdover.lab.broker import free_port


class HiLink:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.connection = "901"  # connected
        self.signal = {"rssi": "-67dBm", "rsrp": "-95dBm", "sinr": "12dB", "rsrq": "-9.0dB"}
        self.operator = "Test Telecom"
        self.month = {"CurrentMonthDownload": 3_000_000, "CurrentMonthUpload": 1_000_000}
        self.dataswitch = 0
        self.on_dataswitch: Callable[[int], None] | None = None  # what dialling does to the lab's network
        self.sms: list[dict[str, Any]] = []  # {"phones": [...], "content": str}
        self.hang = False  # accept, then never answer
        self.error_code: int | None = None  # answer every API call with this HiLink error
        self.requests: list[str] = []
        self._token = secrets.token_hex(16)
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        self._server.daemon_threads = True
        self._release = threading.Event()
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> HiLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- what the stick answers -------------------------------------------------------------------

    def _get(self, path: str) -> dict[str, Any] | None:
        status = {"ConnectionStatus": self.connection, "CurrentNetworkType": "19", "SignalIcon": 4}
        return {
            "/api/monitoring/status": status,
            "/api/device/signal": self.signal,
            "/api/net/current-plmn": {"State": "0", "FullName": self.operator, "ShortName": "TT", "Numeric": "99999"},
            "/api/monitoring/month_statistics": {k: str(v) for k, v in self.month.items()},
            "/api/dialup/mobile-dataswitch": {"dataswitch": str(self.dataswitch)},
            "/api/webserver/SesTokInfo": {"SesInfo": "SessionID=fake", "TokInfo": self._token},
        }.get(path)

    def _post(self, path: str, body: ET.Element) -> bool:
        if path == "/api/sms/send-sms":
            phones = [p.text or "" for p in body.iter("Phone")]
            self.sms.append({"phones": phones, "content": body.findtext("Content") or ""})
            return True
        if path == "/api/dialup/mobile-dataswitch":
            self.dataswitch = int(body.findtext("dataswitch") or 0)
            self.connection = "901" if self.dataswitch else "902"
            if self.on_dataswitch is not None:
                self.on_dataswitch(self.dataswitch)
            return True
        return False

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stick = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _reply(self, code: int, body: bytes, ctype: str = "text/xml") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                if self.command == "POST":
                    stick._token = secrets.token_hex(16)  # a fresh token after every POST, as the sticks do
                    self.send_header("__RequestVerificationToken", stick._token)
                self.end_headers()
                self.wfile.write(body)

            def _stall(self) -> bool:
                if stick.hang:
                    stick._release.wait(60)
                    return True
                return False

            def _xml(self, data: dict[str, Any] | None) -> None:
                if stick.error_code is not None:
                    body = f'<?xml version="1.0"?><error><code>{stick.error_code}</code><message></message></error>'
                elif data is None:
                    body = '<?xml version="1.0"?><error><code>100002</code><message></message></error>'
                elif not data:
                    body = '<?xml version="1.0"?><response>OK</response>'
                else:
                    items = "".join(f"<{k}>{v}</{k}>" for k, v in data.items())
                    body = f'<?xml version="1.0" encoding="UTF-8"?><response>{items}</response>'
                self._reply(200, body.encode())

            def do_GET(self) -> None:
                stick.requests.append(f"GET {self.path}")
                if self._stall():
                    return
                path = self.path.split("?")[0]
                if path == "/":
                    page = f'<html><head><meta name="csrf_token" content="{stick._token}"/></head></html>'
                    self._reply(200, page.encode(), "text/html")
                    return
                self._xml(stick._get(path))

            def do_POST(self) -> None:
                stick.requests.append(f"POST {self.path}")
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n)
                if self._stall():
                    return
                if self.headers.get("__RequestVerificationToken") != stick._token:
                    self._reply(200, b"<error><code>125002</code></error>")  # a stale token: CSRF error
                    return
                try:
                    body = ET.fromstring(raw)
                except ET.ParseError:
                    self._reply(200, b"<error><code>125003</code></error>")
                    return
                self._xml({} if stick._post(self.path, body) else None)

        return Handler
