"""When to take periodic checkpoints, and the checks around a resume (no torch import here).

AdaptiveInterval saves more often while the loss moves and less often while it is flat, inside
CheckFreq's bound: the time spent checkpointing never exceeds a configured share of training
time, whatever the loss does. LossBound saves by the clock, as often as keeping a cut's loss under
a bound takes, for a run whose emergency save cannot fit the UPS. GradNormHistogram keeps the recent
gradient norms so the first steps after a resume can be compared with the run before the outage.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass
class AdaptiveInterval:
    """Steps between periodic checkpoints.

    After each checkpoint, compare the loss with the loss at the previous one: a relative change
    below `flat` for `patience` intervals in a row doubles the interval (up to `max_steps`), a
    change above `flat` halves it (down to `min_steps`). Then the overhead bound: with a save
    costing C seconds and a step T seconds, the interval is at least C / (max_overhead * T).
    """

    initial: int = 500
    min_steps: int = 50
    max_steps: int = 20000
    flat: float = 0.01
    patience: int = 3
    max_overhead: float = 0.05
    interval: int = 0
    last_save_step: int = 0
    _last_loss: float | None = None
    _flat_count: int = 0
    _save_cost: float = 0.0
    _step_time: float = 0.0
    history: list[tuple[int, int, str]] = field(default_factory=list)  # (step, new interval, why)

    def __post_init__(self) -> None:
        if not 0 < self.min_steps <= self.initial <= self.max_steps:
            raise ValueError("AdaptiveInterval needs 0 < min_steps <= initial <= max_steps")
        if not 0 < self.max_overhead < 1:
            raise ValueError("AdaptiveInterval.max_overhead must be a fraction between 0 and 1")
        self.interval = self.interval or self.initial

    def due(self, step: int) -> bool:
        return step - self.last_save_step >= self.interval

    def observe_step_time(self, seconds: float) -> None:
        # Exponential average: one slow step (eval, data stall) should not move the bound much.
        self._step_time = seconds if not self._step_time else 0.9 * self._step_time + 0.1 * seconds

    def saved(self, step: int, loss: float | None, cost_seconds: float) -> int:
        self.last_save_step = step
        self._save_cost = cost_seconds
        why = "kept"
        new = self.interval
        if loss is not None and math.isfinite(loss):
            if self._last_loss is not None:
                change = abs(loss - self._last_loss) / max(abs(self._last_loss), 1e-12)
                if change < self.flat:
                    self._flat_count += 1
                    if self._flat_count >= self.patience:
                        new, why, self._flat_count = min(self.interval * 2, self.max_steps), "loss flat", 0
                else:
                    self._flat_count = 0
                    new, why = max(self.interval // 2, self.min_steps), "loss moving"
            self._last_loss = loss
        new, why = self._bounded(new, why)
        if new != self.interval:
            self.history.append((step, new, why))
        self.interval = new
        return new

    def paid(self, seconds: float) -> None:
        """More cost of the last save, known only after `saved` (an overlapped snapshot's wait at
        the next optimizer step): the overhead bound holds for the whole."""
        self._save_cost += seconds
        new, why = self._bounded(self.interval, "")
        if new != self.interval:
            self.history.append((self.last_save_step, new, why))
            self.interval = new

    def _bounded(self, new: int, why: str) -> tuple[int, str]:
        if self._step_time > 0 and self._save_cost > 0:
            floor = math.ceil(self._save_cost / (self.max_overhead * self._step_time))
            if new < floor:
                return min(floor, self.max_steps), f"overhead bound ({self.max_overhead:.0%})"
        return new, why

    def overhead(self) -> float:
        """Share of training time spent saving at the current interval."""
        if not self._step_time:
            return 0.0
        return self._save_cost / (self._save_cost + self.interval * self._step_time)


@dataclass
class LossBound:
    """The most of a run a cut may take, set by the bridge when its rescue plan cannot save the run
    in the UPS's runtime (node/cadence.py); None: no bound, the run's own interval decides.

    A cut loses the time since the state of the newest checkpoint on disk. With saves started
    `every` apart at step boundaries, that is largest just before one lands: every, plus up to a
    step, plus the save. So a save is due (bound - save - step) after the state the last one took,
    and never sooner than the last one took to write (the next would only wait for it).
    """

    max_loss_s: float | None = None
    taken: float = field(default_factory=time.monotonic)  # when the newest save's state was taken (or the start)
    save_s: float = 0.0  # the newest save's time, its state taken to on disk
    step_s: float = 0.0

    def observe_step_time(self, seconds: float) -> None:
        # A slow step counts at once and a fast one slowly: the bound errs towards saving early.
        self.step_s = max(seconds, 0.9 * self.step_s + 0.1 * seconds)

    def every_s(self) -> float | None:
        if self.max_loss_s is None:
            return None
        return max(self.max_loss_s - self.save_s - self.step_s, self.save_s)

    def meets(self) -> bool:
        """Whether saves so spaced keep the loss under the bound (not when a save takes too long)."""
        return self.max_loss_s is None or self.max_loss_s - self.save_s - self.step_s >= self.save_s

    def due(self, now: float) -> bool:
        every = self.every_s()
        return every is not None and now - self.taken >= every

    def as_dict(self) -> dict[str, Any]:
        """What the run answers the bridge and publishes in its registration."""
        every = self.every_s()
        return {
            "max_loss_s": self.max_loss_s,
            "every_s": None if every is None else round(every, 3),
            "save_s": round(self.save_s, 3),
            "step_s": round(self.step_s, 4),
            "meets": self.meets(),
        }


class GradNormHistogram:
    """Recent gradient norms, as a histogram of log10 values, for a drift check after resume."""

    BINS = 32
    LO, HI = -8.0, 8.0  # log10 range; values outside fall into the end bins

    def __init__(self, window: int = 512) -> None:
        self.values: deque[float] = deque(maxlen=window)

    def add(self, norm: float) -> None:
        if math.isfinite(norm) and norm > 0:
            self.values.append(math.log10(norm))

    def summary(self) -> dict[str, Any] | None:
        if len(self.values) < 8:
            return None
        s = sorted(self.values)
        counts = [0] * self.BINS
        width = (self.HI - self.LO) / self.BINS
        for v in s:
            counts[min(self.BINS - 1, max(0, int((v - self.LO) / width)))] += 1
        q = lambda f: s[min(len(s) - 1, int(f * len(s)))]  # noqa: E731
        return {
            "log10": {"lo": self.LO, "hi": self.HI, "counts": counts},
            "p05": q(0.05),
            "p50": q(0.5),
            "p95": q(0.95),
            "n": len(s),
        }


def drift(stored: dict[str, Any], after: list[float], tolerance: float = 0.5) -> str | None:
    """A warning if the median log10 grad norm after resume lies outside the stored p05..p95 by more
    than `tolerance` decades, else None. `after` holds raw norms of the first steps after resume."""
    logs = sorted(math.log10(n) for n in after if math.isfinite(n) and n > 0)
    if not logs:
        return "gradient norms after resume are not finite"
    med = logs[len(logs) // 2]
    lo, hi = stored["p05"] - tolerance, stored["p95"] + tolerance
    if lo <= med <= hi:
        return None
    return (
        f"gradient norms drifted after resume: median {10**med:.3g} over {len(logs)} steps, "
        f"the run before the checkpoint had p05..p95 {10 ** stored['p05']:.3g}..{10 ** stored['p95']:.3g}"
    )


def warmup_factor(steps_since_resume: int, warmup_steps: int) -> float:
    """Linear learning-rate ramp over the first steps after a resume (1.0 once past it)."""
    if warmup_steps <= 0 or steps_since_resume >= warmup_steps:
        return 1.0
    return (steps_since_resume + 1) / (warmup_steps + 1)
