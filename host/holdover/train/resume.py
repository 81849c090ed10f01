"""Resume: the newest checkpoint that verifies, loaded into the model's own tensors; damaged newer
ones set aside with the reason; every rank of a job on the same step. After it, the gradient
norms of the first steps are compared with the run before the outage (drift), and the learning
rate can warm up again over `warmup_steps`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from holdover.train import ckpt
from holdover.train.ranks import JobRecords, agree
from holdover.train.say import Log
from holdover.train.schedule import AdaptiveInterval, drift, warmup_factor

# (step, directory, manifest, the caller's extras): the model now holds this checkpoint
Resumed = Callable[[int, Path, ckpt.Manifest, dict[str, Any]], None]


class Resumer:
    def __init__(
        self,
        name: str,
        root: Path,
        state: tuple[Any, Any, Any],
        threads: int,
        records: JobRecords,
        interval: AdaptiveInterval | None,
        on_resumed: Resumed,
        drift_check_steps: int,
        warn: Callable[[str], None],
        log: Log,
    ) -> None:
        self.name, self.root = name, root
        self.model, self.optimizer, self.scheduler = state
        self.threads = threads
        self.records = records
        self.rank, self.world = records.rank, records.world
        self.interval = interval
        self.on_resumed = on_resumed
        self.drift_check_steps = drift_check_steps
        self.warn, self.log = warn, log
        self.resumed_step: int | None = None
        self.passed_over: list[tuple[str, str]] = []  # (checkpoint, its fault): newer ones skipped
        self.extra: dict[str, Any] = {}  # the resumed checkpoint's user extras (data position etc.)
        self.steps_since = 0  # steps ended since the resume (or the start)
        self._stored_norms: dict[str, Any] | None = None
        self._after: list[float] = []

    def resume(self, fresh_if_damaged: bool = False) -> int:
        """Guard.resume() (its docstring says what it promises)."""
        if self.world > 1:
            return self._together(fresh_if_damaged)
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
        self.extra = loaded.train.get("extra", {})
        self.on_resumed(int(loaded.step), directory, loaded.manifest, self.extra)
        self._stored_norms = loaded.manifest.meta.get("grad_norm")
        self._after = []
        self.steps_since = 0
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

    def _together(self, fresh_if_damaged: bool) -> int:
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
            agreed = -agree(-mine, self.world)  # the lowest proposal
            if agreed == 0:
                break
            if -agree(-int(agreed in steps and good(agreed)), self.world) == 1:
                damaged = [(steps[n], why) for n, why in why_bad.items() if why and n > agreed]
                self._set_aside(damaged)
                if mine > agreed:
                    self.log(f"holdover: rank {self.rank} has step {mine}, not every rank does: loading {agreed}")
                loaded = holds[agreed] if agreed in holds else self._load(steps[agreed])
                # Every rank has verified this step: a job record it may lack (saved without a
                # collective, or as the last run ended) is written now, while the ranks meet.
                self.records.resumed(agreed, steps[agreed])
                self.records.complete(agreed)
                return self._resumed(loaded, steps[agreed], damaged)
            bound = agreed - 1
        # No step every rank has: the job starts fresh, unless a rank had checkpoints and every one
        # of them is damaged, which stops every rank alike.
        damaged = [(steps[n], why) for n, why in why_bad.items() if why]
        all_bad = bool(steps) and all(why_bad.get(n) for n in steps)
        if agree(int(all_bad), self.world) and not fresh_if_damaged:
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

    # --- after a resume ------------------------------------------------------------------------

    def check_drift(self, norm: float) -> None:
        if self._stored_norms is None or self.resumed_step is None:
            return
        self._after.append(norm)
        if len(self._after) == self.drift_check_steps:
            warning = drift(self._stored_norms, self._after)
            if warning:
                self.warn(warning)
                self.log(f"holdover: {warning}")

    def install_warmup(self, warmup_steps: int) -> list[Any]:
        """The learning rate scaled only for the duration of optimizer.step(), so schedulers that
        read group["lr"] never see (and compound) the warm-up factor; the hooks' handles."""
        saved: list[float] = []

        def pre(opt: Any, args: Any, kwargs: Any) -> None:
            f = warmup_factor(self.steps_since, warmup_steps) if self.resumed_step is not None else 1.0
            saved[:] = [g["lr"] for g in opt.param_groups]
            for g in opt.param_groups:
                g["lr"] = g["lr"] * f

        def post(opt: Any, args: Any, kwargs: Any) -> None:
            for g, lr in zip(opt.param_groups, saved, strict=False):
                g["lr"] = lr

        return [self.optimizer.register_step_pre_hook(pre), self.optimizer.register_step_post_hook(post)]
