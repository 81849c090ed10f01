"""Getting one save out of one training process in a rescue: over its socket (the request carries an
id, so a bridge restarted mid-rescue asks to watch, never to save again), or by its signal and then
its registration file; every state it reports journaled, and a hang or the deadline named. The
rescue (node/rescue.py) decides whom to ask and when; this only asks."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from holdover import events
from holdover.node.rescue_ledger import RescueLedger
from holdover.node.targets import Target, registry_dir
from holdover.settings import ProtectSettings
from holdover.train import registry

log = logging.getLogger("holdover.node.rescue")


class Asker:
    def __init__(self, settings: ProtectSettings, ledger: RescueLedger, say: Callable[..., None]) -> None:
        self.s = settings
        self.ledger = ledger
        self.say = say  # raises a host event about a target: (kind, target, text)
        # What each run last reported of its save (state, bytes_done, bytes_total), for the banner:
        # the ledger keeps changes of state only, not every progress report.
        self.live: dict[str, dict[str, Any]] = {}

    async def ask(
        self, rid: int, t: Target, past: list[dict[str, Any]], deadline: Callable[[], float], reserve: float
    ) -> tuple[Path, dict[str, Any]] | None:
        """Get a save out of the target: its directory and the training side's report, or None. What
        `past` holds (the steps a previous bridge took in this rescue) is never done twice. The
        deadline is read each time, as it can move while we wait; `reserve` is left for a gcore."""
        give_up = lambda: deadline() - reserve  # noqa: E731
        request_id = next((s["detail"]["id"] for s in past if s["action"] == "requested"), None)
        since = past[0]["ts"] if past else time.time()
        if t.socket and Path(t.socket).exists():
            if request_id is None:
                request_id = uuid.uuid4().hex[:12]
                self.ledger.step(rid, t.key, t.pid, "requested", id=request_id, via="socket")
            try:
                return await self._follow(rid, t, request_id, deadline, give_up)
            except (OSError, ConnectionError) as e:
                self.ledger.step(rid, t.key, t.pid, "socket_failed", error=str(e))
        if any(s["action"] == "signalled" for s in past):
            log.info("%s: already signalled before a restart; not signalling twice", t.key)
        elif t.signal:
            self.ledger.step(rid, t.key, t.pid, "signalled", signal=signal.Signals(t.signal).name)
            try:
                os.kill(t.pid, t.signal)
            except ProcessLookupError:
                self.ledger.step(rid, t.key, t.pid, "lost", error="the process is gone")
                return None
        else:
            return None
        if t.reg is None:
            # An unregistered process: nothing reports a save, so only the dump is certain.
            return None
        return await self._poll_registration(rid, t, since, give_up)

    async def _follow(
        self, rid: int, t: Target, request_id: str, deadline: Callable[[], float], give_up: Callable[[], float]
    ) -> tuple[Path, dict[str, Any]] | None:
        assert t.socket
        async with await registry.SaveChannel.open(t.socket) as chan:
            await chan.send("save", id=request_id, reason="power", deadline=deadline(), after=self.s.after_save)
            last_progress = time.monotonic()
            state = "sent"  # every state the run reports is journaled, the first one too
            while True:
                remaining = give_up() - time.time()
                quiet = self.s.hang_after - (time.monotonic() - last_progress)
                if remaining <= 0:
                    self.ledger.step(rid, t.key, t.pid, "too_late", state=state)
                    self.say(events.CHECKPOINT_LATE, t, f"{t.name}: no checkpoint before the deadline ({state})")
                    return None
                if quiet <= 0:
                    self.ledger.step(rid, t.key, t.pid, "hung", state=state, quiet_s=self.s.hang_after)
                    self.say(
                        events.CHECKPOINT_HUNG,
                        t,
                        f"{t.name}: save {state}, no progress for {self.s.hang_after:.0f}s",
                    )
                    return None
                msg = await chan.next(timeout=min(remaining, quiet))
                if msg is None:
                    continue
                last_progress = time.monotonic()
                new = msg.get("state", state)
                self.live[t.key] = {"name": t.name, **msg, "state": new, "at": time.time()}
                if new != state:
                    self.ledger.step(rid, t.key, t.pid, new, **{k: v for k, v in msg.items() if k != "state"})
                    state = new
                if state == "done":
                    return Path(msg["dir"]), msg
                if state == "failed":
                    self.say(events.CHECKPOINT_FAILED, t, f"{t.name}: checkpoint failed: {msg.get('error')}")
                    return None
                if state == "unknown":
                    raise ConnectionError("the training process does not know the request")

    async def _poll_registration(
        self, rid: int, t: Target, since: float, give_up: Callable[[], float]
    ) -> tuple[Path, dict[str, Any]] | None:
        # After a signal the only report is the registration file's last_save (newer than `since`).
        path = registry.registration_path(registry_dir(self.s), t.reg.name, t.reg.rank) if t.reg else None
        while time.time() < give_up():
            if not registry.pid_alive(t.pid):
                self.ledger.step(rid, t.key, t.pid, "lost", error="the process exited before saving")
                return None
            try:
                reg = registry.Registration.from_json(path.read_text()) if path else None
            except (OSError, ValueError):
                reg = None
            if reg and reg.last_save and reg.last_save.at >= since:
                info = {"seconds": reg.last_save.seconds, "step": reg.last_save.step}
                self.ledger.step(rid, t.key, t.pid, "done", dir=reg.last_save.directory, **info)
                return Path(reg.last_save.directory), info
            await asyncio.sleep(0.2)
        self.ledger.step(rid, t.key, t.pid, "too_late", state="signalled")
        self.say(events.CHECKPOINT_LATE, t, f"{t.name}: no checkpoint after the signal before the deadline")
        return None
