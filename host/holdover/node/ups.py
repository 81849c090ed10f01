"""The host's UPS: the rescue's clock, and a source of power events of its own.

The emergency deadline is how long the *host's* UPS lasts, not the sentinel's 18650 (which keeps
an ESP32 alive for a day and says nothing of a GPU box's 8 minutes). `[ups] nut` names a UPS on a
NUT server, read every `poll_s` on a worker thread (node/nut_client.py, every read bounded in
time), so the bridge's loop never waits on upsd. Its status words become host events, as NUT's
upsmon turns them into ONBATT / ONLINE / LOWBATT (`[ups] apcupsd` reads apcupsd's NIS instead,
node/apcupsd.py, its words put in NUT's):

    OL -> OB            ups_on_battery   (starts the rescue, after the grace, with its runtime)
    OB -> OL            ups_online       (ends the grace; closes the alert)
    OB + LB, FSD, or OB with battery.runtime < low_runtime_s
                        ups_low_battery  (the final command, once every run is settled)

A sentinel's mains_lost that the UPS does not confirm within `disagree_after_s` is itself worth a
warning (power_disagree): usually the opto is on the UPS's output instead of the wall. With a
fixed `runtime_s` and no NUT, the runtime is that number and the doctor calls it a guess.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from holdover import events
from holdover.events import Polling
from holdover.firmware import protocol
from holdover.journal import Event
from holdover.node import apcupsd
from holdover.node.nut_client import NutClient, NutError
from holdover.settings import UpsSettings

log = logging.getLogger("holdover.ups")

UNREADABLE_AFTER = 3  # failed reads in a row before it is said (upsd restarting takes a read or two)


@dataclass(frozen=True)
class UpsReading:
    status: tuple[str, ...]  # NUT's words in NUT's order (OB DISCHRG): OL, OB, LB, FSD, CHRG, ...
    charge: float | None  # percent
    runtime_s: float | None
    load: float | None  # percent
    at: float  # time.time() of the read
    fixed: bool = False  # no UPS read: the runtime is [ups] runtime_s

    @property
    def on_battery(self) -> bool:
        return "OB" in self.status

    def low(self, floor_s: float) -> bool:
        """What makes upsmon shut down: on battery with LB, or FSD; or under the configured floor."""
        under = floor_s > 0 and self.runtime_s is not None and self.runtime_s < floor_s
        return "FSD" in self.status or (self.on_battery and ("LB" in self.status or under))

    def summary(self) -> dict[str, Any]:
        """The reading as events and the node's retained state carry it."""
        rt = None if self.runtime_s is None else round(self.runtime_s)
        return {"status": " ".join(self.status), "runtime_s": rt, "charge": self.charge, "load": self.load}

    def describe(self) -> str:
        if self.fixed:
            return f"no UPS read; runtime_s = {self.runtime_s:.0f} s from the config (a guess)"
        parts = [" ".join(self.status)]
        if self.charge is not None:
            parts.append(f"{self.charge:.0f} %")
        parts.append(f"{self.runtime_s:.0f} s left" if self.runtime_s is not None else "no battery.runtime")
        if self.load is not None:
            parts.append(f"load {self.load:.0f} %")
        return ", ".join(parts)


def _number(found: dict[str, str], name: str) -> float | None:
    try:
        v = float(found[name])
    except (KeyError, ValueError):
        return None
    return v if v == v and abs(v) != float("inf") else None


def reading(found: dict[str, str], fixed_runtime: float = 0.0) -> UpsReading:
    """A UPS's variables (as upsc prints them), read the way upsmon reads them."""
    words = found.get("ups.status", "").split()
    if not words:
        raise NutError("the UPS reports no ups.status")
    if "WAIT" in words:
        raise NutError("upsd has no data from the UPS's driver yet (WAIT)")
    runtime = _number(found, "battery.runtime")
    return UpsReading(
        tuple(words),
        _number(found, "battery.charge"),
        runtime if runtime is not None else (fixed_runtime or None),
        _number(found, "ups.load"),
        time.time(),
    )


class UpsReader:
    """One read at a time, blocking (call it off the loop); the connection is kept between reads
    and made again after any error."""

    def __init__(self, settings: UpsSettings) -> None:
        self.s = settings
        self._client: NutClient | None = None

    def read(self) -> UpsReading:
        if self.s.apcupsd:
            host, port = self.s.nis_address()
            return reading(apcupsd.read(host, port, self.s.timeout_s), self.s.runtime_s)
        if not self.s.nut:
            return UpsReading((), None, self.s.runtime_s, None, time.time(), fixed=True)
        ups, host, port = self.s.address()
        try:
            if self._client is None:
                client = NutClient(host, port, self.s.timeout_s)
                client.connect(self.s.username, self.s.password)
                self._client = client
            return reading(self._client.list_vars(ups), self.s.runtime_s)
        except NutError as e:
            self.close()
            raise NutError(f"UPS {self.s.nut}: {e}") from None

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


@dataclass(frozen=True)
class Runtime:
    """The host's runtime left as an emergency's deadline takes it, and where it comes from, in
    the one wording the rescue's journal, the page, `status` and the doctor all use."""

    seconds: float
    said: str
    guess: bool  # [ups] runtime_s or [protect] runtime_default: not read from a UPS
    read: bool  # from a reading (a UPS, or [ups] runtime_s): counts from now, not from the cut
    why: str = ""  # a guess's reason in a person's words, no config keys ("no UPS configured")
    load_w: float | None = None  # the UPS's load in watts: its ups.load % of [ups] watts, when both are known


def runtime_from(
    ups: UpsSettings,
    r: UpsReading | None,
    problem: str | None,
    default: float,
    stale_after_s: float | None = None,
) -> Runtime:
    """What an emergency's deadline is taken from, given the UPS's last reading (or the problem
    reading it): its runtime, the fixed [ups] runtime_s, or [protect] runtime_default with why."""
    why = said = None
    if problem is not None:
        why = problem
    elif not ups.enabled:
        why, said = "no [ups]", "no UPS configured"
    elif r is None:
        why = f"UPS {ups.name} not read yet"
    elif stale_after_s is not None and time.time() - r.at > stale_after_s:
        why = f"UPS {ups.name} last read {time.time() - r.at:.0f} s ago"
    elif r.runtime_s is None:
        why = f"UPS {ups.name} reports no battery.runtime"
    if why is not None or r is None or r.runtime_s is None:
        return Runtime(default, f"[protect] runtime_default {default:.0f} s, a guess ({why})", True, False, said or why)
    if r.fixed:
        return Runtime(
            r.runtime_s, f"[ups] runtime_s {r.runtime_s:.0f} s, a guess", True, True, "a fixed runtime, no UPS read"
        )
    load_w = r.load * ups.watts / 100 if r.load is not None and ups.watts else None
    return Runtime(r.runtime_s, f"UPS {ups.name}: {r.runtime_s:.0f} s left", False, True, load_w=load_w)


def read_once(settings: UpsSettings) -> tuple[UpsReading | None, str | None]:
    """The host's UPS read once, as upsc would (for commands; the bridge need not run), its
    connection closed after: (the reading, None), (None, what is wrong), or (None, None) with no [ups]."""
    if not settings.enabled:
        return None, None
    reader = UpsReader(settings)
    try:
        return reader.read(), None
    except NutError as e:
        return None, str(e)
    finally:
        reader.close()


class UpsWatch(Polling):
    """A Reaction: reads the UPS every poll_s, raises its transitions, and hears the sentinels'
    mains events to notice when the two disagree."""

    def __init__(
        self,
        settings: UpsSettings,
        raise_event: Callable[[str, dict[str, Any]], Event],
        reader: UpsReader | None = None,
        on_read: Callable[[UpsReading], None] | None = None,
    ) -> None:
        self.s = settings
        self.on_read = on_read  # each read of a real UPS, for the history the dashboard plots
        self.interval = settings.poll_s
        self.raise_event = raise_event  # (kind, data): a host event about this node, to every reaction
        self.reader = reader or UpsReader(settings)
        self.latest: UpsReading | None = None
        self.problem: str | None = None
        self._failures = 0
        self._said_unreadable = False
        self._said_low = False
        self._lost_at: dict[str, float] = {}  # sentinel -> when its mains_lost came (monotonic)

    def _data(self, r: UpsReading, **more: Any) -> dict[str, Any]:
        return {"ups": self.s.name, **r.summary(), **more}

    async def look(self) -> None:
        try:
            r = await asyncio.to_thread(self.reader.read)
        except NutError as e:
            self._unreadable(str(e))
            return
        if self.problem is not None:
            log.info("UPS %s read again: %s", self.s.name, r.describe())
            if self._said_unreadable:
                self.raise_event(events.UPS_READABLE, self._data(r))
        self.problem, self._failures, self._said_unreadable = None, 0, False
        prev, self.latest = self.latest, r
        if r.fixed:
            return
        if self.on_read is not None:
            self.on_read(r)
        was_on_battery = prev is not None and prev.on_battery
        if r.on_battery and not was_on_battery:
            log.warning("UPS %s on battery: %s", self.s.name, r.describe())
            self.raise_event(events.UPS_ON_BATTERY, self._data(r))
        elif was_on_battery and not r.on_battery:
            log.info("UPS %s back on line power: %s", self.s.name, r.describe())
            self._said_low = False
            self.raise_event(events.UPS_ONLINE, self._data(r))
        if r.low(self.s.low_runtime_s) and not self._said_low:
            self._said_low = True
            log.warning("UPS %s low battery: %s", self.s.name, r.describe())
            self.raise_event(events.UPS_LOW_BATTERY, self._data(r, on_battery=r.on_battery or "FSD" in r.status))
        self._disagreement(r)

    def _unreadable(self, why: str) -> None:
        self._failures += 1
        if why != self.problem:
            log.warning("%s (deadline falls back to protect.runtime_default)", why)
        self.problem = why
        if not self._said_unreadable and (self._failures >= UNREADABLE_AFTER or self.latest is None):
            self._said_unreadable = True
            self.raise_event(events.UPS_UNREADABLE, {"ups": self.s.name, "detail": why})

    def on_event(self, event: Event) -> None:
        if event.sid == protocol.NODE:
            return
        if event.kind == protocol.MAINS_LOST:
            self._lost_at.setdefault(event.sid, time.monotonic())
        elif event.kind == protocol.MAINS_RESTORED:
            self._lost_at.pop(event.sid, None)

    def _disagreement(self, r: UpsReading) -> None:
        if r.on_battery:
            self._lost_at.clear()  # the UPS agrees
            return
        now = time.monotonic()
        for sid, since in list(self._lost_at.items()):
            if now - since >= self.s.disagree_after_s:
                del self._lost_at[sid]  # said once per loss
                after = round(now - since)
                said = r.describe()
                log.warning("sentinel %s says mains lost for %d s; UPS %s says %s", sid, after, self.s.name, said)
                self.raise_event(events.POWER_DISAGREE, {"sentinel": sid, "ups": self.s.name, "after_s": after})

    def runtime(self, default: float) -> Runtime:
        """The host's runtime left now, and where that number comes from (a read older than five
        polls is not trusted: the UPS may have fallen since)."""
        return runtime_from(self.s, self.latest, self.problem, default, max(10.0, 5 * self.s.poll_s))

    async def close(self) -> None:
        await super().close()
        await asyncio.to_thread(self.reader.close)
