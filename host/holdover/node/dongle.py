"""A Huawei HiLink 4G dongle (E3372h, E8372h) through `huawei-lte-api`: its state, signal,
operator and data used; connecting it; sending an SMS.

Every call is blocking HTTP to the stick, so the async wrappers run it on a thread under a hard
deadline: a stick that answers slowly or not at all costs its caller at most `timeout`, never the
bridge's loop. Its address is configuration; 192.168.8.1 is a real stick's default and is never
contacted by tests, the demo or benchmarks (they run lab.hilink on loopback).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from holdover.errors import HoldoverError
from holdover.settings import DongleSettings

log = logging.getLogger("holdover.dongle")

# HiLink's monitoring/status ConnectionStatus codes.
CONNECTION = {"900": "connecting", "901": "connected", "902": "disconnected", "903": "disconnecting"}
SMS_MAX = 160  # one GSM-7 message


class DongleError(HoldoverError, RuntimeError):
    """The stick could not be reached or refused; the message says which and why."""


@dataclass
class DongleStatus:
    connection: str  # connected / connecting / disconnected / disconnecting / the raw code
    operator: str | None
    network: str | None  # LTE, WCDMA, ... as the stick names its current network type
    rssi: str | None  # as the stick reports them: "-67dBm", "10dB"
    rsrp: str | None
    sinr: str | None
    month_bytes: int | None  # down + up this month, by the stick's own count

    @property
    def connected(self) -> bool:
        return self.connection == "connected"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "connected": self.connected}


NETWORK_TYPES = {"19": "LTE", "101": "LTE", "7": "HSPA+", "4": "WCDMA", "3": "EDGE", "2": "GPRS", "0": "none"}


def shorten(text: str, limit: int = SMS_MAX) -> str:
    """An alert as one SMS: whitespace folded, cut with an ellipsis if it is longer."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


class Dongle:
    def __init__(self, settings: DongleSettings) -> None:
        self.s = settings

    def _client(self) -> Any:
        from huawei_lte_api.Client import Client
        from huawei_lte_api.Connection import Connection

        user, password = self.s.username or None, self.s.password or None
        conn = Connection(self.s.url, username=user, password=password, timeout=self.s.timeout)
        return conn, Client(conn)

    def _call(self, what: str, fn: Any) -> Any:
        try:
            conn, client = self._client()
        except Exception as e:  # requests' and the library's own errors alike: one kind for callers
            raise DongleError(f"dongle at {self.s.url}: {what}: {_words(e)}") from None
        try:
            return fn(client)
        except Exception as e:
            raise DongleError(f"dongle at {self.s.url}: {what}: {_words(e)}") from None
        finally:
            conn.close()

    def status(self) -> DongleStatus:
        def read(c: Any) -> DongleStatus:
            st = c.monitoring.status()
            sig = c.device.signal()
            try:
                plmn = c.net.current_plmn()
            except Exception:  # some sticks have no PLMN while searching; the rest still counts
                plmn = {}
            try:
                month = c.monitoring.month_statistics()
                used = int(month.get("CurrentMonthDownload") or 0) + int(month.get("CurrentMonthUpload") or 0)
            except Exception:
                used = None
            code = str(st.get("ConnectionStatus") or "")
            return DongleStatus(
                connection=CONNECTION.get(code, code or "unknown"),
                operator=plmn.get("FullName") or plmn.get("ShortName"),
                network=NETWORK_TYPES.get(str(st.get("CurrentNetworkType")), st.get("CurrentNetworkType")),
                rssi=sig.get("rssi"),
                rsrp=sig.get("rsrp"),
                sinr=sig.get("sinr"),
                month_bytes=used,
            )

        return self._call("status", read)

    def connect(self) -> None:
        """Mobile data on (the stick dials): asked before traffic is switched to it."""
        self._call("connect", lambda c: c.dial_up.set_mobile_dataswitch(1))

    def send_sms(self, numbers: list[str], text: str) -> None:
        message = shorten(text)
        self._call(f"SMS to {', '.join(numbers)}", lambda c: c.sms.send_sms(numbers, message))

    # --- from the loop: a thread per call, under a deadline ---------------------------------------

    async def astatus(self) -> DongleStatus:
        return await self._off_loop(self.status, "status")

    async def asend_sms(self, numbers: list[str], text: str) -> None:
        await self._off_loop(lambda: self.send_sms(numbers, text), "SMS")

    async def _off_loop(self, fn: Any, what: str) -> Any:
        # Several HTTP requests a call, each bounded by `timeout`: the whole call gets a few of them.
        deadline = self.s.timeout * 4
        try:
            async with asyncio.timeout(deadline):
                return await asyncio.to_thread(fn)
        except TimeoutError:
            raise DongleError(f"dongle at {self.s.url}: {what}: no answer within {deadline:.0f} s") from None


def _words(e: Exception) -> str:
    text = str(e).strip() or type(e).__name__
    if "Read timed out" in text or "timed out" in text:
        return "no answer (timed out)"
    if "Connection refused" in text:
        return "connection refused"
    return text.splitlines()[0][:200]


def dial(dongle: Dongle, uplink: str) -> Callable[[Any], None]:
    """The failover's `prepare`: mobile data on before traffic is switched to the dongle's uplink
    (a stick that is not dialled answers no probe, so it would never look ready)."""

    def prepare(u: Any) -> None:
        if u.name != uplink:
            return
        try:
            if not dongle.status().connected:
                dongle.connect()
                log.info("dongle: mobile data switched on for uplink %s", uplink)
        except DongleError as e:
            log.warning("%s", e)

    return prepare
