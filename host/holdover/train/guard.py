"""The hook a training script installs: save on request at the next step boundary, resume from the newest good one.

    guard = holdover.train.protect("ckpt/", model=model, optimizer=opt, scheduler=sched)
    start = guard.resume()                  # 0 when there is nothing to resume
    for step in range(start + 1, steps + 1):
        loss = train_step(step)
        if guard.step_end(step, loss=loss.item(), extra={"data_pos": step}):
            break                           # asked to save and exit

Requests arrive on a Unix socket (from the bridge) or as a signal (SIGUSR2 by default: SIGUSR1
means "save and requeue" to Lightning under Slurm, SIGTERM belongs to the scheduler). Neither does
any work in the handler: the save happens in ``step_end``, between two steps, where the state is
consistent. Under torch.distributed the decision is all-reduced every step, so every rank saves
the same step (a rank saving alone would deadlock the others in the next collective).

When the loop cannot reach the next boundary (ranks stuck in a collective because the link
between the nodes died, a hung data loader), a watchdog saves instead, without any collective,
while the model still holds the last completed step (train/boundary.py): after `boundary_wait_s`
for a request, or `stall_save_s` without a step, before the framework's own timeout ends the job.

Periodic saves run behind the loop (train/background.py): the parameters' and the optimizer's
copy overlapped with the next forward and backward pass, which the same pre-hook holds back from
``optimizer.step()`` until it is done. Everything else a forward pass may change (buffers such as
BatchNorm's running statistics, parameters that are not this optimizer's) is copied at the
boundary. ``overlap=False`` copies it all there, for a loop that changes parameters outside the
optimizer's step.

The Guard composes one object per subject, each handed what it needs: the request book
(requests.py), the background saver (background.py), the ranks and the job's records (ranks.py),
and the resume (resume.py). What stays here is the boundary, the watchdog and the save itself.
"""

from __future__ import annotations

import contextlib
import os
import signal as _signal
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from holdover.train import ckpt, ranks, registry
from holdover.train.background import SNAPSHOT_HEADROOM, BackgroundSaver, copied_later
from holdover.train.boundary import Boundary, step_pre_hook
from holdover.train.ranks import EMERGENCY, EXIT, PERIODIC, JobRecords, agree
from holdover.train.requests import Requests
from holdover.train.resume import Resumer
from holdover.train.say import Log, stderr
from holdover.train.schedule import AdaptiveInterval, GradNormHistogram, LossBound
from holdover.train.writer import Capture, Writer

__all__ = ["SNAPSHOT_HEADROOM", "Guard", "protect"]


class Guard:
    def __init__(
        self,
        ckpt_dir: Path | str,
        name: str | None = None,
        *,
        model: Any = None,
        optimizer: Any = None,
        scheduler: Any = None,
        capture: Capture | None = None,
        signal: int | None = _signal.SIGUSR2,
        registry_dir: Path | str | None = None,
        keep: int = 3,
        interval: AdaptiveInterval | int | None = None,
        threads: int = ckpt.THREADS,
        shard_bytes: int | None = None,
        warmup_steps: int = 0,
        drift_check_steps: int = 20,
        stall_save_s: float | None = None,
        boundary_wait_s: float = 2.0,
        join_window_s: float = 2.0,
        background: bool = True,
        overlap: bool = True,
        io: str = "auto",
        log: Log = stderr,
    ) -> None:
        self.name = name or os.environ.get("HOLDOVER_RUN_NAME") or Path(sys.argv[0] or "train").stem or "train"
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        # Without torch: the run hands over its own buffers (shards) and JSON-able training state.
        self.capture = capture
        self.rank, self.world = ranks.rank_world()
        root = Path(ckpt_dir).resolve()
        self.root = root / f"rank{self.rank}" if self.world > 1 else root
        self.job_root = root  # a job of several ranks keeps its done and complete records here (train.job)
        self.registry = Path(registry_dir) if registry_dir else registry.default_registry()
        self.signum = signal
        self.log = log
        if isinstance(interval, int):
            interval = AdaptiveInterval(initial=interval, min_steps=interval, max_steps=interval)
        self.interval = interval
        self.warmup_steps = warmup_steps
        self.grad_norms = GradNormHistogram()
        self.warnings: list[str] = []
        self.last_loss: float | None = None
        self._stop = False
        self.bound = LossBound()  # the most a cut may take, when the bridge's plan cannot save this run in time
        self.book = Requests(lambda: self.reg.to_json(), self.bound, self._published)
        self._last_step_end: float | None = None
        self._hooks: list[Any] = []
        self._server: registry.RunServer | None = None
        self._prev_handler: Any = None
        self._lock = threading.RLock()  # every save and every update holds it
        self._last: tuple[int, Path, ckpt.Manifest] | None = None  # the newest checkpoint written or loaded
        self.records = JobRecords(self.job_root, self.rank, self.world, log)
        if stall_save_s is None:
            stall_save_s = float(os.environ.get("HOLDOVER_STALL_SAVE_S", 60.0 if self.world > 1 else 0.0))
        self.stall_save_s = stall_save_s
        self.boundary = Boundary(
            self._lock,
            self.book,
            self._take,
            lambda: self._last_step_end is not None or self._last is not None,
            lambda: self.saver.await_copy(),
            stall_save_s,
            boundary_wait_s,
            log,
        )
        # A bridge a node: one cut reaches the ranks as requests ms apart. The first to reach this rank
        # this soon after a save agreed for another rank's is that cut's (one save a cut); only the
        # first, as a bridge asks each rank once a cut: a second is the next cut.
        self.join_window_s = join_window_s
        self._agreed: tuple[int, float] | None = None  # (step, wall time) of such a save
        self.background = background  # periodic saves written behind the loop (background.py)
        self.overlap = overlap  # and the parameters' copy overlapped with the next forward pass
        # How checkpoint files are written: "direct" (O_DIRECT), "buffered", or "auto": per device,
        # the faster of the two as its first large periodic saves measured them (ckpt.iomode).
        self.writer = Writer(
            self.root,
            (model, optimizer, scheduler),
            capture,
            threads,
            shard_bytes,
            io,
            keep,
            self.records,
            self._published,
            log,
        )
        self.saver = BackgroundSaver(
            self.root,
            threads,
            self._lock,
            self.writer.capture,
            self._meta,
            self.writer.direct,
            self._landed,
            # The watchdog runs exactly when the pre-hook on optimizer.step() is in, which the overlap needs.
            lambda: copied_later(self.optimizer) if self.overlap and self.boundary.thread and not capture else None,
            self.interval,
            self.warnings.append,
            log,
        )
        self._uncounted: int | None = None  # a background step whose job record waits for the next vote
        self._quiet = False  # the registration not written until the job's record is (step_end)
        self.resumer = Resumer(
            self.name,
            self.root,
            (model, optimizer, scheduler),
            threads,
            self.records,
            self.interval,
            self._resumed,
            drift_check_steps,
            self.warnings.append,
            log,
        )
        self.reg = registry.Registration.of_this_process(self.name, self.root, int(signal or 0), self.rank, self.world)

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> Guard:
        self.registry.mkdir(parents=True, exist_ok=True)
        path = registry.socket_path(self.registry, self.name, self.rank)
        self._server = registry.RunServer(path, self.book.handle)
        self.reg.socket = str(path)
        if self.signum:
            if threading.current_thread() is threading.main_thread():
                self._prev_handler = _signal.signal(self.signum, self._on_signal)
            else:
                sig = _signal.Signals(self.signum).name
                self.log(f"holdover: not on the main thread, so no {sig} handler; the socket still works")
        self._publish()
        if self.warmup_steps and self.optimizer is not None:
            self._hooks += self.resumer.install_warmup(self.warmup_steps)
        # Without an optimizer to hook, the Guard cannot tell a boundary from the middle of an
        # update, so it never saves from outside the loop.
        hook = step_pre_hook(self.optimizer, self.boundary.updating) if self.optimizer is not None else None
        if hook is not None:
            self._hooks.append(hook)
            self.boundary.start()
        return self

    def close(self) -> None:
        self.saver.finish()  # the last periodic save lands before the run ends
        if self._uncounted is not None:
            # Past the last vote: no collective is safe here (a rank may have left), so only what
            # this disk shows; the next resume records it otherwise.
            self.records.complete_from_disk(self._uncounted)
            self._uncounted = None
        self.saver.close()
        self.boundary.stop()
        self.book.wake()
        # Let the bridge hear how its requests ended before the process goes (after="exit").
        end = time.monotonic() + 2.0
        # The run stopped with its peers right after the save they answer.
        self._join(self.book.pending(), stopping=True)
        self.book.update(self.book.unanswered(), state="failed", error="the run stopped before saving")
        if self._server:
            self._server.close(until=end)
            self._server = None
        with contextlib.suppress(OSError):
            registry.registration_path(self.registry, self.name, self.rank).unlink()
        for h in self._hooks:
            h.remove()
        if self.signum and self._prev_handler is not None:
            with contextlib.suppress(ValueError):
                _signal.signal(self.signum, self._prev_handler)

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _publish(self) -> None:
        registry.write_registration(self.registry, self.reg)

    def _published(self, last: registry.LastSave | None = None) -> None:
        """A save landed (the writer), or the bridge set a loss bound (the socket): the registration says it."""
        if last is not None:
            self.reg.last_save, self.bound.save_s = last, last.seconds
        self.reg.bound = self.bound.as_dict() if self.bound.max_loss_s is not None else None
        if not self._quiet:
            self._publish()

    # --- requests -----------------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: Any) -> None:
        # Only a flag: the handler may run in the middle of an optimizer step.
        self.book.signalled = True
        if callable(self._prev_handler):
            self._prev_handler(signum, frame)

    def request(self, reason: str = "manual", rid: str | None = None, after: str = "continue") -> str:
        """Ask for a save at the next step boundary (what the socket and the signal do)."""
        return self.book.request(reason, rid, after)

    def requests(self) -> dict[str, dict[str, Any]]:
        """Every request this run was asked, as it stands (what the bridge's `status` op reads)."""
        return self.book.copy()

    # --- the loop side ------------------------------------------------------------------------------

    def step_end(
        self, step: int, loss: float | None = None, extra: dict[str, Any] | None = None, grad_norm: float | None = None
    ) -> bool:
        """Call once per step, after the optimizer step. Saves if asked to (or if a periodic save is due).

        Returns True when the run should stop (a request asked to save and exit).
        """
        now = time.monotonic()
        self.saver.finish(wait=False)
        if self.boundary.thread is not None:
            self.boundary.mark(step, extra)
        if self._last_step_end is not None:
            self.boundary.step_times.append(now - self._last_step_end)
            self.bound.observe_step_time(now - self._last_step_end)
            if self.interval:
                self.interval.observe_step_time(now - self._last_step_end)
        if loss is not None:
            self.last_loss = float(loss)
        if grad_norm is not None:
            self.grad_norms.add(float(grad_norm))
            self.resumer.check_drift(float(grad_norm))
        self.resumer.steps_since += 1
        pending = self._join(self.book.pending())
        emergency = bool(pending) or self.book.signalled
        periodic = bool(self.interval and self.interval.due(step)) or self.bound.due(now)
        leave = self.book.asks_exit(pending)
        vote = EXIT if emergency and leave else EMERGENCY if emergency else PERIODIC if periodic else 0
        decision = agree(vote, self.world)
        if decision:
            if decision >= EMERGENCY and not emergency:
                self._agreed = (step, time.time())
            if self._uncounted is not None:
                # The vote: every rank is here, so the background step's job record is gathered now.
                self.saver.finish(cancel=decision >= EMERGENCY)
                self.records.complete(self._uncounted)
                self._uncounted = None
            # Several ranks: registered once its job record is (a bridge hearing of the save may requeue the job).
            self._quiet = self.world > 1
            with self._lock:
                self._take(step, extra, pending, "emergency" if decision >= EMERGENCY else "periodic")
            if self._quiet:
                bg = self.saver.current  # read once, as in _take
                if bg is not None and bg.step == step:
                    self._uncounted = step
                else:
                    self.records.complete(step)
                self._quiet = False
                self._publish()
            if decision == EXIT:
                # A bridge asked to stop after saving: every rank stops here, or the others wait in the next collective.
                self._stop = True
        self._last_step_end = time.monotonic()
        return self._stop

    def _join(self, rids: list[str], stopping: bool = False) -> list[str]:
        """Answers the requests in `rids` that the ranks' last agreed emergency save answers
        (see join_window_s); the rest, still to be served. One that asks the run to exit is left
        to the next vote while the run goes on: no rank may stop alone."""
        if not rids or self._agreed is None or self._last is None or self._last[0] != self._agreed[0]:
            return rids
        step, began = self._agreed
        late = self.book.joined(rids, began, self.join_window_s, stopping)
        if late:
            self._agreed = None
            _step, directory, manifest = self._last
            self._done_with(late, directory, manifest, 0.0, step=step, joined=True)
        return [r for r in rids if r not in late]

    # --- a save ---------------------------------------------------------------------------------------

    def _take(self, step: int, extra: dict[str, Any] | None, rids: list[str], kind: str, rng: Any = None) -> None:
        self.bound.taken = time.monotonic()
        if kind == "periodic" and self.background:
            stall = self.saver.save(step, extra)
            if stall is not None:
                if self.interval:
                    self.interval.saved(step, self.last_loss, stall)
                return
        bg = self.saver.current  # read once: the other thread (loop or watchdog) may reap it meanwhile
        if bg is not None:
            # This step's snapshot already on its way answers an emergency once durable; an older
            # one gives the disk to the emergency save.
            self.saver.finish(cancel=bg.step != step)
        self.book.take(rids)
        rid = self.book.from_signal()
        if rid is not None:
            self.book.take([rid])
            rids.append(rid)
        reasons = sorted({self.book.items[r]["reason"] for r in rids}) or [kind]
        if self._last and self._last[0] == step:
            # Already on disk (the watchdog saved this step, or the run resumed from it): the
            # loop reaching the boundary later must not write it twice.
            _step, directory, manifest = self._last
            if kind in ("emergency", "stalled"):
                ckpt.pin(directory, ",".join(reasons))
            self._done_with(rids, directory, manifest, 0.0, step=step)
            return
        self.book.update(rids, state="saving", step=step, started=time.time())
        t0 = time.monotonic()

        def progress(done: int, total: int) -> None:
            self.book.update(rids, bytes_done=done, bytes_total=total)

        # Asked for (by the bridge, a signal or request()): pinned, so periodic rotation keeps it.
        pin = kind in ("emergency", "stalled")
        try:
            directory, manifest = self.save(
                step, extra, reason=",".join(reasons), progress=progress, pin=pin, prune=False, rng=rng
            )
        except Exception as e:  # a failed save must not kill the run: the bridge still has gcore
            self.book.update(rids, state="failed", error=str(e))
            self.warnings.append(str(e))
            self.log(f"holdover: checkpoint at step {step} failed: {e}")
            return
        seconds = time.monotonic() - t0
        self._done_with(rids, directory, manifest, seconds)
        # Only now: deleting an old checkpoint (0.5 s for 4 GB) must not delay the `done` the
        # bridge is waiting for inside the battery's runtime.
        self.writer.prune(directory)
        if self.interval:
            self.interval.saved(step, self.last_loss, seconds)

    def _done_with(
        self, rids: list[str], directory: Path, manifest: ckpt.Manifest, seconds: float, **more: Any
    ) -> None:
        """The requests answered by this checkpoint; the run stops if one asked to exit after it."""
        self.book.update(
            rids,
            state="done",
            dir=str(directory),
            seconds=round(seconds, 4),
            bytes_total=manifest.nbytes,
            bytes_done=manifest.nbytes,
            **more,
        )
        if self.book.asks_exit(rids):
            self._stop = True

    def save(
        self,
        step: int,
        extra: dict[str, Any] | None = None,
        reason: str = "manual",
        progress: ckpt.Progress | None = None,
        pin: bool = False,
        prune: bool = True,
        rng: Any = None,
    ) -> tuple[Path, ckpt.Manifest]:
        """Write a checkpoint now (the loop must be between steps); `pin` keeps it out of rotation;
        `prune=False` leaves the rotation to the caller; `rng` the RNGs as they stood at the step
        (state.Rng), when the loop has drawn more since. A background save still writing is let
        finish first."""
        self.saver.finish()
        meta = self._meta(reason)
        t0 = time.monotonic()
        direct = self.writer.direct(probe=reason == "periodic")  # its probe's I/O outside the boundary lock
        with self._lock:
            directory, manifest = self.writer.write(step, extra, meta, progress, rng, direct)
            self._last = (step, directory, manifest)
        self.writer.learn_io(manifest, direct)
        self.writer.saved(step, directory, manifest, time.monotonic() - t0, reason, pin, prune)
        return directory, manifest

    def _meta(self, reason: str) -> dict[str, Any]:
        meta = {
            "name": self.name,
            "reason": reason,
            "loss": self.last_loss,
            "pid": os.getpid(),
            "host": os.uname().nodename,
            "rank": self.rank,
            "world": self.world,
            "grad_norm": self.grad_norms.summary(),
        }
        if threading.current_thread() is self.boundary.thread:
            meta["collective_free"] = True  # saved while the loop was stuck: no rank agreed on it
        return meta

    def _landed(self, step: int, directory: Path, manifest: ckpt.Manifest, seconds: float, direct: bool) -> None:
        """A background save is on disk (the saver calls this on the loop's thread)."""
        self.writer.learn_io(manifest, direct)
        if not (self._last and self._last[0] > step):
            self._last = (step, directory, manifest)
        self.writer.saved(step, directory, manifest, seconds, "periodic", False, True)

    @property
    def writing(self) -> bool:
        """A periodic save is still being written behind the loop."""
        return self.saver.writing

    @property
    def stalls(self) -> deque[tuple[int, float, float]]:
        """(step, the copy's seconds, the seconds waited for the previous save) of each background save."""
        return self.saver.stalls

    def wait_background(self) -> float:
        """Waits until a background save still writing is on disk (or failed, and logged); the
        seconds waited. `close()` and every other save do this themselves."""
        return self.saver.finish()

    # --- resume ---------------------------------------------------------------------------------------

    def resume(self, fresh_if_damaged: bool = False) -> int:
        """Load the newest checkpoint that verifies into model/optimizer/scheduler/RNG; returns its
        step (0 when there is no checkpoint at all).

        Damaged checkpoints newer than the one loaded are set aside (``damaged-step_…``, kept, never
        counted by `keep`) with a message naming the file. When there are checkpoints and every one
        is damaged, raises CheckpointError naming each and why, and moves nothing: starting again
        from step 0 is the caller's choice (`fresh_if_damaged=True`), never a silent one.

        In a job of several ranks, every rank loads the same step: the newest that verifies on all
        of them (a newer step that only some ranks saved, or that is damaged on one, is passed over
        by all), agreed through the process group; the all-damaged rule then holds for the job.
        """
        return self.resumer.resume(fresh_if_damaged)

    def _resumed(self, step: int, directory: Path, manifest: ckpt.Manifest, extra: dict[str, Any]) -> None:
        self._last = (step, directory, manifest)
        if self.boundary.thread is not None:
            self.boundary.mark(step, extra)

    @property
    def resumed_step(self) -> int | None:
        return self.resumer.resumed_step

    @property
    def passed_over(self) -> list[tuple[str, str]]:
        """(checkpoint, its fault) of each newer checkpoint the resume passed over."""
        return self.resumer.passed_over

    @property
    def extra(self) -> dict[str, Any]:
        """The resumed checkpoint's user extras (the data position and the like)."""
        return self.resumer.extra


def protect(ckpt_dir: Path | str, name: str | None = None, **kw: Any) -> Guard:
    """Install the hook (socket, signal handler, registration) and return the started Guard."""
    return Guard(ckpt_dir, name, **kw).start()
