"""Every sentinel as a NUT UPS, so whatever already follows a UPS (upsmon on each machine, a NAS's
"network UPS server" setting, Home Assistant's NUT integration, WinNUT) follows the sentinel.

NUT serves it, not holdover: the bridge keeps one file per sentinel current in the `dummy-ups`
format (`var: value` lines), replaced atomically so NUT never reads half of one, and NUT's own
upsd serves it with its users, ACLs and protocol exactly as its clients expect
(`holdover nut-config` writes ups.conf, upsd.conf and upsd.users for it). dummy-ups, polling its
file every second (`pollinterval = 1`), carried a change to a polling upsmon in about a second
here (bench/nut.py), so nothing is written by hand. One trap: it re-reads the file only when its
mtime changes in whole seconds, so a second write in the same second (a mains blip: OB, then OL)
was never served; `write_dev` moves each write's mtime at least a second past the last.

What a client sees, per sentinel:

    ups.status      OL while its mains is on, OB DISCHRG once it reports mains lost; LB when the
                    host UPS is at low battery or its runtime is under lb_runtime_s (the clients'
                    time to shut down); FSD once holdover runs its final command; empty while
                    the sentinel is silent (below)
    battery.charge  the host UPS's, when one is read ([ups]); absent otherwise, never invented
    battery.runtime the host UPS's runtime left, likewise
    ups.load        the host UPS's load, likewise
    ups.firmware    the firmware version the sentinel said at its boot, once it has said one
    device.*, ups.id the sentinel (holdover, its id)

A sentinel gone silent (no path left: its will fired and no serial port carries it) is served with
an empty `ups.status`. dummy-ups cannot mark its data stale, and upsmon takes an empty status as it
takes a dead UPS (clients/upsmon.c, parse_status): COMMBAD at its next poll, COMMOK once the status
is back, and, if it was on battery, NUT's DEADTIME rule. The other way NUT has, ending the driver so
that upsd says "Driver not connected", needs the driver restarted by hand afterwards (dummy-ups
exits when its file is missing; nothing brings it back outside systemd), and the bridge does not own
NUT's daemons.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from holdover import events
from holdover.events import Polling
from holdover.files import write_atomic
from holdover.firmware import protocol
from holdover.journal import Event, Journal
from holdover.node.ups import UpsWatch
from holdover.settings import NutServerSettings

log = logging.getLogger("holdover.nut")
EMPTY = '""'  # an empty value spelled as NUT's config syntax spells one, not left to a bare `var:`


def dev_path(s: NutServerSettings, sid: str) -> Path:
    return s.dir / f"{s.prefix}{sid}.dev"


def write_dev(path: Path, text: str) -> None:
    """Replace a dummy-ups file so that dummy-ups sees it changed, however soon after the last."""
    try:
        before = int(path.stat().st_mtime)
    except OSError:
        before = None
    write_atomic(path, text, durable=False)  # tmpfs or not, a restart writes it again
    if before is not None and int(path.stat().st_mtime) <= before:
        os.utime(path, (before + 1, before + 1))


class NutServe(Polling):
    """A Reaction: a sentinel's mains events and the host UPS's state, written for dummy-ups."""

    interval = 1.0  # the host UPS's runtime moves without an event: looked at once a second

    def __init__(self, settings: NutServerSettings, sids: list[str], journal: Journal, ups: UpsWatch | None) -> None:
        self.s = settings
        self.ups = ups
        self.journal = journal
        self.mains: dict[str, bool | None] = dict.fromkeys(sids)
        self.silent: dict[str, bool] = dict.fromkeys(sids, False)
        self.fw: dict[str, str] = {}
        for sid in sids:
            boots = journal.events(sid=sid, kind=protocol.BOOT, limit=1)
            if boots and isinstance(boots[0].data.get("fw"), str):
                self.fw[sid] = boots[0].data["fw"]
        self._event_at: dict[str, float] = {}  # when a mains event was taken: an older state must not undo it
        self._from_states()
        self.fsd = False
        self._written: dict[str, str] = {}
        self._failed: str | None = None

    def start(self) -> None:
        try:
            self.s.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            log.error("cannot serve the sentinels to NUT: %s: %s", self.s.dir, e.strerror)
        self.write_all()
        super().start()

    def on_event(self, event: Event) -> None:
        if event.sid in self.mains and event.kind in (protocol.MAINS_LOST, protocol.MAINS_RESTORED):
            self.mains[event.sid] = event.kind == protocol.MAINS_RESTORED
            self._event_at[event.sid] = time.time()
            self.write(event.sid)
        elif event.sid in self.mains and event.kind in (events.SENTINEL_OFFLINE, events.SENTINEL_ONLINE):
            self.silent[event.sid] = event.kind == events.SENTINEL_OFFLINE
            self.write(event.sid)
        elif event.sid in self.mains and event.kind == protocol.BOOT and isinstance(event.data.get("fw"), str):
            self.fw[event.sid] = event.data["fw"]
            self.write(event.sid)
        elif event.kind == events.FINAL_COMMAND:
            self.fsd = True  # the site goes down: every client is told to, as NUT's primary would
            self.write_all()
        elif event.kind in (events.UPS_ON_BATTERY, events.UPS_ONLINE, events.UPS_LOW_BATTERY):
            self.write_all()

    async def look(self) -> None:
        self._from_states()
        self.write_all()

    def _from_states(self) -> None:
        """A sentinel's mains from its latest state (a boot says it there, with no event)."""
        for sid in self.mains:
            self.silent[sid] = self.journal.status(sid) == protocol.OFFLINE
            held = self.journal.sentinel(sid) or {}
            mains = (held.get("state") or {}).get("mains")
            seen = held.get("seen_ts") or 0.0
            if isinstance(mains, bool) and seen > self._event_at.get(sid, 0.0):
                self.mains[sid] = mains

    def variables(self, sid: str) -> dict[str, Any] | None:
        mains = self.mains.get(sid)
        if mains is None:
            return None  # never heard: nothing served rather than a guess
        status = ["OL"] if mains else ["OB", "DISCHRG"]
        found: dict[str, Any] = {}
        r = self.ups.latest if self.ups is not None and self.ups.problem is None else None
        if r is not None and not r.fixed:
            if r.charge is not None:
                found["battery.charge"] = f"{r.charge:.0f}"
            if r.runtime_s is not None:
                found["battery.runtime"] = f"{r.runtime_s:.0f}"
            if r.load is not None:
                found["ups.load"] = f"{r.load:.0f}"
            floor = self.s.lb_runtime_s
            under = floor > 0 and r.on_battery and r.runtime_s is not None and r.runtime_s < floor
            if r.low(self.ups.s.low_runtime_s if self.ups else 0.0) or under:
                status.append("LB")
        if self.fsd:
            status.append("FSD")
        if self.silent.get(sid):
            status = []  # what upsmon takes for a dead UPS: COMMBAD
        if sid in self.fw:
            found["ups.firmware"] = self.fw[sid]
        return {
            "ups.status": " ".join(status),
            **found,
            "device.mfr": "holdover",
            "device.model": "holdover sentinel",
            "device.type": "ups",
            "ups.mfr": "holdover",
            "ups.model": "holdover sentinel",
            "ups.id": sid,
        }

    def write_all(self) -> None:
        for sid in self.mains:
            self.write(sid)

    def write(self, sid: str) -> None:
        found = self.variables(sid)
        if found is None:
            return
        text = "".join(f"{k}: {v or EMPTY}\n" for k, v in found.items())
        if self._written.get(sid) == text:
            return
        path = dev_path(self.s, sid)
        try:
            write_dev(path, text)
        except OSError as e:
            if self._failed != str(e):
                log.error("cannot write %s for NUT: %s", path, e.strerror or e)
            self._failed = str(e)
            return
        self._failed = None
        self._written[sid] = text
        log.info("NUT %s%s: %s", self.s.prefix, sid, found["ups.status"] or "silent (an empty status: COMMBAD)")
