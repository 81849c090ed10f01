"""The step boundary, and the watchdog that saves from outside the loop when the loop cannot
reach the next one.

The boundary is which step the model and optimizer hold: marked at `step_end`, cleared by the
pre-hook on ``optimizer.step()`` while an update changes them. The watchdog thread saves that
step, without any collective, when a request has waited out `boundary_wait_s` (and three typical
steps), or once when no step has ended for `stall_save_s` (and ten typical steps): the ranks
stuck in a collective because the link between the nodes died, or a hung data loader. Inside an
update it refuses and says why on every waiting request."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from holdover.train.requests import Requests
from holdover.train.say import Log

# (step, extras, request ids, kind, rng): save this step now, answering these requests
Take = Callable[[int, "dict[str, Any] | None", list[str], str, Any], None]


class Boundary:
    def __init__(
        self,
        lock: threading.RLock,
        book: Requests,
        take: Take,
        started: Callable[[], bool],
        await_copy: Callable[[], None],
        stall_save_s: float,
        boundary_wait_s: float,
        log: Log,
    ) -> None:
        self.lock = lock  # every save and every update holds it
        self.book = book
        self.take = take
        self.started = started  # whether a step has ended or a checkpoint been loaded
        self.await_copy = await_copy  # an overlapped snapshot's copy, which an update must wait for
        self.stall_save_s, self.boundary_wait_s = stall_save_s, boundary_wait_s
        self.log = log
        self.at: int | None = None  # the step the model and optimizer hold; None inside an update
        self.at_extra: dict[str, Any] | None = None
        self.at_rng: Any = None
        self.step_times: deque[float] = deque(maxlen=32)
        self._marked = time.monotonic()
        self._stall_saved: int | None = None
        self._refused: float | None = None
        self._closed = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._watch, name="holdover-watchdog", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self._closed.set()

    def mark(self, step: int, extra: dict[str, Any] | None) -> None:
        from holdover.train import state

        with self.lock:
            self.at, self.at_extra, self.at_rng = step, dict(extra or {}), state.rng_state()
            self._marked = time.monotonic()

    def updating(self, opt: Any, args: Any, kwargs: Any) -> None:
        """The optimizer's step pre-hook: waits for the snapshot's copy and for a save the watchdog
        is taking, then marks the state as changing."""
        self.await_copy()
        with self.lock:
            self.at = None

    def _typical_step(self) -> float:
        times = sorted(self.step_times)
        return times[len(times) // 2] if times else 0.0

    def _watch(self) -> None:
        while not self._closed.is_set():
            with self.book.cv:
                self.book.cv.wait(timeout=0.1)
                waited = [time.time() - self.book.items[r]["requested"] for r in self.book.queue]
            stalled = time.monotonic() - self._marked
            typical = self._typical_step()
            if self.book.from_signal() is not None:
                waited.append(0.0)
            if waited and min(stalled, max(waited)) >= max(self.boundary_wait_s, 3 * typical):
                self._save_outside("asked")
            elif self.stall_save_s and stalled >= max(self.stall_save_s, 10 * typical):
                self._save_outside("stalled")

    def _save_outside(self, why: str) -> None:
        """A save from the watchdog thread, with no collective: the step the model and optimizer
        hold, if they hold one whole step."""
        with self.lock:
            at = self.at
            if at is None and not self.started():
                return  # no step has ended yet: there is nothing to save, and nothing is wrong
            if at is None:
                if self._refused != self._marked:
                    self._refused = self._marked
                    msg = (
                        "not saving from outside the loop: it stopped inside an update (between "
                        "optimizer.step() and step_end), so the model holds no whole step"
                    )
                    self.log(f"holdover: {msg}")
                    self.book.update(self.book.pending(), waiting=msg)
                return
            if why == "stalled" and self._stall_saved == at:
                return
            rids = self.book.pending()
            if why == "asked" and not rids:
                return  # the loop took them meanwhile
            if why == "stalled":
                self._stall_saved = at
                self.log(f"holdover: no step has ended for {time.monotonic() - self._marked:.1f} s: saving step {at}")
            self.take(at, self.at_extra, rids, "stalled" if not rids else "emergency", self.at_rng)


def step_pre_hook(optimizer: Any, hook: Callable[..., None]) -> Any:
    """The hook's handle on `optimizer`, or on the optimizer it wraps (accelerate's
    AcceleratedOptimizer has the method but not the hooks it needs); None when neither takes it."""
    for opt in (optimizer, getattr(optimizer, "optimizer", None)):
        try:
            return opt.register_step_pre_hook(hook)
        except (AttributeError, RuntimeError):
            continue
    return None
