"""The host bridge: messages in from MQTT, through the gate, to the journal, state and hooks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from holdover.bridge.gate import Gate, Verdict
from holdover.bridge.hooks import HookRunner
from holdover.bridge.mqtt_link import Inbound, MqttLink
from holdover.events import Reaction
from holdover.journal import Event, Journal
from holdover.node.rescue import Rescuer
from holdover.settings import Settings

log = logging.getLogger("holdover.bridge")


@dataclass
class SentinelView:
    sid: str
    status: str | None = None
    state: dict[str, Any] | None = None
    last_event: str | None = None
    events: int = 0
    rejected: int = 0


@dataclass
class Bridge:
    settings: Settings
    on_verdict: Callable[[Verdict], None] | None = None
    on_hook: Callable[[dict], None] | None = None
    sentinels: dict[str, SentinelView] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.journal = Journal(self.settings.journal.path)
        self.gate = Gate(self.settings.keys(), self.journal)
        self.hooks = HookRunner(self.settings.hooks, self.journal, self.on_hook)
        self.rescuer = Rescuer(self.settings.protect, self.journal)
        # Every accepted event goes to each of these, in order; a new capability appends itself.
        self.reactions: list[Reaction] = [self.hooks, self.rescuer]
        self.queue: asyncio.Queue[Inbound] = asyncio.Queue()
        self._stop = asyncio.Event()
        self.link: MqttLink | None = None

    def view(self, sid: str) -> SentinelView:
        return self.sentinels.setdefault(sid, SentinelView(sid))

    def handle(self, item: Inbound) -> Verdict:
        v = self.gate.mqtt(item.topic, item.payload, item.retained)
        if v.sid is not None:
            view = self.view(v.sid)
            if not v.accepted:
                view.rejected += 1
            elif v.status is not None:
                view.status = v.status
            elif v.state is not None:
                view.state = v.state["data"]
            elif v.event is not None:
                view.events += 1
                view.last_event = v.event.kind
                log.info("event %s from %s (boot %s seq %d)", v.event.kind, v.sid, v.event.boot, v.event.seq)
                self._react(v.event)
        if self.on_verdict:
            self.on_verdict(v)
        return v

    def _react(self, event: Event) -> None:
        for r in self.reactions:
            try:
                r.on_event(event)
            except Exception:  # one broken reaction must not keep the event from the others
                log.exception("reaction %s failed on %s from %s", type(r).__name__, event.kind, event.sid)

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            # Not possible off the main thread, where the demo and tests run a bridge.
            with contextlib.suppress(RuntimeError, ValueError):
                loop.add_signal_handler(sig, self.stop)
        self.link = MqttLink(self.settings.mqtt, self.queue, loop)
        self.link.start()
        for r in self.reactions:
            r.start()
        log.info("bridge up: %d sentinel(s), %d hook(s)", len(self.settings.sentinels), len(self.settings.hooks))
        stopper = asyncio.create_task(self._stop.wait())
        try:
            while not self._stop.is_set():
                getter = asyncio.create_task(self.queue.get())
                done, _ = await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    self.handle(getter.result())
                else:
                    getter.cancel()
        finally:
            stopper.cancel()
            self.link.stop()
            # An unfinished rescue stays 'active' in the journal; the next bridge resumes it.
            for r in reversed(self.reactions):
                await r.close()
            self.journal.close()
            log.info("bridge stopped")


class BridgeThread:
    """A bridge on an event loop of its own, for the demo and benchmarks that drive it from outside."""

    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._main, name="holdover-bridge", daemon=True)

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self.bridge.run())

    def start(self) -> BridgeThread:
        self.thread.start()
        return self

    def _react(self, event: Event) -> None:
        for r in self.reactions:
            try:
                r.on_event(event)
            except Exception:  # one broken reaction must not keep the event from the others
                log.exception("reaction %s failed on %s from %s", type(r).__name__, event.kind, event.sid)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.bridge.stop)
        self.thread.join(15)
