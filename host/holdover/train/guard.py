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

When the loop cannot reach the next boundary (its ranks stuck in a collective because the link
between the nodes died, or a hung data loader), a watchdog thread saves instead, without any
collective, but only while the model and optimizer still hold the last completed step: between
`step_end` and the next ``optimizer.step()`` (a pre-hook marks it), which is where a rank blocked in
a gradient all-reduce sits. Inside an update it refuses and says why. It serves a request that
waited out `boundary_wait_s` (and three typical steps), and on its own saves once when no step has
ended for `stall_save_s` (and ten typical steps): shorter than the framework's collective timeout,
so the checkpoint exists before the job is torn down.

Periodic saves run behind the loop: the state is copied into a snapshot buffer and written by a
thread. The copy of the parameters and the optimizer's state is overlapped with the next forward
and backward pass, which do not change them (CheckFreq's pipelined snapshot, FAST '21): the same
pre-hook makes the next ``optimizer.step()`` wait until it is done, so the loop pays only what the
copy outlasts the pass. Everything else a forward pass may change (buffers such as BatchNorm's
running statistics, parameters that are not this optimizer's) is copied at the boundary.
``overlap=False`` copies it all there, for a loop that changes parameters outside the
optimizer's step.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal as _signal
import socket
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from holdover.train import ckpt, job, memory, registry
from holdover.train.say import Log, stderr
from holdover.train.schedule import AdaptiveInterval, GradNormHistogram, drift, warmup_factor

# Left free after a snapshot buffer is made: what the loop's own allocations (a batch, activations
# on a CPU run) may still take. A snapshot that would eat into it is not made: an OOM kill of the
# run by its own checkpointing is the worst outcome there is.
SNAPSHOT_HEADROOM = 1 << 30


# (step, the caller's extras) -> (the shards to write, the training state as JSON-able data)
Capture = Callable[[int, "dict[str, Any] | None"], "tuple[list[ckpt.Shard], dict[str, Any]]"]


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
        self.rank, self.world = _dist_rank_world()
        root = Path(ckpt_dir).resolve()
        self.root = root / f"rank{self.rank}" if self.world > 1 else root
        self.job_root = root  # a job of several ranks keeps its done and complete records here (train.job)
        self.registry = Path(registry_dir) if registry_dir else registry.default_registry()
        self.signum = signal
        self.keep = keep
        self.threads = threads
        self.shard_bytes = shard_bytes
        self.log = log
        if isinstance(interval, int):
            interval = AdaptiveInterval(initial=interval, min_steps=interval, max_steps=interval)
        self.interval = interval
        self.warmup_steps = warmup_steps
        self.drift_check_steps = drift_check_steps
        self.grad_norms = GradNormHistogram()
        self.warnings: list[str] = []
        self.last_loss: float | None = None
        self.resumed_step: int | None = None
        self.passed_over: list[tuple[str, str]] = []  # (checkpoint, its fault): newer ones resume skipped
        self.extra: dict[str, Any] = {}  # the resumed checkpoint's user extras (data position etc.)
        self._stored_norms: dict[str, Any] | None = None
        self._after_resume: list[float] = []
        self._signalled = False
        self._stop = False
        self._cv = threading.Condition()
        self._requests: dict[str, dict[str, Any]] = {}
        self._queue: list[str] = []
        self._last_step_end: float | None = None
        self._steps_since_resume = 0
        self._hooks: list[Any] = []
        self._server: registry.RunServer | None = None
        self._prev_handler: Any = None
        # The boundary: which step the model and optimizer hold (None while an update changes
        # them), with that step's extras and RNGs; every save and every update holds _lock.
        self._lock = threading.RLock()
        self._at: int | None = None
        self._at_extra: dict[str, Any] | None = None
        self._at_rng: Any = None
        self._last: tuple[int, Path, ckpt.Manifest] | None = None  # the newest checkpoint written or loaded
        self._done: dict[str, Any] | None = None  # this rank's newest done record (train.job)
        self._step_times: deque[float] = deque(maxlen=32)
        self._marked = time.monotonic()
        self._stall_saved: int | None = None
        self._refused: float | None = None
        self._closed = threading.Event()
        self._watchdog: threading.Thread | None = None
        if stall_save_s is None:
            stall_save_s = float(os.environ.get("HOLDOVER_STALL_SAVE_S", 60.0 if self.world > 1 else 0.0))
        self.stall_save_s = stall_save_s
        self.boundary_wait_s = boundary_wait_s
        # With a bridge on every node, one cut reaches the ranks as several requests some ms
        # apart: the first that reaches this rank this soon after an emergency save the ranks
        # agreed on for another rank's request is the same cut, answered by that save (one save
        # per cut). Only the first: a bridge asks each rank once a cut, so a second request is
        # the next cut (the bench's cuts come 1.5 s apart), however soon it comes.
        self.join_window_s = join_window_s
        self._agreed: tuple[int, float] | None = None  # (step, wall time) of such a save
        # Periodic saves copy the state at the boundary and are written while training goes on;
        # the loop pays the copy (and a wait when the previous save is still writing).
        self.background = background
        self.overlap = overlap  # and the parameters' copy overlapped with the next forward pass
        # How checkpoint files are written: "direct" (O_DIRECT), "buffered", or "auto": per device,
        # the faster of the two as its first large periodic saves measured them (ckpt.iomode).
        if io not in ("auto", "direct", "buffered"):
            raise ValueError(f"io={io!r}: one of auto, direct, buffered")
        self.io = io
        self._snapshot = ckpt.Snapshot()
        self._stager: ckpt.Stager | None = None  # made on the first snapshot with a tensor on a GPU
        self._no_room: str | None = None  # why the last periodic save ran in the loop, not behind it
        self._bg: _Background | None = None
        self._bg_lock = threading.Lock()
        self._uncounted: int | None = None  # a background step whose job record waits for the next vote
        self.stalls: deque[tuple[int, float, float]] = deque(maxlen=64)  # (step, copy s, waited s)
        self.reg = registry.Registration(
            name=self.name,
            pid=os.getpid(),
            socket="",
            ckpt_dir=str(self.root),
            signal=int(signal or 0),
            argv=[sys.executable, *sys.argv],
            cwd=os.getcwd(),
            started=time.time(),
            tmux=os.environ.get("HOLDOVER_TMUX_SESSION"),
            rank=self.rank,
            world=self.world,
            job=os.environ.get("SLURM_JOB_ID"),
        )

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> Guard:
        self.registry.mkdir(parents=True, exist_ok=True)
        path = self.registry / (f"{self.name}.sock" if self.rank == 0 else f"{self.name}.rank{self.rank}.sock")
        if len(str(path).encode()) > 100:  # sun_path is 108 bytes on Linux
            path = Path(f"/tmp/holdover-{os.getpid()}.sock")
        self._server = registry.RunServer(path, self._handle)
        self.reg.socket = str(path)
        if self.signum:
            if threading.current_thread() is threading.main_thread():
                self._prev_handler = _signal.signal(self.signum, self._on_signal)
            else:
                sig = _signal.Signals(self.signum).name
                self.log(f"holdover: not on the main thread, so no {sig} handler; the socket still works")
        self._publish()
        if self.warmup_steps and self.optimizer is not None:
            self._install_warmup()
        # Without an optimizer to hook, the Guard cannot tell a boundary from the middle of an
        # update, so it never saves from outside the loop.
        hook = _step_pre_hook(self.optimizer, self._updating) if self.optimizer is not None else None
        if hook is not None:
            self._hooks.append(hook)
            self._watchdog = threading.Thread(target=self._watch, name="holdover-watchdog", daemon=True)
            self._watchdog.start()
        return self

    def close(self) -> None:
        self._finish_background()  # the last periodic save lands before the run ends
        if self._uncounted is not None:
            # Past the last vote: no collective is safe here (a rank may have left), so only what
            # this disk shows; the next resume records it otherwise.
            self._complete_from_disk(self._uncounted)
            self._uncounted = None
        self._snapshot.close()  # memory the size of the state
        self._closed.set()
        with self._cv:
            self._cv.notify_all()
        # Let the bridge hear how its requests ended before the process goes (after="exit").
        end = time.monotonic() + 2.0
        with self._cv:
            queued = list(self._queue)
        self._join(queued, stopping=True)  # the run stopped with its peers right after the save they answer
        with self._cv:
            open_reqs = [r for r in self._requests.values() if r["state"] not in registry.STATES_FINAL]
        for r in open_reqs:
            self._update([r["id"]], state="failed", error="the run stopped before saving")
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

    # --- requests -----------------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: Any) -> None:
        # Only a flag: the handler may run in the middle of an optimizer step.
        self._signalled = True
        if callable(self._prev_handler):
            self._prev_handler(signum, frame)

    def request(self, reason: str = "manual", rid: str | None = None, after: str = "continue") -> str:
        """Ask for a save at the next step boundary (what the socket and the signal do)."""
        rid = rid or uuid.uuid4().hex[:12]
        with self._cv:
            if rid not in self._requests:
                self._requests[rid] = {
                    "id": rid,
                    "state": "queued",
                    "reason": reason,
                    "after": after,
                    "requested": time.time(),
                }
                self._queue.append(rid)
                self._cv.notify_all()
        return rid

    def requests(self) -> dict[str, dict[str, Any]]:
        """Every request this run was asked, as it stands (what the bridge's `status` op reads)."""
        with self._cv:
            return {k: dict(v) for k, v in self._requests.items()}

    def _update(self, rids: list[str], **fields: Any) -> None:
        with self._cv:
            for rid in rids:
                self._requests[rid].update(fields)
            self._cv.notify_all()

    def _handle(self, conn: socket.socket, msg: dict[str, Any]) -> None:
        """One request from the bridge (registry.RunServer parsed it)."""
        op = msg["op"]
        if op == "status":
            reqs = self.requests()
            conn.sendall(registry.encode({"registration": json.loads(self.reg.to_json()), "requests": reqs}))
        elif op in ("save", "watch"):
            rid = str(msg.get("id") or uuid.uuid4().hex[:12])
            if op == "save":
                self.request(str(msg.get("reason", "bridge")), rid, str(msg.get("after", "continue")))
            elif rid not in self._requests:
                conn.sendall(registry.encode({"id": rid, "state": "unknown"}))
                return
            self._stream(conn, rid)
        else:
            conn.sendall(registry.encode({"error": f"unknown op {op!r}"}))

    def _stream(self, conn: socket.socket, rid: str) -> None:
        last: dict[str, Any] = {}
        while True:
            with self._cv:
                self._cv.wait_for(lambda seen=last: self._requests[rid] != seen, timeout=1.0)
                cur = dict(self._requests[rid])
            if cur == last:
                continue
            try:
                conn.sendall(registry.encode(cur))
            except OSError:
                return
            if cur["state"] in registry.STATES_FINAL:
                return
            last = cur
            if cur["state"] == "saving":
                # Progress at most ten times a second, but a final state goes out at once.
                with self._cv:
                    self._cv.wait_for(lambda: self._requests[rid]["state"] in registry.STATES_FINAL, timeout=0.1)

    # --- the loop side ------------------------------------------------------------------------------

    def step_end(
        self, step: int, loss: float | None = None, extra: dict[str, Any] | None = None, grad_norm: float | None = None
    ) -> bool:
        """Call once per step, after the optimizer step. Saves if asked to (or if a periodic save is due).

        Returns True when the run should stop (a request asked to save and exit).
        """
        now = time.monotonic()
        self._finish_background(wait=False)
        if self._watchdog is not None:
            self._mark(step, extra)
        if self._last_step_end is not None:
            self._step_times.append(now - self._last_step_end)
            if self.interval:
                self.interval.observe_step_time(now - self._last_step_end)
        if loss is not None:
            self.last_loss = float(loss)
        if grad_norm is not None:
            self.grad_norms.add(float(grad_norm))
            self._check_drift(float(grad_norm))
        self._steps_since_resume += 1
        with self._cv:
            pending = list(self._queue) if self._queue else []
        pending = self._join(pending)
        emergency = bool(pending) or self._signalled
        periodic = bool(self.interval and self.interval.due(step))
        leave = any(self._requests[r].get("after") == "exit" for r in pending)
        vote = _EXIT if emergency and leave else _EMERGENCY if emergency else _PERIODIC if periodic else 0
        decision = _agree(vote, self.world)
        if decision:
            if decision >= _EMERGENCY and not emergency:
                self._agreed = (step, time.time())
            if self._uncounted is not None:
                # Every rank is here at once (the vote): the background step is on disk or not by
                # now on each, so the job's record of it is gathered (an emergency stops it first).
                self._finish_background(cancel=decision >= _EMERGENCY)
                self._complete(self._uncounted)
                self._uncounted = None
            with self._lock:
                self._take(step, extra, pending, "emergency" if decision >= _EMERGENCY else "periodic")
            if self.world > 1:
                bg = self._bg  # read once, as in _take
                if bg is not None and bg.step == step:
                    self._uncounted = step
                else:
                    self._complete(step)
            if decision == _EXIT:
                # One rank's bridge asked the run to stop after saving: every rank stops at this
                # step, or the ones going on would wait in the next collective for the ones gone.
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
        with self._cv:
            late = [
                r
                for r in rids
                if self._requests[r]["requested"] - began <= self.join_window_s
                and (stopping or self._requests[r].get("after") != "exit")
            ][:1]
            for r in late:
                self._queue.remove(r)
        if late:
            self._agreed = None
            _step, directory, manifest = self._last
            self._done_with(late, directory, manifest, 0.0, step=step, joined=True)
        return [r for r in rids if r not in late]

    def _complete(self, step: int) -> None:
        """Every rank's done record of `step`, gathered: when all ranks have one, the step is
        complete and each rank writes the job's record of it (train.job)."""
        mine = self._done if self._done and self._done["step"] == step else None
        records = _gather(mine, self.world)
        if all(records):
            self._write_complete(step, records)
        else:
            missing = [r for r, rec in enumerate(records) if not rec]
            self.log(f"holdover: step {step} is not complete: rank(s) {missing} did not save it")

    def _complete_from_disk(self, step: int) -> None:
        records = [job.read_done(self.job_root, step, r) for r in range(self.world)]
        if all(records) and self._write_complete(step, records):
            return
        self.log(
            f"holdover: step {step} was saved as the run ended; the job's record of it is written when "
            "the ranks resume (not every rank's done record is on this disk)"
        )

    def _write_complete(self, step: int, records: list[Any]) -> bool:
        try:
            job.write_complete(self.job_root, step, self.world, records)
            return True
        except OSError as e:  # the checkpoints are safe; only the job's bookkeeping is not
            self.log(f"holdover: could not write the job's record of step {step}: {e}")
            return False

    # --- the boundary and the watchdog ----------------------------------------------------------------

    def _mark(self, step: int, extra: dict[str, Any] | None) -> None:
        from holdover.train import state

        with self._lock:
            self._at, self._at_extra, self._at_rng = step, dict(extra or {}), state.rng_state()
            self._marked = time.monotonic()

    def _updating(self, opt: Any, args: Any, kwargs: Any) -> None:
        # Waits for the snapshot's copy and for a save the watchdog is taking, then marks the
        # state as changing.
        self._await_copy()
        with self._lock:
            self._at = None

    def _await_copy(self) -> None:
        """Holds the optimizer step until an overlapped snapshot has copied what it changes; the
        wait is what the loop paid for the save, beyond the boundary's part."""
        bg = self._bg
        if bg is None or bg.copied.is_set():
            return
        t0 = time.monotonic()
        bg.copied.wait()
        waited = time.monotonic() - t0
        if self.stalls and self.stalls[-1][0] == bg.step:
            step, copy, before = self.stalls[-1]
            self.stalls[-1] = (step, round(copy + waited, 6), before)
        if self.interval:
            self.interval.paid(waited)

    def _typical_step(self) -> float:
        times = sorted(self._step_times)
        return times[len(times) // 2] if times else 0.0

    def _watch(self) -> None:
        while not self._closed.is_set():
            with self._cv:
                self._cv.wait(timeout=0.1)
                waited = [time.time() - self._requests[r]["requested"] for r in self._queue]
            stalled = time.monotonic() - self._marked
            typical = self._typical_step()
            if self._signalled:
                self._signalled = False
                self.request("signal", f"signal-{int(time.time() * 1000)}")
                waited.append(0.0)
            if waited and min(stalled, max(waited)) >= max(self.boundary_wait_s, 3 * typical):
                self._save_outside("asked")
            elif self.stall_save_s and stalled >= max(self.stall_save_s, 10 * typical):
                self._save_outside("stalled")

    def _save_outside(self, why: str) -> None:
        """A save from the watchdog thread, with no collective: the step the model and optimizer
        hold, if they hold one whole step."""
        with self._lock:
            at = self._at
            if at is None and self._last_step_end is None and self._last is None:
                return  # no step has ended yet: there is nothing to save, and nothing is wrong
            if at is None:
                if self._refused != self._marked:
                    self._refused = self._marked
                    msg = (
                        "not saving from outside the loop: it stopped inside an update (between "
                        "optimizer.step() and step_end), so the model holds no whole step"
                    )
                    self.log(f"holdover: {msg}")
                    with self._cv:
                        for rid in self._queue:
                            self._requests[rid]["waiting"] = msg
                        self._cv.notify_all()
                return
            if why == "stalled" and self._stall_saved == at:
                return
            with self._cv:
                rids = list(self._queue)
            if why == "asked" and not rids:
                return  # the loop took them meanwhile
            if why == "stalled":
                self._stall_saved = at
                self.log(f"holdover: no step has ended for {time.monotonic() - self._marked:.1f} s: saving step {at}")
            self._take(at, self._at_extra, rids, "stalled" if not rids else "emergency", rng=self._at_rng)

    def _take(self, step: int, extra: dict[str, Any] | None, rids: list[str], kind: str, rng: Any = None) -> None:
        if kind == "periodic" and self.background and self._save_background(step, extra):
            return
        bg = self._bg  # read once: the other thread (loop or watchdog) may reap it meanwhile
        if bg is not None:
            # This step's snapshot already on its way answers an emergency once durable; an older
            # one gives the disk to the emergency save.
            self._finish_background(cancel=bg.step != step)
        with self._cv:
            for rid in rids:
                self._queue.remove(rid)
        if self._signalled:
            self._signalled = False
            rid = f"signal-{int(time.time() * 1000)}"
            self.request("signal", rid)
            with self._cv:
                self._queue.remove(rid)
            rids.append(rid)
        reasons = sorted({self._requests[r]["reason"] for r in rids}) or [kind]
        if self._last and self._last[0] == step:
            # Already on disk (the watchdog saved this step, or the run resumed from it): the
            # loop reaching the boundary later must not write it twice.
            _step, directory, manifest = self._last
            if kind in ("emergency", "stalled"):
                ckpt.pin(directory, ",".join(reasons))
            self._done_with(rids, directory, manifest, 0.0, step=step)
            return
        self._update(rids, state="saving", step=step, started=time.time())
        t0 = time.monotonic()

        def progress(done: int, total: int) -> None:
            self._update(rids, bytes_done=done, bytes_total=total)

        # Asked for (by the bridge, a signal or request()): pinned, so periodic rotation keeps it.
        pin = kind in ("emergency", "stalled")
        try:
            directory, manifest = self.save(
                step, extra, reason=",".join(reasons), progress=progress, pin=pin, prune=False, rng=rng
            )
        except Exception as e:  # a failed save must not kill the run: the bridge still has gcore
            self._update(rids, state="failed", error=str(e))
            self.warnings.append(str(e))
            self.log(f"holdover: checkpoint at step {step} failed: {e}")
            return
        seconds = time.monotonic() - t0
        self._done_with(rids, directory, manifest, seconds)
        # Only now: deleting an old checkpoint (0.5 s for 4 GB) must not delay the `done` the
        # bridge is waiting for inside the battery's runtime.
        self._prune(directory)
        if self.interval:
            self.interval.saved(step, self.last_loss, seconds)

    def _done_with(
        self, rids: list[str], directory: Path, manifest: ckpt.Manifest, seconds: float, **more: Any
    ) -> None:
        """The requests answered by this checkpoint; the run stops if one asked to exit after it."""
        self._update(
            rids,
            state="done",
            dir=str(directory),
            seconds=round(seconds, 4),
            bytes_total=manifest.nbytes,
            bytes_done=manifest.nbytes,
            **more,
        )
        if any(self._requests[r].get("after") == "exit" for r in rids):
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
        `prune=False` leaves the rotation to the caller (`_prune`); `rng` the RNGs as they stood
        at the step (state.Rng), when the loop has drawn more since. A background save still
        writing is let finish first."""
        self._finish_background()
        meta = self._meta(reason)
        t0 = time.monotonic()
        direct = self._direct(probe=reason == "periodic")
        with self._lock:
            shards, blobs = self._capture(step, extra, rng)
            directory, manifest = ckpt.save(
                self.root, step, shards, meta=meta, blobs=blobs, threads=self.threads, direct=direct, progress=progress
            )
            self._last = (step, directory, manifest)
        self._learn_io(manifest, direct)
        self._saved(step, directory, manifest, time.monotonic() - t0, reason, pin, prune)
        return directory, manifest

    def _direct(self, probe: bool) -> bool:
        return self.io == "direct" or (self.io == "auto" and ckpt.iomode.direct(self.root, probe))

    def _learn_io(self, manifest: ckpt.Manifest, direct: bool) -> None:
        if self.io == "auto":
            said = ckpt.iomode.learn(self.root, manifest, direct)
            if said:
                self.log(f"holdover: {said}")

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
        if threading.current_thread() is self._watchdog:
            meta["collective_free"] = True  # saved while the loop was stuck: no rank agreed on it
        return meta

    def _capture(
        self, step: int, extra: dict[str, Any] | None, rng: Any, on_device: bool = False
    ) -> tuple[list[ckpt.Shard], dict[str, bytes]]:
        """The state as shards over its live memory, and train.json; GPU tensors copied to the
        host, or left there (`on_device`) for the snapshot to stage."""
        if self.capture is not None:
            shards, train = self.capture(step, extra)
            return list(shards), {ckpt.TRAIN_JSON: json.dumps(train).encode()}
        from holdover.train import state  # torch only when a save actually happens

        cap = state.capture(
            self.model, self.optimizer, self.scheduler, extra, step, self.shard_bytes, self.threads, rng, on_device
        )
        return cap.shards, {ckpt.TRAIN_JSON: json.dumps(cap.train).encode()}

    def _saved(
        self, step: int, directory: Path, manifest: ckpt.Manifest, seconds: float, reason: str, pin: bool, prune: bool
    ) -> None:
        """The bookkeeping of a checkpoint now on disk: the job's done record, pin, rotation, registration."""
        if self.world > 1:
            try:
                self._done = job.done_record(self.rank, step, directory)
                job.write_done(self.job_root, self._done)
            except OSError as e:  # the checkpoint itself is safe; only the job's bookkeeping is not
                self.log(f"holdover: could not record rank {self.rank}'s step {step} as done: {e}")
        if pin:
            ckpt.pin(directory, reason)
        if prune:
            self._prune(directory)
        self.reg.last_save = registry.LastSave(
            step, str(directory), manifest.nbytes, round(seconds, 4), time.time(), reason
        )
        self._publish()

    def _save_background(self, step: int, extra: dict[str, Any] | None) -> bool:
        """A periodic save: the state copied at this boundary and written by a thread while the
        loop goes on. The adaptive interval is charged what the loop paid (copy and wait). False
        when there is no memory for the copy: the caller saves in the loop instead."""
        t0 = time.monotonic()
        waited = self._finish_background()  # its snapshot buffer is the one about to be reused
        if waited >= 0.001:
            self.log(
                f"holdover: periodic save at step {step} waited {waited:.2f} s for the previous one to finish writing"
            )
        meta = self._meta("periodic")
        meta["background"] = True
        with self._lock:
            shards, blobs = self._capture(step, extra, None, on_device=True)
            if not self._room_for_snapshot(step, shards):
                return False
            if self._stager is None and any(t.device.startswith("cuda") for s in shards for t in s.tensors):
                from holdover.train.device import CudaStager  # CUDA only for a state that has it

                self._stager = CudaStager(self.log)
            try:
                shards, rest = self._snapshot.begin(shards, self.threads, self._stager, self._copied_later())
            except (MemoryError, OSError) as e:  # the buffer could not be made (mmap: ENOMEM)
                self._snapshot.close()
                self._in_loop(step, f"the snapshot buffer could not be made: {e}")
                return False
            if self._no_room is not None:
                self.log(f"holdover: periodic saves in the background again from step {step}: memory for the snapshot")
                self._no_room = None
        stall = time.monotonic() - t0
        self.stalls.append((step, round(stall - waited, 6), round(waited, 6)))
        bg = _Background(step, threading.Event(), time.monotonic(), self._direct(probe=True))

        def write() -> None:
            try:
                try:
                    rest()
                finally:
                    bg.copied.set()  # or the optimizer step would wait for ever on a failed copy
                bg.result = ckpt.save(
                    self.root,
                    step,
                    shards,
                    meta=meta,
                    blobs=blobs,
                    threads=self.threads,
                    direct=bg.direct,
                    cancel=bg.cancel,
                )
            except Exception as e:  # reported on the loop's thread (_finish_background)
                bg.error = e

        bg.thread = threading.Thread(target=write, name="holdover-background-save", daemon=True)
        self._bg = bg
        bg.thread.start()
        if self.interval:
            self.interval.saved(step, self.last_loss, stall)
        return True

    def _copied_later(self) -> Callable[[ckpt.Tensor], bool] | None:
        """Which captured tensors the snapshot may copy while the next forward pass runs: the
        hooked optimizer's parameters and its state, which only its step changes."""
        groups, states = getattr(self.optimizer, "param_groups", None), getattr(self.optimizer, "state", None)
        # The watchdog runs exactly when the pre-hook on optimizer.step() is in, which the overlap needs.
        hooked = self._watchdog is not None
        if not (self.overlap and hooked and self.capture is None) or groups is None or states is None:
            return None  # a wrapper that shows neither: everything is copied at the boundary
        ptrs = {p.data_ptr() for g in groups for p in g["params"]}
        ptrs |= {v.data_ptr() for st in states.values() for v in st.values() if hasattr(v, "data_ptr")}
        ptrs.discard(0)  # an empty tensor has no memory to name
        # A tensor on a device is held as itself (keepalive); on the host, by its address.
        return lambda t: (t.address if t.device == "cpu" else t.keepalive.data_ptr()) in ptrs

    def _room_for_snapshot(self, step: int, shards: list[ckpt.Shard]) -> bool:
        """Whether a snapshot buffer for `shards` fits in memory with the headroom left."""
        need = ckpt.Snapshot.size_of(shards) - self._snapshot.nbytes
        if need <= 0:
            return True  # the buffer held already fits: no new memory
        room = memory.room()
        if need + SNAPSHOT_HEADROOM > room:
            # The old, smaller buffer too: memory is short and the loop's save does not use it.
            self._snapshot.close()
            self._in_loop(
                step,
                f"a background snapshot needs {need / 1e9:.2f} GB more and {room / 1e9:.2f} GB is free "
                f"({SNAPSHOT_HEADROOM / 1e9:.2f} GB kept for the loop)",
            )
            return False
        return True

    def _in_loop(self, step: int, why: str) -> None:
        if self._no_room is None:
            msg = f"periodic save at step {step} written in the loop (it stops training while it writes): {why}"
            self.log(f"holdover: {msg}")
            self.warnings.append(msg)
        self._no_room = why

    @property
    def writing(self) -> bool:
        """A periodic save is still being written behind the loop."""
        bg = self._bg
        return bg is not None and bg.thread is not None and bg.thread.is_alive()

    def wait_background(self) -> float:
        """Waits until a background save still writing is on disk (or failed, and logged); the
        seconds waited. `close()` and every other save do this themselves."""
        return self._finish_background()

    def _finish_background(self, cancel: bool = False, wait: bool = True) -> float:
        """Waits for the background save (or stops it: `cancel`) and does its bookkeeping on this
        thread; with `wait=False` only when it has ended. Returns the seconds waited."""
        with self._bg_lock:
            bg = self._bg
            if bg is None or bg.thread is None or (not wait and bg.thread.is_alive()):
                return 0.0
            if cancel:
                bg.cancel.set()
            t0 = time.monotonic()
            bg.thread.join()
            self._bg = None
        waited = time.monotonic() - t0
        if bg.result is not None:
            directory, manifest = bg.result
            self._learn_io(manifest, bg.direct)
            if not (self._last and self._last[0] > bg.step):
                self._last = (bg.step, directory, manifest)
            self._saved(bg.step, directory, manifest, time.monotonic() - bg.started, "periodic", False, True)
        elif bg.cancel.is_set():
            self.log(f"holdover: background save of step {bg.step} stopped for an emergency save")
        else:
            self.warnings.append(str(bg.error))
            self.log(f"holdover: background checkpoint at step {bg.step} failed: {bg.error}")
        return waited

    def _prune(self, newest: Path) -> None:
        try:
            ckpt.prune(self.root, self.keep, protect=[newest])
        except OSError as e:
            self.log(f"holdover: could not remove old checkpoints in {self.root}: {e}")

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
        if self.world > 1:
            return self._resume_together(fresh_if_damaged)
        damaged: list[tuple[Path, str]] = []
        for directory in ckpt.candidates(self.root):
            try:
                # Into the model's own tensors: a chunk found damaged halfway leaves a mix of two
                # checkpoints there, which the next candidate, loaded whole, overwrites.
                loaded = self._load(directory)
            except ckpt.CheckpointError as e:
                self.log(f"holdover: skipping damaged checkpoint {directory.name}: {e}")
                damaged.append((directory, str(e)))
                continue
            self._set_aside(damaged)
            return self._resumed(loaded, directory, damaged)
        return self._fresh(damaged, fresh_if_damaged, raise_it=bool(damaged))

    def _load(self, directory: Path) -> Any:
        from holdover.train import restore

        return restore.load_into(directory, self.model, self.optimizer, self.scheduler, self.threads, log=self.log)

    def _resumed(self, loaded: Any, directory: Path, passed_over: list[tuple[Path, str]] | None = None) -> int:
        # What the run got and why: the newest checkpoints it passed over, each with its fault.
        self.passed_over = [(d.name, why) for d, why in passed_over or []]
        self.resumed_step = loaded.step
        self._last = (int(loaded.step), directory, loaded.manifest)
        if self._watchdog is not None:
            self._mark(int(loaded.step), loaded.train.get("extra", {}))
        self.extra = loaded.train.get("extra", {})
        self._stored_norms = loaded.manifest.meta.get("grad_norm")
        self._after_resume = []
        self._steps_since_resume = 0
        if self.interval:
            self.interval.last_save_step = loaded.step
        past = "".join(f"; passed over {name}: {why}" for name, why in self.passed_over)
        self.log(f"holdover: resumed {self.name} from {directory} (step {loaded.step}){past}")
        return int(loaded.step)

    def _fresh(self, damaged: list[tuple[Path, str]], fresh_if_damaged: bool, raise_it: bool) -> int:
        if raise_it and not fresh_if_damaged:
            lines = "".join(f"\n  {d.name}: {why}" for d, why in damaged)
            raise ckpt.CheckpointError(
                f"every checkpoint in {self.root} is damaged, so the run would restart from step 0:{lines}\n"
                "resume(fresh_if_damaged=True) starts fresh (they are then set aside, not deleted)"
            )
        self._set_aside(damaged)
        self.extra = {}
        return 0

    def _resume_together(self, fresh_if_damaged: bool) -> int:
        """resume() for a rank of a job: propose the newest step this rank has verified, take the
        lowest proposal, and load it if every rank has it verified; else look below it."""
        steps: dict[int, Path] = {}
        for d in ckpt.candidates(self.root):  # newest first: a step's newest generation wins
            steps.setdefault(int(d.name.partition(".")[0][len("step_") :]), d)
        why_bad: dict[int, str] = {}
        # The step the model's tensors now hold. A step is checked by loading it (the hashes are
        # checked as it is copied in), so the step the ranks agree on, usually this rank's newest,
        # is read once, not verified and then read again. A load that failed halfway leaves a mix,
        # which the load of the agreed step overwrites in full.
        holds: dict[int, Any] = {}

        def good(step: int) -> bool:
            if step not in why_bad:
                holds.clear()
                try:
                    holds[step] = self._load(steps[step])
                    why_bad[step] = ""
                except ckpt.CheckpointError as e:
                    self.log(f"holdover: skipping damaged checkpoint {steps[step].name}: {e}")
                    why_bad[step] = str(e)
            return not why_bad[step]

        bound = 2**31 - 1
        while True:
            mine = next((n for n in sorted(steps, reverse=True) if n <= bound and good(n)), 0)
            agreed = -_agree(-mine, self.world)  # the lowest proposal
            if agreed == 0:
                break
            if -_agree(-int(agreed in steps and good(agreed)), self.world) == 1:
                damaged = [(steps[n], why) for n, why in why_bad.items() if why and n > agreed]
                self._set_aside(damaged)
                if mine > agreed:
                    self.log(f"holdover: rank {self.rank} has step {mine}, not every rank does: loading {agreed}")
                loaded = holds[agreed] if agreed in holds else self._load(steps[agreed])
                # Every rank has verified this step: a job record it may lack (saved without a
                # collective, or as the last run ended) is written now, while the ranks meet.
                try:
                    self._done = job.done_record(self.rank, agreed, steps[agreed])
                except OSError as e:
                    self.log(f"holdover: could not read step {agreed}'s manifest for the job's record: {e}")
                    self._done = None
                self._complete(agreed)
                return self._resumed(loaded, steps[agreed], damaged)
            bound = agreed - 1
        # No step every rank has: the job starts fresh, unless a rank had checkpoints and every one
        # of them is damaged, which stops every rank alike.
        damaged = [(steps[n], why) for n, why in why_bad.items() if why]
        all_bad = bool(steps) and all(why_bad.get(n) for n in steps)
        if _agree(int(all_bad), self.world) and not fresh_if_damaged:
            raise ckpt.CheckpointError(
                f"rank {self.rank}: a rank's checkpoints are all damaged ({len(damaged)} here), so the job "
                "would restart from step 0; resume(fresh_if_damaged=True) starts fresh"
            )
        return self._fresh(damaged, fresh_if_damaged, raise_it=False)

    def _set_aside(self, damaged: list[tuple[Path, str]]) -> None:
        for directory, why in damaged:
            try:
                where = ckpt.set_aside(directory, why)
                self.log(f"holdover: set aside {directory.name} as {where.name} (kept for inspection)")
            except OSError as e:
                self.log(f"holdover: could not set aside {directory}: {e}")

    def _check_drift(self, norm: float) -> None:
        if self._stored_norms is None or self.resumed_step is None:
            return
        self._after_resume.append(norm)
        if len(self._after_resume) == self.drift_check_steps:
            warning = drift(self._stored_norms, self._after_resume)
            if warning:
                self.warnings.append(warning)
                self.log(f"holdover: {warning}")

    def _install_warmup(self) -> None:
        # Scale the learning rate only for the duration of optimizer.step(), so schedulers that
        # read group["lr"] never see (and compound) the warm-up factor.
        saved: list[float] = []

        def pre(opt: Any, args: Any, kwargs: Any) -> None:
            f = warmup_factor(self._steps_since_resume, self.warmup_steps) if self.resumed_step is not None else 1.0
            saved[:] = [g["lr"] for g in opt.param_groups]
            for g in opt.param_groups:
                g["lr"] = g["lr"] * f

        def post(opt: Any, args: Any, kwargs: Any) -> None:
            for g, lr in zip(opt.param_groups, saved, strict=False):
                g["lr"] = lr

        self._hooks.append(self.optimizer.register_step_pre_hook(pre))
        self._hooks.append(self.optimizer.register_step_post_hook(post))


@dataclass
class _Background:
    """A periodic save being written by its own thread."""

    step: int
    cancel: threading.Event
    started: float
    direct: bool = True  # written with O_DIRECT (ckpt.iomode)
    copied: threading.Event = field(default_factory=threading.Event)  # the snapshot holds the whole step
    thread: threading.Thread | None = None
    result: tuple[Path, ckpt.Manifest] | None = None
    error: Exception | None = None


def protect(ckpt_dir: Path | str, name: str | None = None, **kw: Any) -> Guard:
    """Install the hook (socket, signal handler, registration) and return the started Guard."""
    return Guard(ckpt_dir, name, **kw).start()


def _dist_rank_world() -> tuple[int, int]:
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _step_pre_hook(optimizer: Any, hook: Callable[..., None]) -> Any:
    """The hook's handle on `optimizer`, or on the optimizer it wraps (accelerate's
    AcceleratedOptimizer has the method but not the hooks it needs); None when neither takes it."""
    for opt in (optimizer, getattr(optimizer, "optimizer", None)):
        try:
            return opt.register_step_pre_hook(hook)
        except (AttributeError, RuntimeError):
            continue
    return None


# What the ranks vote at a step boundary; the highest wins (_agree).
_PERIODIC, _EMERGENCY, _EXIT = 1, 2, 3


def _gather(obj: Any, world: int) -> list[Any]:
    """`obj` from every rank, in rank order."""
    import torch.distributed as dist

    out: list[Any] = [None] * world
    dist.all_gather_object(out, obj)
    return out


def _agree(value: int, world: int) -> int:
    """The maximum of `value` across ranks (identity in a single process)."""
    if world <= 1:
        return value
    import torch
    import torch.distributed as dist

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([value], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())
