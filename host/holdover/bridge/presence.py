"""Whether each sentinel is still heard, path by path: the broker (its last will) and each USB serial port.

A sentinel watches power and uplink for us only while some path brings its word. So the alarm that
says "unwatched" (sentinel_offline, NUT's COMMBAD) is raised only when no path is left: its MQTT
status is offline (the will fired) and no serial port has carried a line from it for that port's
`silent_after_s`. A path lost while another still carries the sentinel is a warning about that
path (sentinel_path_down: its WiFi or the broker, or a USB cable), closed by sentinel_path_up.

The word kept in the journal is the presence as a whole: online (MQTT), "serial only", offline,
so a bridge restart that hears the same again raises nothing, and one that hears a sentinel gone
while the bridge was down does. Serial paths are learnt from the lines heard, in memory: after a
restart a port counts once it carries a line again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from holdover import events
from holdover.firmware import protocol
from holdover.journal import Journal

log = logging.getLogger("holdover.presence")

MQTT = "mqtt"
SERIAL_ONLY = "serial only"


def path_name(path: str) -> str:
    return "MQTT" if path == MQTT else f"serial {path}"


@dataclass
class _Paths:
    mqtt: str | None = None  # its MQTT status: online, offline, or never heard this run
    serial: dict[str, float] = field(default_factory=dict)  # port -> when a line last came (monotonic)
    down: set[str] = field(default_factory=set)  # paths said down while another still carried it
    offline: bool = False  # sentinel_offline raised and not yet closed


class Presence:
    def __init__(
        self,
        journal: Journal,
        raise_event: Callable[[str, str, dict[str, Any]], None],
        silent_after_s: dict[str, float],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.journal = journal
        self.raise_event = raise_event  # (sid, kind, data): journaled and handed to every reaction
        self.silent_after_s = silent_after_s  # per serial port
        self.clock = clock
        self._paths: dict[str, _Paths] = {}
        self._task: asyncio.Task[None] | None = None

    def _get(self, sid: str) -> _Paths:
        p = self._paths.get(sid)
        if p is None:
            p = self._paths[sid] = _Paths(offline=self.journal.status(sid) == protocol.OFFLINE)
        return p

    def status(self, sid: str, status: str, retained: bool) -> None:
        """Its MQTT status: "online" as it connects, "offline" by its last will or its own word."""
        p = self._get(sid)
        p.mqtt = status
        self._settle(sid, p, retained)

    def heard(self, sid: str, port: str) -> None:
        """A verified line from it on a serial port (a heartbeat at least every heartbeat_s)."""
        p = self._get(sid)
        new = port not in p.serial or not self._fresh(port, p.serial[port])
        p.serial[port] = self.clock()
        if new:
            self._settle(sid, p, False)

    def word(self, sid: str) -> str | None:
        p = self._paths.get(sid)
        return None if p is None else self._word(p)

    def _fresh(self, port: str, at: float) -> bool:
        return self.clock() - at < self.silent_after_s.get(port, 75.0)

    def _live(self, p: _Paths) -> set[str]:
        live = {port for port, at in p.serial.items() if self._fresh(port, at)}
        return live | {MQTT} if p.mqtt == protocol.ONLINE else live

    def _word(self, p: _Paths) -> str:
        if p.mqtt == protocol.ONLINE:
            return protocol.ONLINE
        return SERIAL_ONLY if self._live(p) else protocol.OFFLINE

    def _settle(self, sid: str, p: _Paths, retained: bool) -> None:
        known = set(p.serial) | ({MQTT} if p.mqtt is not None else set())
        live = self._live(p)
        word, was = self._word(p), self.journal.status(sid)
        if word != was:
            with self.journal.guard(f"keeping the presence of {sid}"):
                self.journal.set_status(sid, word)
        if not live:
            if not p.offline and known:
                p.offline, p.down = True, set()
                data = {"status": word, "was": was, "retained": retained, "paths": sorted(known)}
                log.warning("%s: no path left (%s all silent): unwatched", sid, ", ".join(map(path_name, known)))
                self.raise_event(sid, events.SENTINEL_OFFLINE, data)
            return
        via = ", ".join(path_name(x) for x in sorted(live))
        if p.offline:
            p.offline = False
            log.info("%s: heard again over %s", sid, via)
            self.raise_event(sid, events.SENTINEL_ONLINE, {"status": word, "was": was, "via": via})
        for path in sorted(p.down & live):
            p.down.discard(path)
            log.info("%s: %s path back", sid, path_name(path))
            self.raise_event(sid, events.SENTINEL_PATH_UP, {"path": path_name(path), "via": via})
        for path in sorted(known - live - p.down):
            p.down.add(path)
            log.warning("%s: %s path down; still heard over %s", sid, path_name(path), via)
            self.raise_event(sid, events.SENTINEL_PATH_DOWN, {"path": path_name(path), "via": via})

    # A serial path goes quiet without any message saying so: looked at once a second.

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            for sid, p in list(self._paths.items()):
                try:
                    self._settle(sid, p, False)
                except Exception:  # one sentinel's bookkeeping must not end the watch over the others
                    log.exception("presence of %s not settled", sid)

    async def close(self) -> None:
        await events.cancel(self._task)
