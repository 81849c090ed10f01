"""The emergency policy: on battery, get every training run a verified checkpoint inside the UPS runtime.

Timeline of one rescue (all of it journaled, step by step):

  mains_lost (a sentinel) or ups_on_battery (the host's UPS), whichever comes first
      ── grace (upssched-like; mains_restored / ups_online inside it cancels) ──> rescue starts
  ups_low_battery ──────────────────────────────────────────────────────────> rescue starts at once
  the plan (node/plan.py): the runs whose measured saves fit before the deadline, admitted on each
  disk while their rates stay under its ceiling ([protect] disk_mb_s; unknown: all at once), most
  compute kept per second first, the disks side by side; beside them at once, what
  the plan cannot weigh (runs never measured, processes matched without a registration)
  for each target, in that order:
      ask to save (node/save_ask.py: the socket; the signal if it is unreachable) ─> follow progress
      ─> verify every hash of the new manifest ─> done
      no answer, hung (no progress for hang_after), failed, or too late for the deadline
      ─> gcore into the rescue directory, copy configured /dev/shm files, each hashed
  all targets settled and the UPS at low battery ─> the final command (NUT's SHUTDOWNCMD)

The deadline is the host UPS's runtime left minus a margin (node/ups.py), re-read every second
while saving so a runtime that drops faster than expected pulls it in; with no UPS runtime known
it is protect.runtime_default, and every message that uses it says it is a guess. The sentinel's
own battery never sets it. A save whose measured time says it cannot finish before the deadline
as it stands then is never started (a torn save takes bandwidth the others need): that run keeps
its last periodic checkpoint, and gets its gcore and /dev/shm copy once the planned saves are over.
With a guessed runtime nothing is left out, only put last. A cut both sources see runs one
rescue. A target's save is abandoned early enough to leave the gcore its measured time. A
restarted bridge picks up active rescues from the journal: a save request carries an id and the
training side treats a repeated id as "watch", so a restart never makes a run save twice, and a
signal already sent is never sent again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from holdover import events, proc
from holdover.events import duration
from holdover.firmware import protocol
from holdover.journal import Event, Journal
from holdover.node import dump, plan
from holdover.node.rescue_ledger import RescueLedger
from holdover.node.save_ask import Asker
from holdover.node.shed import Shedder, nvml
from holdover.node.targets import Target, discover
from holdover.node.ups import Runtime, runtime_from
from holdover.settings import ProtectSettings, UpsSettings
from holdover.train import ckpt, registry

log = logging.getLogger("holdover.node.rescue")


GRACE_KINDS = (protocol.MAINS_LOST, events.UPS_ON_BATTERY)  # power is gone: a blip is ridden out first
BACK_KINDS = (protocol.MAINS_RESTORED, events.UPS_ONLINE)


def no_runtime(default: float) -> Runtime:
    return runtime_from(UpsSettings(), None, None, default)


def raised_at(event: Event) -> float:
    """When the sentinel raised the event: an event delivered late from its offline queue has been
    using up the battery since then. The sentinel's clock is trusted only when it is plausible."""
    if event.ts is not None and 0 <= event.rx_ts - event.ts < 3600:
        return float(event.ts)
    return event.rx_ts


class Rescuer:
    def __init__(
        self,
        settings: ProtectSettings,
        journal: Journal,
        react: Callable[[Event], None] | None = None,
        runtime: Callable[[float], Runtime] = no_runtime,
    ) -> None:
        self.s = settings
        self.runtime = runtime  # the host UPS's runtime left now, and where it comes from (node/ups.py)
        self.journal = journal
        self.ledger = RescueLedger(journal)
        self.react = react  # hands the host events this raises to every reaction (alerts, hooks)
        self._grace: asyncio.Task[None] | None = None
        self._active: dict[int, asyncio.Task[None]] = {}
        self._deadline: dict[int, float] = {}
        self._critical: dict[int, bool] = {}
        self._cut_at: dict[int, float] = {}  # rescue -> when its cut was raised (not known for one resumed)
        self._outage = False  # a power loss's rescue opened, and no source has said power is back
        self.grace_until: float | None = None  # epoch s: when the grace ends and saving starts
        self.asker = Asker(settings, self.ledger, self._raise)
        self.shed = Shedder(self.ledger, nvml() if settings.shed else None)
        self._power_back = False  # said since the newest rescue opened: a run saved now is not stopped

    # --- events in ----------------------------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        if not self.s.enabled:
            return
        if event.kind in BACK_KINDS:
            self._outage = False
            self._power_back = True
            self.shed.continue_all(f"{event.kind} from {event.sid}")
            if self._grace and not self._grace.done():
                self._grace.cancel()
                self.grace_until = None
                log.info("power back within the %.0fs grace (%s): no emergency checkpoint", self.s.grace, event.kind)
            return
        if event.kind not in events.RESCUE_TRIGGERS:
            return
        critical = event.kind == events.UPS_LOW_BATTERY and event.data.get("on_battery") is not False
        if event.kind == events.UPS_LOW_BATTERY and not critical:
            # A UPS that reports LB while on line power is recharging: maintenance, not an emergency.
            log.info("UPS low battery while on line power: no emergency checkpoint")
            return
        deadline, why = self.deadline_for(event)
        if self._active:
            # Already saving: a later, worse estimate shortens the deadline; low battery arms the final command.
            for rid in self._active:
                if deadline < self._deadline[rid]:
                    self._deadline[rid] = deadline
                    self.ledger.update(rid, deadline=deadline)
                if critical and not self._critical[rid]:
                    self._critical[rid] = True
                    self.ledger.update(rid, critical=1)
            return
        if event.kind in GRACE_KINDS and self._outage:
            log.info("%s from %s: this outage's rescue already ran", event.kind, event.sid)
            return  # the other source's word on the same cut, after the rescue ended: one rescue a cut
        if event.kind in GRACE_KINDS and self.s.grace > 0:
            if not (self._grace and not self._grace.done()):
                self.grace_until = time.time() + self.s.grace
                self._grace = asyncio.get_running_loop().create_task(self._after_grace(event))
            return  # a second source's word within the grace: the same cut, one rescue
        if self._grace and not self._grace.done():
            self._grace.cancel()
        self._open(event, deadline, why, critical)

    def deadline_for(self, event: Event) -> tuple[float, str]:
        """When the saving must be over (epoch s), and what that rests on, for the log and alerts."""
        if event.kind in (events.UPS_ON_BATTERY, events.UPS_LOW_BATTERY):
            rt = event.data.get("runtime_s")
            if isinstance(rt, int | float) and rt > 0:
                return raised_at(event) + rt - self.s.margin, f"UPS {event.data.get('ups')} runtime {rt:.0f} s"
        rt = self.runtime(self.s.runtime_default)
        # A reading counts from now; the default guess from when the power went.
        return (time.time() if rt.read else raised_at(event)) + rt.seconds - self.s.margin, rt.said

    async def _after_grace(self, event: Event) -> None:
        await asyncio.sleep(self.s.grace)
        self.grace_until = None
        # The runtime now, not at the cut: the grace has used some of it.
        deadline, why = self.deadline_for(event)
        self._open(event, deadline, why, False)

    def _open(self, event: Event, deadline: float, why: str, critical: bool) -> None:
        self._outage = self._outage or event.kind in GRACE_KINDS
        self._power_back = False
        rid = self.ledger.open(event.id, event.sid, event.kind, deadline, critical)
        if rid is None:
            return  # this event already started a rescue (e.g. before a bridge restart)
        self._cut_at[rid] = raised_at(event)
        log.warning(
            "%s from %s: emergency checkpoint of every run, deadline in %.0fs (%s, less a %.0f s margin)",
            event.kind,
            event.sid,
            deadline - time.time(),
            why,
            self.s.margin,
        )
        self._start(rid, deadline, critical)

    def _start(self, rid: int, deadline: float, critical: bool) -> None:
        if not self._active:
            self.asker.live.clear()
        self._deadline[rid] = deadline
        self._critical[rid] = critical
        task = asyncio.get_running_loop().create_task(self._rescue(rid))
        self._active[rid] = task
        task.add_done_callback(lambda _t, r=rid: self._ended(r))
        follow = asyncio.get_running_loop().create_task(self._follow_runtime(rid))
        task.add_done_callback(lambda _t: follow.cancel())

    def _ended(self, rid: int) -> None:
        """What a rescue kept goes with it: a bridge runs for months, through a cut a day."""
        self._active.pop(rid, None)
        for kept in (self._deadline, self._critical, self._cut_at):
            kept.pop(rid, None)

    async def _follow_runtime(self, rid: int) -> None:
        """Re-read the UPS while saving: a runtime that falls faster than expected pulls the deadline in."""
        while True:
            await asyncio.sleep(1.0)
            self._reread(rid)

    def _reread(self, rid: int) -> None:
        if rid not in self._deadline:
            return  # the rescue ended; its follower is being cancelled
        rt = self.runtime(self.s.runtime_default)
        if not rt.read:
            return
        deadline = time.time() + rt.seconds - self.s.margin
        was = self._deadline.get(rid, deadline)
        # Out only on a read runtime, and only once runs are stopped: the time shedding bought, as
        # the UPS itself reports it (never the plan's model of it).
        out = self.shed.stopped and not rt.guess and deadline > was + self._noise(rid)
        if deadline < was - 1.0 or out:
            how = "pulled in" if deadline < was else "pushed out"
            log.warning("deadline %s by %.0f s: %s", how, abs(deadline - was), rt.said)
            self._deadline[rid] = deadline
            self.ledger.update(rid, deadline=deadline)

    def _noise(self, rid: int) -> float:
        """How much later a UPS's runtime must say the end is before the deadline moves out: past
        its readings' jitter (whole seconds, a few of them) and a tenth of what is left."""
        return min(5.0, 0.1 * max(self._deadline[rid] - time.time(), 0.0)) + 0.05

    def start(self) -> None:
        self.recover()

    def recover(self) -> int:
        """Resume the rescues a previous bridge left active; returns how many."""
        self.shed.recover()
        n = 0
        for r in self.ledger.rescues(state="active"):
            log.warning("resuming rescue %d (%s) left active by a previous bridge", r["id"], r["reason"])
            self._start(r["id"], r["deadline"], bool(r["critical"]))
            n += 1
        return n

    def in_outage(self) -> bool:
        """A cut in its grace, a rescue saving, or one that ran and the power not back yet."""
        return bool(self._active) or self.grace_until is not None or self._outage

    def view(self) -> dict[str, Any]:
        """What the rescue is doing now: the grace's end, the rescues running, each run's save."""
        return {
            "grace_until": self.grace_until if self._grace and not self._grace.done() else None,
            "active": [
                {"id": rid, "deadline": self._deadline[rid], "critical": self._critical[rid]} for rid in self._active
            ],
            "live": {k: dict(v) for k, v in self.asker.live.items()},
        }

    async def wait_idle(self) -> None:
        while self._active or (self._grace and not self._grace.done()):
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        if self._grace:
            self._grace.cancel()
        await events.cancel(*self._active.values())

    # --- one rescue -----------------------------------------------------------------------------------

    def _raise(self, kind: str, t: Target, text: str = "", **data: Any) -> None:
        """A step worth telling a person: journaled as a host event about this node, then reacted to."""
        severity = events.kind(kind).severity
        if text:
            log.log(logging.ERROR if severity == events.CRITICAL else logging.WARNING, "%s", text)
        event = self.journal.host_event(protocol.NODE, kind, {"target": t.name, "detail": text, **data})
        if self.react:
            self.react(event)

    async def _rescue(self, rid: int) -> None:
        targets, problems = discover(self.s)
        for p in problems:
            log.warning("%s", p)
        self.ledger.step(rid, "*", None, "targets", names=[t.key for t in targets], problems=problems)
        outcomes: dict[str, str] = {}
        if not self.s.plan:
            await self._together(rid, targets, outcomes)  # every run at once, as before the plan
            await self._settled(rid, outcomes)
            return
        chosen = self._plan(rid, targets)
        self.ledger.step(rid, "*", None, "plan", **chosen.as_dict())
        log.warning("rescue plan: %s", chosen.sentence())
        runs: dict[str, list[Target]] = {}
        for t in targets:
            if t.reg is not None:
                runs.setdefault(t.reg.name, []).append(t)
        lanes = [[s.run for s in lane] for lane in chosen.lanes]
        left_out = [(r, why) for r, why in chosen.cannot if r.save_s is not None]
        if (chosen.guess or self.s.shed) and left_out:
            # A guessed budget leaves nothing out: what it would, is asked after the rest. So with
            # shedding: the runs stopped once saved may stretch the UPS enough for it when its
            # turn comes (the turn's check is against the deadline as the UPS then says it).
            lanes = lanes or [[]]
            lanes[0] += [r for r, _why in left_out]
            left_out = []
        # What the plan cannot weigh goes at once, as every target did before it.
        unmeasured = [t for r, _why in chosen.cannot if r.save_s is None for t in runs[r.name]]
        at_once = [t for t in targets if t.reg is None] + unmeasured
        skipped: list[tuple[Target, str]] = []
        await asyncio.gather(
            self._together(rid, at_once, outcomes),
            *(self._lane(rid, [(r, runs[r.name]) for r in lane], chosen.guess, outcomes, skipped) for lane in lanes),
        )
        skipped += [(t, why) for r, why in left_out for t in runs[r.name]]
        for t, why in skipped:
            outcomes[t.key] = await self._skip(rid, t, why)
        await self._settled(rid, outcomes)

    async def _settled(self, rid: int, outcomes: dict[str, str]) -> None:
        if self._critical.get(rid) and self.s.final_command:
            await self._final(rid)
        self.ledger.update(rid, state="finished", finished=time.time())
        self.ledger.step(rid, "*", None, "finished", outcomes=outcomes)

    def _plan(self, rid: int, targets: list[Target]) -> plan.Plan:
        """The plan against the time to the deadline as it stands (the margin is in it already)."""
        rt = self.runtime(self.s.runtime_default)
        left = max(self._deadline[rid] - time.time(), 0.0)
        regs = [t.reg for t in targets if t.reg is not None]
        return plan.plan(plan.costs(regs), left, f"to the deadline; {rt.said}", rt.guess, 0.0, 0.0)

    async def _together(self, rid: int, targets: list[Target], outcomes: dict[str, str]) -> None:
        results = await asyncio.gather(*(self._protect(rid, t) for t in targets), return_exceptions=True)
        for t, r in zip(targets, results, strict=True):
            if isinstance(r, BaseException):
                log.error("rescue of %s failed: %r", t.key, r)
                self.ledger.step(rid, t.key, t.pid, "error", error=repr(r))
                outcomes[t.key] = "error"
            else:
                outcomes[t.key] = r
        if self.s.shed and not self._power_back:
            # A run is stopped once every rank of it here is verified: its group may hold the others.
            for name in {t.name for t in targets}:
                mine = [t for t in targets if t.name == name]
                if all(outcomes.get(t.key) == "verified" for t in mine):
                    for t in mine:
                        self.shed.stop(rid, t)

    async def _lane(
        self,
        rid: int,
        lane: list[tuple[plan.RunCost, list[Target]]],
        guess: bool,
        outcomes: dict[str, str],
        skipped: list[tuple[Target, str]],
    ) -> None:
        """One disk's runs in the plan's order, each run's ranks together, admitted while the rates
        of those saving stay under the disk's ceiling; before each start, its save against the
        deadline as it stands then (the runtime may have fallen since the plan)."""
        ceiling = self.s.disk_mb_s * 1e6 or None
        running: dict[asyncio.Task[None], float] = {}
        for cost, ranks in lane:
            while running and ceiling is not None and sum(running.values()) + cost.rate > ceiling:
                done, _pending = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    running.pop(task)
            self._reread(rid)  # the UPS as it stands now: fallen, or stretched by the runs stopped
            left = self._deadline[rid] - time.time()
            if cost.save_s is not None and not guess and cost.save_s > left:
                why = (
                    f"{duration(cost.save_s)} to save, {duration(max(left, 0.0))} left when its turn came: "
                    "its last checkpoint stands"
                )
                skipped += [(t, why) for t in ranks]
                continue
            running[asyncio.get_running_loop().create_task(self._together(rid, ranks, outcomes))] = cost.rate
        await asyncio.gather(*running)

    async def _skip(self, rid: int, t: Target, why: str) -> str:
        """A run the plan did not start: its last periodic checkpoint stands; a dump if configured."""
        if any(s["action"] in ("verified", "rescued", "lost", "skipped") for s in self.ledger.steps(rid, t.key)):
            return "skipped"  # settled before a bridge restart
        self.ledger.step(rid, t.key, t.pid, "skipped", why=why)
        self._raise(events.CHECKPOINT_SKIPPED, t, f"{t.name}: not saved: {why}")
        if self.s.gcore or self.s.shm:
            return await self._last_resort(rid, t)
        return "skipped"

    async def _protect(self, rid: int, t: Target) -> str:
        # What a previous bridge already did for this target in this rescue (empty on a first run).
        past = self.ledger.steps(rid, t.key)
        done = [s["action"] for s in past]
        for final in ("verified", "rescued", "lost"):
            if final in done:
                return final  # settled before a bridge restart
        outcome = None if past else self._saved_since_cut(rid, t)
        if outcome is None:
            if not past:
                self._raise(events.CHECKPOINT_STARTED, t, deadline_in_s=round(self._deadline[rid] - time.time()))
            reserve = dump.estimate_gcore_seconds(t.pid, self.s.gcore_rate_mb_s) if self.s.gcore else 0.0
            outcome = await self.asker.ask(rid, t, past, lambda: self._deadline[rid], reserve)
        if outcome is not None:
            directory, info = outcome
            try:
                t0 = time.monotonic()
                manifest = await asyncio.to_thread(ckpt.verify, directory)
                vs = time.monotonic() - t0
                mb_s = manifest.nbytes / max(info.get("seconds") or 1e-9, 1e-9) / 1e6
                self.ledger.step(
                    rid,
                    t.key,
                    t.pid,
                    "verified",
                    dir=str(directory),
                    step=manifest.step,
                    bytes=manifest.nbytes,
                    seconds=info.get("seconds"),
                    mb_s=round(mb_s, 1),
                    verify_seconds=round(vs, 3),
                    **({"since_cut": True} if info.get("since_cut") else {}),
                )
                log.info(
                    "%s: checkpoint %s verified (%.1f MB in %.2fs)",
                    t.key,
                    directory,
                    manifest.nbytes / 1e6,
                    info.get("seconds") or 0,
                )
                self._raise(
                    events.CHECKPOINT_VERIFIED,
                    t,
                    dir=str(directory),
                    mb=round(manifest.nbytes / 1e6, 1),
                    mb_s=round(mb_s, 1),
                    seconds=info.get("seconds"),
                )
                return "verified"
            except ckpt.CheckpointError as e:
                self.ledger.step(rid, t.key, t.pid, "verify_failed", error=str(e))
                self._raise(events.CHECKPOINT_BAD, t, f"{t.name}: the emergency checkpoint does not verify: {e}")
        return await self._last_resort(rid, t)

    def _saved_since_cut(self, rid: int, t: Target) -> tuple[Path, dict[str, Any]] | None:
        """The run's checkpoint made since the cut began (Slurm's signal to its job, a person's
        request): it answers this rescue. Asked again, the run would write the same state twice,
        and one Slurm suspended since would never answer (bench/site_scale.py found a node's bridge
        waiting 30 s on one, then calling it hung)."""
        last = t.reg.last_save if t.reg is not None else None
        cut = self._cut_at.get(rid)
        if last is None or cut is None or last.at < cut:
            return None
        log.info("%s: saved at step %d since the cut (%s): not asked again", t.key, last.step, last.reason)
        return Path(last.directory), {"seconds": last.seconds, "since_cut": True}

    async def _last_resort(self, rid: int, t: Target) -> str:
        out = self.s.rescue_dir / f"rescue-{rid}" / t.key.replace(":", "-").replace("/", "_")
        ok = False
        if self.s.gcore and registry.pid_alive(t.pid):
            timeout = max(self._deadline[rid] - time.time(), 5.0)
            self.ledger.step(rid, t.key, t.pid, "gcore_started", dir=str(out))
            r = await dump.gcore(t.pid, out, t.name, timeout)
            self.ledger.step(rid, t.key, t.pid, "gcore" if r.ok else "gcore_failed", **r.detail)
            ok |= r.ok
        if self.s.shm:
            r = await dump.copy_shm(self.s.shm, out)
            self.ledger.step(rid, t.key, t.pid, "shm_copy", **r.detail)
            ok |= bool(r.detail.get("files"))
        if ok:
            self.ledger.step(rid, t.key, t.pid, "rescued", dir=str(out))
            self._raise(events.RESCUED, t, f"{t.name}: no verified checkpoint; core/shm copy saved in {out}")
            return "rescued"
        self.ledger.step(rid, t.key, t.pid, "lost", error="no checkpoint and no dump")
        self._raise(events.LOST, t, f"{t.name}: nothing could be saved")
        return "lost"

    async def _final(self, rid: int) -> None:
        self.ledger.step(rid, "*", None, "final_command", command=self.s.final_command)
        event = self.journal.host_event(protocol.NODE, events.FINAL_COMMAND, {"command": self.s.final_command})
        if self.react:
            self.react(event)
        r = await proc.run(self.s.final_command, timeout=self.s.final_timeout, keep=2000)
        if r.outcome == "timeout":
            self.ledger.step(rid, "*", None, "final_timeout", timeout=self.s.final_timeout)
        else:
            self.ledger.step(rid, "*", None, "final_done", returncode=r.rc, output=r.output)
