"""A Reaction for a bridge beside slurmctld: when a circuit loses power (its sentinel's mains_lost,
or the host UPS on battery for a circuit it feeds), after the grace its nodes are drained, so
nothing new starts on battery, and every job with a step on them (the parts of a multi-node job
running elsewhere included) is told to checkpoint with its signal. When the power is back and has
stayed back for resume_after_s, the nodes holdover drained are resumed; a node whose reason is no
longer holdover's (an admin drained it meanwhile) stays as it is.

A job told to checkpoint is saved when every node it runs on reports, through its own bridge's
retained state (holdover/node/NODE/state, bridge/node_report.py), a verified checkpoint of the
job made since the signal, all of the same step. Then [slurm] then: run on, requeue, hold, or
suspend. A suspended job (its processes stopped, its load off the UPS) is resumed in place with the
nodes when the power is back, if it is still suspended then; a cut that outlasts the UPS takes its
nodes down, and Slurm requeues it from there as any job on a failed node (JobRequeue), to resume
from the checkpoint it just verified.

Everything it does is a host event (journaled, alerted, on the dashboard); Slurm trouble is one
too (slurm_failed) and never stops the bridge: every command runs on a thread, under a timeout.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable
from typing import Any

from holdover import events
from holdover.cluster.slurm import REASON_PREFIX, Job, Slurm, SlurmError
from holdover.firmware import protocol
from holdover.journal import Event, Journal
from holdover.settings import Settings, SlurmCircuit

log = logging.getLogger("holdover.cluster")

# What became of a saved job, by [slurm] then, in its slurm_job_saved event.
THEN = {"run": "left running", "requeue": "requeued", "hold": "requeued and held", "suspend": "suspended"}
THEN_WINDOW_S = 0.2  # the jobs saved this close together are acted on in one scontrol

CLOCK_SLACK_S = 2.0  # the nodes' clocks against this one's, when judging "made since the signal"


def _out_of_service(state: str, reason: str) -> bool:
    """Drained, draining, down or failed by someone other than holdover (sinfo's %T words)."""
    if reason.startswith(REASON_PREFIX):
        return False
    return any(w in state for w in ("drain", "down", "fail", "maint", "reboot"))


def _jobs_named(state: dict[str, Any] | None) -> set[str]:
    """The Slurm jobs a node's state names a run of."""
    runs = (state or {}).get("runs") or {}
    if not isinstance(runs, dict):
        return set()
    return {str(r["job"]) for r in runs.values() if isinstance(r, dict) and r.get("job")}


class Circuits:
    """A Reaction: Slurm's nodes follow their circuit's power."""

    retry_s = 5.0  # slurmctld down or slow during a cut: drain and list again this often until power is back

    def __init__(
        self,
        settings: Settings,
        raise_event: Callable[[str, dict[str, Any]], Event],
        slurm: Slurm | None = None,
        journal: Journal | None = None,
    ) -> None:
        """`journal`: what this bridge said before it (re)started, so that it picks up a cut still
        open, the jobs it told to checkpoint and a return of the power it did not act on."""
        self.s = settings.slurm
        self.grace = self.s.grace if self.s.grace is not None else settings.protect.grace
        self.raise_event = raise_event
        self.slurm = slurm or Slurm(self.s)
        self._pending: dict[str, asyncio.Task[None]] = {}  # circuit -> its drain or resume, waiting
        self._out: dict[str, str] = {}  # circuit -> why it is out (the reason's words), while it is
        self._in_grace: set[str] = set()  # circuits whose cut has not yet drained anything
        self.node_states: dict[str, dict[str, Any]] = {}  # node -> its bridge's last retained state
        # A node state wakes only the follows of the jobs it names, and each looks only at the nodes
        # naming its job: at every state, every follow looking through every node was about
        # jobs x nodes x messages a cut, 10^9 at 1,024 nodes (docs/scale.md).
        self._jobs_on: dict[str, set[str]] = {}  # job id -> the nodes whose last state names a run of it
        self._waiting: dict[str, set[asyncio.Event]] = {}  # job id -> its follows' wake-ups
        self._follows: set[asyncio.Task[None]] = set()
        self._said: dict[str, str] = {}  # circuit -> the Slurm failure last told (told once, not each retry)
        # Several circuits out at once: a job with steps on two of them is told and followed once,
        # and one suspended is resumed only when none of its circuits is out any more.
        self._followed: set[str] = set()  # job ids told, their follow not ended
        self._on: dict[str, set[str]] = {}  # job id -> the circuits out whose cut listed it
        self._suspended: set[str] = set()  # job ids holdover suspended, not resumed yet
        self._batches: dict[str, tuple[list[str], asyncio.Future[set[str]]]] = {}  # circuit -> jobs saved, to act on
        self.journal = journal

    # --- Reaction --------------------------------------------------------------------------------

    def start(self) -> None:
        """A bridge (re)started goes on where it was: what it did to Slurm is in Slurm (the drain
        reason is the record), what the power did and whom it told is in the journal.
        - A cut open, nothing drained yet: drained and its jobs told after what is left of the grace.
        - A cut open and drained: the jobs told are followed again until saved or timed out (not
          told a second time: a signal is a checkpoint, and the first one's may be on its way).
        - Power back, the resume not done: holdover's nodes are resumed after what is left of the
          steady time (nothing happens when none of them is drained with holdover's reason)."""
        if self.journal is None:
            return
        for c in self.s.circuits:
            try:
                power = self._last_power(c)
                lost = self._lost(c, power) if power is not None else None
                drained = self._journaled(c, events.SLURM_DRAINED, power.rx_ts) if lost else []
                ends = (events.SLURM_JOB_SAVED, events.SLURM_JOB_UNSAVED)
                ended = self._journaled(c, ends, drained[0].rx_ts) if drained else []
            except (sqlite3.Error, OSError) as e:  # the next word on its power is acted on as ever
                log.error("circuit %s: the journal cannot be read (%s): its last cut is not picked up", c.name, e)
                continue
            if power is None or lost is None:
                continue
            waited = max(0.0, time.time() - power.rx_ts)
            if not lost:
                self._from_journal(c)  # the jobs it suspended, which power back resumes
                self._replace(c, self._back(c, waited))
            elif not drained:
                log.info("circuit %s: a cut still open at start (%s): handled from here", c.name, lost)
                self._out[c.name] = lost
                self._replace(c, self._cut(c, lost, power, waited))
            else:
                self._out[c.name] = lost
                self._from_journal(c)  # its jobs, for a circuit back meanwhile not to resume one still out here
                self._follow_again(c, lost, drained[0], ended)

    def _follow_again(self, c: SlurmCircuit, lost: str, drained: Event, ended: list[Event]) -> None:
        """The jobs a drain before the restart told, less those whose end (saved, unsaved) is journaled."""
        done = {e.data.get("job") for e in ended}
        told = [j for j in drained.data.get("jobs") or [] if isinstance(j, dict) and j.get("job") not in done]
        log.info("circuit %s: drained before the restart (%s); %d job(s) still followed", c.name, lost, len(told))
        for j in told:
            count = j.get("count") if isinstance(j.get("count"), int) else 0
            job = Job(str(j["job"]), str(j.get("name", "")), str(j.get("partition", "")), str(j["nodes"]), "", count)
            self._start_follow(c, job, float(j.get("at", drained.rx_ts)))

    def _last_power(self, c: SlurmCircuit) -> Event | None:
        """The journal's newest word on a circuit's power: its sentinel's mains, or the host UPS."""
        assert self.journal is not None
        said: list[Event] = []
        if c.sentinel is not None:
            said += self.journal.events(sid=c.sentinel, kinds=(protocol.MAINS_LOST, protocol.MAINS_RESTORED), limit=1)
        if c.ups:
            said += self.journal.events(sid=protocol.NODE, kinds=(events.UPS_ON_BATTERY, events.UPS_ONLINE), limit=1)
        return max(said, key=lambda e: e.rx_ts, default=None)

    def _journaled(self, c: SlurmCircuit, kinds: str | tuple[str, ...], since: float) -> list[Event]:
        """This bridge's own events of these kinds about the circuit since `since`, newest first."""
        assert self.journal is not None
        kinds = (kinds,) if isinstance(kinds, str) else kinds
        found = self.journal.events(sid=protocol.NODE, kinds=kinds, since=since, limit=1000)
        return [e for e in found if e.data.get("circuit") == c.name]

    def on_event(self, event: Event) -> None:
        for c in self.s.circuits:
            lost = self._lost(c, event)
            if lost is None:
                continue
            if lost and c.name not in self._out:
                self._out[c.name] = lost
                self._replace(c, self._cut(c, lost, event))
            elif not lost and c.name in self._in_grace:
                del self._out[c.name]
                self._in_grace.discard(c.name)
                self._pending.pop(c.name).cancel()  # a blip: nothing was drained
            elif not lost:
                # Also when this bridge never saw the cut (restarted since, or down during it): the
                # drain reason in Slurm is the record, and _back resumes only nodes holdover drained.
                self._out.pop(c.name, None)
                self._replace(c, self._back(c, 0.0))

    def node_state(self, node: str, body: dict[str, Any]) -> None:
        """A node's bridge said what its runs are doing (holdover/node/NODE/state)."""
        before = _jobs_named(self.node_states.get(node))
        self.node_states[node] = body
        now = _jobs_named(body)
        for job in before - now:
            self._jobs_on.get(job, set()).discard(node)
        for job in now:
            self._jobs_on.setdefault(job, set()).add(node)
        for job in before | now:
            for woken in self._waiting.get(job, ()):
                woken.set()

    async def close(self) -> None:
        await events.cancel(*self._follows, *self._pending.values())  # a cancelled one takes itself out

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
            found = await asyncio.to_thread(fn, *args)
        except SlurmError as e:
            log.error("circuit %s: %s: %s", c.name, what, e)
            if self._said.get(c.name) != str(e):
                self._said[c.name] = str(e)
                self.raise_event(events.SLURM_FAILED, {"circuit": c.name, "what": what, "error": str(e)})
            return False, None
        self._said.pop(c.name, None)
        return True, found

    async def _retrying(self, c: SlurmCircuit, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """fn until Slurm answers: a cut is worth draining late rather than never. Ends with the
        task, which power back cancels."""
        while True:
            ok, found = await self._call(c, what, fn, *args)
            if ok:
                return found
            await asyncio.sleep(self.retry_s)

    async def _cut(self, c: SlurmCircuit, why: str, event: Event, waited: float = 0.0) -> None:
        self._in_grace.add(c.name)
        await asyncio.sleep(max(0.0, self.grace - waited))
        self._in_grace.discard(c.name)
        names = await self._retrying(c, f"expanding {c.nodes}", self.slurm.hostnames, c.nodes)
        reason = f"{REASON_PREFIX} {why}"
        # A node someone else took out (drained, down) keeps their reason: draining it again
        # would write ours over it, and power back would then resume it.
        states = await self._retrying(c, f"reading {c.nodes}", self.slurm.nodes, names)
        theirs = {n: states[n][1] for n in names if n in states and _out_of_service(*states[n])}
        todo = [n for n in names if n not in theirs]
        if todo:
            await self._retrying(c, f"draining {','.join(todo)}", self.slurm.drain, todo, reason)
        jobs = await self._retrying(c, f"listing the jobs on {c.nodes}", self.slurm.jobs_on, names)
        for job in jobs:
            self._on.setdefault(job.id, set()).add(c.name)
        # Told already by another circuit's cut (a job across both), or saved and suspended: not twice.
        already = sorted(j.id for j in jobs if j.id in self._followed or j.id in self._suspended)
        jobs = [j for j in jobs if j.id not in already]
        self._followed.update(j.id for j in jobs)  # before any await: a cut beside this one sees them taken
        by_signal: dict[str, list[Job]] = {}
        for job in jobs:
            by_signal.setdefault(self.s.signal_for(job.partition, job.name), []).append(job)
        told, failed = [], []
        for sig, group in by_signal.items():  # one try each: a job that ended meanwhile is told as such
            ids = [j.id for j in group]
            ok, _ = await self._call(c, f"signalling job(s) {','.join(ids)}", self.slurm.signal, ids, sig)
            at = time.time()
            reached = set(ids)
            if not ok:  # scancel told the jobs it could: those still there
                found, still = await self._call(c, "listing the jobs signalled", self.slurm.running, ids)
                reached = still if found else set()
            for job in group:
                entry = {"job": job.id, "name": job.name, "partition": job.partition, "nodes": job.nodes}
                entry |= {"signal": sig, "count": job.count}
                if job.id in reached:
                    entry["at"] = round(at, 3)  # a restarted bridge follows it from here (start)
                    self._start_follow(c, job, at)
                else:
                    self._followed.discard(job.id)
                (told if job.id in reached else failed).append(entry)
        self.raise_event(
            events.SLURM_DRAINED,
            {
                "circuit": c.name,
                "nodes": c.nodes,
                "count": len(todo),
                "kept": [{"node": n, "reason": why} for n, why in theirs.items()],
                "reason": reason,
                "jobs": told,
                "unsignalled": failed,
                "jobs_told": len(told),
                "already": already,
                "cause": event.kind,
            },
        )

    async def _back(self, c: SlurmCircuit, waited: float) -> None:
        await asyncio.sleep(max(0.0, self.s.resume_after_s - waited))
        names = await self._retrying(c, f"expanding {c.nodes}", self.slurm.hostnames, c.nodes)
        states = await self._retrying(c, f"reading {c.nodes}", self.slurm.nodes, names)
        ours = [n for n in names if states.get(n, ("", ""))[1].startswith(REASON_PREFIX)]
        kept = [{"node": n, "reason": states[n][1]} for n in names if n in states and n not in ours and states[n][1]]
        jobs, held = await self._resume_jobs(c)
        for cs in self._on.values():
            cs.discard(c.name)
        self._on = {j: cs for j, cs in self._on.items() if cs}
        if not ours and not jobs and not held:
            return  # nothing of holdover's to undo (a restart may have missed the cut)
        if ours:
            await self._retrying(c, f"resuming {','.join(ours)}", self.slurm.resume, ours)
        self.raise_event(
            events.SLURM_RESUMED,
            {
                "circuit": c.name,
                "nodes": ",".join(ours),
                "count": len(ours),
                "kept": kept,
                "jobs": jobs,
                "jobs_still_suspended": held,  # each with a step on a circuit still out
            },
        )

    async def _resume_jobs(self, c: SlurmCircuit) -> tuple[list[str], list[str]]:
        """The jobs holdover suspended with a step on this circuit and still suspended, resumed in one
        scontrol, less those with a step on a circuit still out (resumed, their load would be back on
        that UPS: they wait for its power). (resumed, still held)."""
        ids = {j for j in self._suspended if c.name in self._on.get(j, ())}
        out = set(self._out) - {c.name}
        held = sorted(j for j in ids if self._on.get(j, set()) & out)
        ids -= set(held)
        if not ids:
            return [], held
        ok, still = await self._call(c, "listing the jobs suspended", self.slurm.suspended, sorted(ids))
        self._suspended -= ids - (still or set())  # resumed or ended by someone else: not ours to resume
        if not ok or not still:
            return [], held
        ok, _ = await self._call(c, f"resuming job(s) {','.join(sorted(still))}", self.slurm.resume_jobs, sorted(still))
        if ok:
            self._suspended -= still
        return (sorted(still) if ok else []), held

    def _from_journal(self, c: SlurmCircuit) -> None:
        """At start, what a previous bridge knew: the jobs this circuit's last drain listed, and which
        of them holdover suspended (a day back at most: no UPS lasts longer), from the journal. Read
        only then: afterwards this bridge's own memory is the record, and an older cut's suspension
        must not make it resume a job someone else suspended since."""
        if self.journal is None:
            return
        try:
            drained = self._journaled(c, events.SLURM_DRAINED, 0.0)[:1]
            if not drained:
                return
            found = self.journal.events(
                sid=protocol.NODE, kinds=(events.SLURM_JOB_SAVED,), since=drained[0].rx_ts - 86400, limit=1000
            )
        except (sqlite3.Error, OSError) as e:
            log.error("circuit %s: the journal cannot be read (%s): only the jobs in memory resumed", c.name, e)
            return
        data = drained[0].data
        listed = {str(j["job"]) for j in data.get("jobs") or [] if isinstance(j, dict) and "job" in j}
        listed |= {str(j) for j in data.get("already") or []}
        for j in listed:
            self._on.setdefault(j, set()).add(c.name)
        self._suspended |= {str(e.data.get("job")) for e in found if e.data.get("then") == THEN["suspend"]} & listed

    # --- a signalled job, until every node has saved it -----------------------------------------

    def _start_follow(self, c: SlurmCircuit, job: Job, since: float) -> None:
        self._followed.add(job.id)
        follow = asyncio.get_running_loop().create_task(self._follow(c, job, since))
        self._follows.add(follow)
        follow.add_done_callback(self._follows.discard)
        follow.add_done_callback(lambda _t, j=job.id: self._followed.discard(j))

    def _saved(self, job: Job, nodes: list[str] | None, since: float) -> tuple[int | None, list[str]]:
        """The step every node of the job has a verified checkpoint of, made since `since`, or
        (None, what is missing). `nodes`: the job's, expanded; None: any job.count nodes that report it
        (no Slurm call a job while a cut is followed; the missing are named only if it ends unsaved)."""
        made_by: dict[str, int] = {}
        for n in nodes if nodes is not None else sorted(self._jobs_on.get(job.id, ())):
            state = self.node_states.get(n) or {}
            runs = [r for r in (state.get("runs") or {}).values() if isinstance(r, dict) and r.get("job") == job.id]
            made = [
                r["step"]
                for r in runs
                if r.get("step") is not None
                and isinstance(r.get("checkpoint_age_s"), int | float)
                and float(state.get("ts", 0)) - r["checkpoint_age_s"] >= since - CLOCK_SLACK_S
            ]
            if made:
                made_by[n] = max(made)
        if nodes is not None:
            missing = [n for n in nodes if n not in made_by]
        else:
            missing = [] if len(made_by) >= job.count else [f"{job.count - len(made_by)} of {job.count} node(s)"]
        steps = set(made_by.values())
        if missing or len(steps) != 1:
            return None, missing or [f"{n} (steps differ: {sorted(steps)})" for n in sorted(made_by)]
        return steps.pop(), []

    async def _then(self, c: SlurmCircuit, job: str) -> bool:
        """[slurm] then for a saved job, in one scontrol with the others of the circuit saved within
        THEN_WINDOW_S: a cut's jobs save within a second of each other, and one call a job would
        grow a cut's Slurm commands with its jobs (bench/site_scale.py). A list Slurm refuses (one
        job ended meanwhile) is tried again a job at a time, so the rest are still acted on."""
        batch = self._batches.get(c.name)
        if batch is None:
            batch = self._batches[c.name] = ([], asyncio.get_running_loop().create_future())
            act = asyncio.get_running_loop().create_task(self._act(c, *batch))
            self._follows.add(act)
            act.add_done_callback(self._follows.discard)
        batch[0].append(job)
        return job in await asyncio.shield(batch[1])

    async def _act(self, c: SlurmCircuit, jobs: list[str], done: asyncio.Future[set[str]]) -> None:
        fn = getattr(self.slurm, self.s.then)  # Slurm.requeue, .hold or .suspend
        verb = {"requeue": "requeueing", "hold": "holding", "suspend": "suspending"}[self.s.then]
        acted: set[str] = set()
        try:
            await asyncio.sleep(THEN_WINDOW_S)
            del self._batches[c.name]  # a job saved from here on is the next call's
            ok, _ = await self._call(c, f"{verb} job(s) {','.join(jobs)}", fn, jobs)
            acted = set(jobs) if ok else set()
            if not ok and len(jobs) > 1:
                for j in jobs:
                    if (await self._call(c, f"{verb} job {j}", fn, [j]))[0]:
                        acted.add(j)
        finally:
            if self._batches.get(c.name, ([],))[0] is jobs:
                del self._batches[c.name]
            if not done.done():
                done.set_result(acted)

    async def _follow(self, c: SlurmCircuit, job: Job, since: float) -> None:
        expand = f"expanding job {job.id}'s nodes {job.nodes}"
        nodes: list[str] | None = None
        if not job.count:  # taken up from an older journal entry: the nodes from Slurm, as before
            ok, nodes = await self._call(c, expand, self.slurm.hostnames, job.nodes)
            if not ok:
                return
        # From the signal, not from now: a bridge restarted since gives the job only what is left.
        deadline = time.monotonic() + self.s.save_timeout_s - max(0.0, time.time() - since)
        heard = asyncio.Event()
        self._waiting.setdefault(job.id, set()).add(heard)
        try:
            step, missing = self._saved(job, nodes, since)
            while step is None and time.monotonic() < deadline:
                heard.clear()
                await events.woken(heard, deadline - time.monotonic())
                step, missing = self._saved(job, nodes, since)
        finally:
            self._waiting[job.id].discard(heard)
            if not self._waiting[job.id]:
                del self._waiting[job.id]
        if step is None and nodes is None:  # name the nodes that never said, now that it matters
            ok, found = await self._call(c, expand, self.slurm.hostnames, job.nodes)
            if ok:
                step, missing = self._saved(job, found, since)
        data: dict[str, Any] = {"circuit": c.name, "job": job.id, "name": job.name, "nodes": job.nodes}
        if step is None:
            self.raise_event(
                events.SLURM_JOB_UNSAVED, {**data, "missing": ", ".join(missing), "timeout_s": self.s.save_timeout_s}
            )
            return
        then = THEN[self.s.then]
        ok = await self._then(c, job.id) if self.s.then != "run" else True
        if not ok:
            then = f"not {then}: Slurm refused (see slurm_failed)"
        elif self.s.then == "suspend":
            self._suspended.add(job.id)
        count = len(nodes) if nodes is not None else job.count
        self.raise_event(events.SLURM_JOB_SAVED, {**data, "step": step, "count": count, "then": then})
