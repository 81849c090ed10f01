"""Keeping small what a cut cannot save: each run the rescue plan leaves out saves often enough that
a cut loses at most `[protect] max_loss_min` of it.

A run whose emergency save cannot fit the UPS's runtime (alone, or beside the others on its disk)
loses at a cut everything since its newest checkpoint. Its periodic saves bound that loss: one
started at most (bound - its own save time - a step) after the state the last one took keeps the
newest whole checkpoint younger than the bound. The bridge works the plan out every EVERY_S and
tells each such run's ranks the bound over their socket ({"op": "bound"}, train/registry.py); the
Guard takes the saves itself (train/schedule.py LossBound), behind the loop like any periodic
save, because it alone knows its step and save times and it keeps the bound while the bridge is
down. A run that fits again is told to drop it. Each change is a `save_cadence` event with the
sentence `holdover doctor` also says.

From a cut (its grace included) until the power is back, every bound is lifted: a run the plan left
out would not finish a save before the deadline, and one begun by the clock would take the disk and
the UPS's time from the saves that can (a torn save is bandwidth lost). The bounds are told again
once the power is back.

The registration each rank publishes says the bound it holds, so a restarted bridge (or a restarted
run) is told again only where the two disagree.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from holdover import events
from holdover.events import duration
from holdover.node import plan
from holdover.node.targets import registry_dir
from holdover.node.ups import Runtime
from holdover.settings import ProtectSettings
from holdover.train import registry
from holdover.train.registry import Registration

log = logging.getLogger("holdover.node.cadence")

TELL_TIMEOUT_S = 2.0
RESCUING = "while the power is out"


def left_out(p: plan.Plan) -> dict[str, str]:
    """The runs the plan cannot promise to save at a cut, each with why. One never saved yet is among
    them: all since its start is at risk, and its first save by the clock measures it for the plan."""
    return {r.name: why.split(":")[0] for r, why in p.cannot}


def slowest(bounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Of a run's ranks' bounds, the one whose save takes longest: what the run as a whole keeps."""
    return max(bounds, key=lambda b: b.get("save_s") or 0.0)


def sentence(name: str, answer: dict[str, Any], why: str) -> str:
    """What a bound means for a run, from the Guard's own answer (its save and step times)."""
    bound, every, save = answer.get("max_loss_s"), answer.get("every_s"), answer.get("save_s") or 0.0
    if bound is None and why == RESCUING:
        return f"{name}: its saves by the clock wait {RESCUING}: one would not finish, and takes the others' disk"
    if bound is None:
        return f"{name} fits the rescue plan again: its periodic saves are its own again"
    head = f"{name} {why}, so it saves at least every {duration(every)}"
    if answer.get("meets"):
        return f"{head}: a cut loses at most {duration(bound)} of it ([protect] max_loss_min)"
    return (
        f"{head}, back to back: its save takes {duration(save)}, too long to keep a cut's loss under "
        f"{duration(bound)} ([protect] max_loss_min)"
    )


class Cadence:
    """A bridge reaction: the plan every EVERY_S, and each left-out run told its bound."""

    EVERY_S = 30.0

    def __init__(
        self,
        protect: ProtectSettings,
        runtime: Callable[[float], Runtime],  # the UPS's runtime now, given the default when unread
        say: Callable[[str, dict[str, Any]], Any],
        rescuing: Callable[[], bool] = lambda: False,  # a cut is on: in its grace, saving, or not over
    ) -> None:
        self.protect = protect
        self.runtime = runtime
        self.say = say
        self.rescuing = rescuing
        self._wake = asyncio.Event()
        self.bound_s = protect.max_loss_min * 60.0
        self.refused: set[tuple[int, int]] = set()  # (pid, rank): a Guard too old for "bound", asked once
        self.said: dict[str, str] = {}  # run -> the last sentence said of it
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._every())

    def on_event(self, event: events.Event) -> None:
        kind = events.kind(event.kind)
        if kind.starts_rescue or kind.resolves is not None:
            self._wake.set()  # a cut may begin or end: the bounds lifted, or told again

    async def close(self) -> None:
        await events.cancel(self._task)

    async def _every(self) -> None:
        while True:
            try:
                await self.once()
            except Exception:  # a bad registration or socket must not end the loop for the rest
                log.exception("the save cadence could not be set this round")
            if await events.woken(self._wake, self.EVERY_S):
                self._wake.clear()
                await asyncio.sleep(0.1)  # the rescue takes the event first: it sets what this reads

    async def once(self) -> dict[str, str]:
        """One round: each run told what it should hold, where its ranks hold something else; the
        sentences said this round, by run."""
        regs, _problems = registry.read_registrations(registry_dir(self.protect))
        live = [r for r in regs if r.alive()]
        out = left_out(plan.for_node(self.protect, self.runtime(self.protect.runtime_default), regs=live))
        if self.rescuing():
            out = dict.fromkeys(out, RESCUING)
        said: dict[str, str] = {}
        for reg in live:
            want = self.bound_s if reg.name in out and out[reg.name] != RESCUING else None
            held = reg.bound.get("max_loss_s") if reg.bound else None
            if held == want or (reg.pid, reg.rank) in self.refused:
                continue
            answer = await self._tell(reg, want)
            if answer is None or reg.name in said:  # one sentence a run, whichever rank answers first
                continue
            s = sentence(reg.name, answer, out.get(reg.name, ""))
            if self.said.get(reg.name) != s:
                self.said[reg.name] = said[reg.name] = s
                self.say(events.SAVE_CADENCE, {"target": reg.name, "said": s, **answer})
        return said

    async def _tell(self, reg: Registration, bound_s: float | None) -> dict[str, Any] | None:
        try:
            async with await registry.SaveChannel.open(reg.socket, TELL_TIMEOUT_S) as chan:
                await chan.send("bound", max_loss_s=bound_s)
                answer = await chan.next(TELL_TIMEOUT_S)
        except (OSError, ConnectionError, TimeoutError) as e:
            log.info("%s (rank %d): the save cadence could not be told: %s", reg.name, reg.rank, e)
            return None
        if answer is None or "error" in answer or "max_loss_s" not in answer:
            # A Guard from before "bound" answers "unknown op": its own periodic saves are all it has.
            log.warning("%s (rank %d) cannot hold a save cadence: %s", reg.name, reg.rank, answer)
            self.refused.add((reg.pid, reg.rank))
            return None
        return {k: answer[k] for k in ("max_loss_s", "every_s", "save_s", "meets") if k in answer}
