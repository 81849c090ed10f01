"""A Reaction for a bridge beside slurmctld: when a circuit loses power (its sentinel's mains_lost,
or the host UPS on battery for a circuit it feeds), after the grace its nodes are drained, so
nothing new starts on battery, and every job with a step on them (the parts of a multi-node job
running elsewhere included) is told to checkpoint with its signal. When the power is back and has
stayed back for resume_after_s, the nodes holdover drained are resumed; a node whose reason is no
longer holdover's (an admin drained it meanwhile) stays as it is.

Everything it does is a host event (journaled, alerted, on the dashboard); Slurm trouble is one
too (slurm_failed) and never stops the bridge: every command runs on a thread, under a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from holdover import events
from holdover.cluster.slurm import REASON_PREFIX, Slurm, SlurmError
from holdover.firmware import protocol
from holdover.journal import Event
from holdover.settings import Settings, SlurmCircuit

log = logging.getLogger("holdover.cluster")

SLURM_DRAINED = "slurm_drained"
SLURM_RESUMED = "slurm_resumed"
SLURM_FAILED = "slurm_failed"


class Circuits:
    """A Reaction: Slurm's nodes follow their circuit's power."""

    def __init__(
        self,
        settings: Settings,
        raise_event: Callable[[str, dict[str, Any]], Event],
        slurm: Slurm | None = None,
    ) -> None:
        self.s = settings.slurm
        self.grace = self.s.grace if self.s.grace is not None else settings.protect.grace
        self.raise_event = raise_event
        self.slurm = slurm or Slurm(self.s)
        self._pending: dict[str, asyncio.Task[None]] = {}  # circuit -> its drain or resume, waiting
        self._out: dict[str, str] = {}  # circuit -> why it is out (the reason's words), while it is
        self._in_grace: set[str] = set()  # circuits whose cut has not yet drained anything

    # --- Reaction --------------------------------------------------------------------------------

    def start(self) -> None:
        pass

    def on_event(self, event: Event) -> None:
        for c in self.s.circuits:
            lost = self._lost(c, event)
            if lost is None:
                continue
            if lost and c.name not in self._out:
                self._out[c.name] = lost
                self._replace(c, self._cut(c, lost, event))
            elif not lost and c.name in self._out:
                del self._out[c.name]
                if c.name in self._in_grace:
                    self._in_grace.discard(c.name)
                    self._pending.pop(c.name).cancel()  # a blip: nothing was drained
                else:
                    # Also after a bridge restart: _back resumes only nodes whose reason is holdover's.
                    self._replace(c, self._back(c))

    async def close(self) -> None:
        for t in list(self._pending.values()):  # a cancelled one takes itself out
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t

    # --- what happens ----------------------------------------------------------------------------

    @staticmethod
    def _lost(c: SlurmCircuit, event: Event) -> str | None:
        """What this event says of the circuit's power: the words of a cut, "" for power back, or
        None when it is not about this circuit."""
        at = time.strftime("%H:%M", time.localtime(event.rx_ts))
        if c.sentinel is not None and event.sid == c.sentinel:
            if event.kind == protocol.MAINS_LOST:
                return f"mains lost at {c.sentinel} since {at}"
            if event.kind == protocol.MAINS_RESTORED:
                return ""
        if c.ups and event.sid == protocol.NODE:
            if event.kind == events.UPS_ON_BATTERY:
                return f"UPS {event.data.get('ups', '?')} on battery since {at}"
            if event.kind == events.UPS_ONLINE:
                return ""
        return None

    def _replace(self, c: SlurmCircuit, work: Any) -> None:
        # A cut cancels a resume still waiting out its steady time, and power back cancels a drain
        # still in its grace: a blip moves nothing.
        old = self._pending.pop(c.name, None)
        if old is not None:
            old.cancel()
        task = asyncio.get_running_loop().create_task(work)
        self._pending[c.name] = task
        task.add_done_callback(lambda t, name=c.name: self._done(name, t))

    def _done(self, name: str, task: asyncio.Task[None]) -> None:
        if self._pending.get(name) is task:
            del self._pending[name]
        if not task.cancelled() and task.exception() is not None:
            log.error("circuit %s", name, exc_info=task.exception())

    async def _call(self, c: SlurmCircuit, what: str, fn: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
        """(True, what fn returned), or (False, None) once the failure is told."""
        try:
            return True, await asyncio.to_thread(fn, *args)
        except SlurmError as e:
            log.error("circuit %s: %s: %s", c.name, what, e)
            self.raise_event(SLURM_FAILED, {"circuit": c.name, "what": what, "error": str(e)})
            return False, None

    async def _cut(self, c: SlurmCircuit, why: str, event: Event) -> None:
        self._in_grace.add(c.name)
        await asyncio.sleep(self.grace)
        self._in_grace.discard(c.name)
        _, names = await self._call(c, f"expanding {c.nodes}", self.slurm.hostnames, c.nodes)
        if not names:
            return
        reason = f"{REASON_PREFIX} {why}"
        drained, _ = await self._call(c, f"draining {c.nodes}", self.slurm.drain, names, reason)
        _, jobs = await self._call(c, f"listing the jobs on {c.nodes}", self.slurm.jobs_on, names)
        told, failed = [], []
        for job in jobs or []:
            sig = self.s.signal_for(job.partition, job.name)
            ok, _ = await self._call(c, f"signalling job {job.id}", self.slurm.signal, job.id, sig)
            entry = {"job": job.id, "name": job.name, "partition": job.partition, "nodes": job.nodes, "signal": sig}
            (told if ok else failed).append(entry)
        self.raise_event(
            SLURM_DRAINED,
            {
                "circuit": c.name,
                "nodes": c.nodes,
                "count": len(names),
                "drained": drained,
                "reason": reason,
                "jobs": told,
                "unsignalled": failed,
                "jobs_told": len(told),
                "cause": event.kind,
            },
        )

    async def _back(self, c: SlurmCircuit) -> None:
        await asyncio.sleep(self.s.resume_after_s)
        _, names = await self._call(c, f"expanding {c.nodes}", self.slurm.hostnames, c.nodes)
        if not names:
            return
        ok, states = await self._call(c, f"reading {c.nodes}", self.slurm.nodes, names)
        if not ok:
            return
        ours = [n for n in names if states.get(n, ("", ""))[1].startswith(REASON_PREFIX)]
        kept = [{"node": n, "reason": states[n][1]} for n in names if n in states and n not in ours and states[n][1]]
        if not ours:
            return  # nothing of holdover's to undo (a restart may have missed the cut)
        await self._call(c, f"resuming {','.join(ours)}", self.slurm.resume, ours)
        self.raise_event(
            SLURM_RESUMED,
            {"circuit": c.name, "nodes": ",".join(ours), "count": len(ours), "kept": kept},
        )
