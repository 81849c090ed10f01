"""Hook commands run on events, as NUT's NOTIFYCMD: the event goes in environment variables.

Each run is its own task in its own process group, so a hook that hangs is killed after
its timeout (with anything it spawned) and never delays the next event.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable

from holdover import proc
from holdover.journal import Event, Journal
from holdover.settings import HookSettings

log = logging.getLogger("holdover.bridge.hooks")


class HookRunner:
    def __init__(self, hooks: list[HookSettings], journal: Journal, on_done: Callable[[dict], None] | None = None):
        self.hooks = hooks
        self.journal = journal
        self.on_done = on_done
        self._tasks: set[asyncio.Task] = set()

    # --- the bridge's Reaction interface ---

    def start(self) -> None:
        # A hook whose program is missing would only fail at the first outage: said at start.
        for hook in self.hooks:
            problem = proc.missing_program(hook.run)
            if problem:
                log.error(
                    "hook for %s cannot run: %s (it would fail at its first event)", ",".join(hook.events), problem
                )

    def on_event(self, event: Event) -> None:
        self.dispatch(event)

    async def close(self) -> None:
        await self.drain()

    def dispatch(self, event: Event) -> int:
        n = 0
        for hook in self.hooks:
            if hook.matches(event.kind, event.sid):
                t = asyncio.create_task(self._run(hook, event))
                self._tasks.add(t)
                t.add_done_callback(self._tasks.discard)
                n += 1
        return n

    async def drain(self) -> None:
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _run(self, hook: HookSettings, event: Event) -> None:
        env = {
            "HOLDOVER_EVENT": event.kind,
            "HOLDOVER_SENTINEL": event.sid,
            "HOLDOVER_PAYLOAD": json.dumps(event.body),
            "HOLDOVER_SEQ": str(event.seq),
            "HOLDOVER_BOOT": event.boot,
        }
        started = time.time()
        log.info("hook starting for %s/%s seq %d: %s", event.sid, event.kind, event.seq, hook.run)
        r = await proc.run(hook.run, timeout=hook.timeout, env=env)
        if r.outcome == "not_started":
            self._record(event, hook, started, "failed", None, f"cannot start: {r.output}")
        else:
            self._record(event, hook, started, r.outcome, r.rc, r.output)

    def _record(self, event: Event, hook: HookSettings, started: float, outcome: str, rc: int | None, out: str) -> None:
        ended = time.time()
        level = logging.INFO if outcome == "ok" else logging.WARNING
        log.log(
            level,
            "hook %s for %s/%s after %.2fs (rc=%s): %s",
            outcome,
            event.sid,
            event.kind,
            ended - started,
            rc,
            hook.run,
        )
        with self.journal.guard(f"recording hook {hook.run}"):
            self.journal.hook_run(event.id, hook.run, started, ended, outcome, rc, out)
        if self.on_done:
            self.on_done(
                {"event": event.kind, "sid": event.sid, "hook": hook.run, "outcome": outcome, "rc": rc, "output": out}
            )
