"""The rescue plan: what a cut would save, worked out before one, against the host UPS's runtime.

Each protected run costs its last save's time as the rescue spends it (its own measured write,
then the read back that verifies it) and is worth the compute since its newest checkpoint (that
age times its ranks: what a cut now throws away). A save alone runs at its own rate, usually well
under what the disk takes (serialising, hashing, fsync latency): several at once then each keep
their own pace. Past the disk's ceiling they only share it and all finish late. So on each device
(a checkpoint directory's filesystem) saves are admitted in the order of compute kept per second of
saving while their rates together stay under `[protect] disk_mb_s`, the next waiting for one to end;
unknown (0), the disk is taken not to be the limit and the chosen saves all start at once. Devices
run side by side. On each, the plan keeps the set of runs whose saves so scheduled end before the
time to save in does, with the most compute kept (exact for the handful of runs a box holds). A run
that cannot fit, or whose save was never measured, is said with what happens to it instead.

bench/rescue_plan.py measured why the ceiling is asked rather than assumed: four runs of 150 to 600
MB here, one at a time, verified two in the time all four at once did (each alone used a quarter
of the disk's 1.8 GB/s).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from holdover.events import duration
from holdover.node.targets import registry_dir
from holdover.node.ups import Runtime
from holdover.settings import ProtectSettings
from holdover.train import registry
from holdover.train.registry import Registration

EXACT_UP_TO = 14  # runs in one lane planned exactly (2^14 subsets); beyond, by compute kept per second
# The bridge reads every checkpoint back to verify it: request to verified took the run's own write
# plus its bytes at 714-1033 MB/s here (bench/rescue_plan.py's runs, 250 and 600 MB, six saves).
VERIFY_MB_S = 700.0


def save_seconds(seconds: float, nbytes: int) -> float:
    """A save's time as the rescue spends it: the run's measured write, then the read back."""
    return seconds + nbytes / (VERIFY_MB_S * 1e6)


@dataclass
class RunCost:
    """One protected run as the plan sees it: its ranks on this node taken together."""

    name: str
    ranks: int  # its registrations here, which save side by side
    world: int  # its ranks overall, the compute a lost hour costs
    device: int | None  # st_dev of its checkpoint directory: saves there share that disk
    save_s: float | None  # its last save written and read back (the slowest rank here); None: never measured
    nbytes: int  # that save's bytes, every rank here
    age_s: float | None  # since its newest save; None: never saved

    @property
    def worth_s(self) -> float:
        """Compute at risk: what a cut now would lose (the age, times its ranks)."""
        return (self.age_s or 0.0) * max(self.world, 1)

    @property
    def rate(self) -> float:
        """Bytes a second it moves alone, written and read back."""
        return self.nbytes / max(self.save_s or 0.0, 1e-3)


@dataclass
class Slot:
    run: RunCost
    start_s: float  # from the start of the saving (the grace over)
    end_s: float


@dataclass
class Plan:
    budget_s: float  # the time to save in: the runtime, less the margin and the grace
    runtime_s: float
    runtime_said: str  # where the runtime comes from, "a guess" when it is one
    guess: bool
    lanes: list[list[Slot]] = field(default_factory=list)
    cannot: list[tuple[RunCost, str]] = field(default_factory=list)
    # The load model, when the UPS's load in watts and what a rank draws are known:
    load_w: float | None = None  # the UPS's load now
    rank_w: float = 0.0  # what one rank draws while it trains ([protect] rank_watts)
    grace_s: float = 0.0
    shed: bool = False  # [protect] shed: each run stopped once saved

    @property
    def shed_runtime_s(self) -> float | None:
        """The UPS's runtime if each run planned stops drawing once its save ends (None: no model)."""
        if not self.load_w or not self.rank_w or not self.fits:
            return None
        stops = [(self.grace_s + s.end_s, s.run.ranks * self.rank_w) for s in self.fits]
        if sum(w for _t, w in stops) >= self.load_w:
            return None  # the runs would draw all the UPS gives, or more: the figures disagree
        return shed_runtime(self.runtime_s, self.load_w, stops)

    @property
    def fits(self) -> list[Slot]:
        return sorted((s for lane in self.lanes for s in lane), key=lambda s: s.start_s)

    @property
    def kept_s(self) -> float:
        return sum(s.run.worth_s for s in self.fits)

    @property
    def lost_s(self) -> float:
        return sum(r.worth_s for r, _why in self.cannot)

    def sentence(self) -> str:
        """The plan as a person reads it: "with 6 min 58 s of UPS: llama 3 min 10 s, ...; vit cannot fit: ..."."""
        if not self.fits and not self.cannot:
            return "no protected run"
        head = f"with {duration(self.budget_s)} to save in ({self.runtime_said})"
        saves = [f"{s.run.name} {duration(s.end_s - s.start_s)}" for s in self.fits]
        out = head + (": " + ", ".join(saves) if saves else ": nothing fits")
        if len(self.lanes) > 1:
            out += f" ({len(self.lanes)} disks side by side)"
        for r, why in self.cannot:
            out += f"; {r.name} {why}"
        if (gain := self.shed_gain_s) is not None and self.load_w:
            left = self.load_w - sum(s.run.ranks * self.rank_w for s in self.fits)
            model = f"{self.load_w:.0f} W to {left:.0f} W"
            if self.shed:
                out += f"; each run stopped once saved: the UPS lasts about {duration(gain)} more ({model})"
            else:
                out += f"; stopping each run once saved would buy about {duration(gain)} ({model}); shedding is off"
        return out

    @property
    def shed_gain_s(self) -> float | None:
        rt = self.shed_runtime_s
        return None if rt is None else max(rt - self.runtime_s, 0.0)

    def as_dict(self) -> dict[str, Any]:
        return {
            "budget_s": round(self.budget_s, 1),
            "runtime_s": round(self.runtime_s, 1),
            "runtime_said": self.runtime_said,
            "guess": self.guess,
            "order": [
                {"run": s.run.name, "start_s": round(s.start_s, 1), "end_s": round(s.end_s, 1), "lane": i}
                for i, lane in enumerate(self.lanes)
                for s in lane
            ],
            "cannot": [{"run": r.name, "why": why, "age_s": r.age_s} for r, why in self.cannot],
            "kept_s": round(self.kept_s),
            "lost_s": round(self.lost_s),
            "shed": self.shed,
            "load_w": self.load_w,
            "shed_gain_s": None if (g := self.shed_gain_s) is None else round(g, 1),
            "sentence": self.sentence(),
        }


def for_node(
    protect: ProtectSettings, rt: Runtime, now: float | None = None, regs: list[Registration] | None = None
) -> Plan:
    """The plan for the runs protected on this node now (or these live registrations), against the
    runtime the rescue would take."""
    if regs is None:
        found, _problems = registry.read_registrations(registry_dir(protect))
        regs = [r for r in found if r.alive()]
    ceiling = protect.disk_mb_s * 1e6 or None
    p = plan(costs(regs, now), rt.seconds, rt.said, rt.guess, protect.margin, protect.grace, ceiling)
    p.load_w, p.rank_w, p.shed = rt.load_w, protect.rank_watts, protect.shed
    return p


def shed_runtime(runtime_s: float, load_w: float, stops: list[tuple[float, float]]) -> float:
    """The UPS's runtime if runs stop drawing along the way: the energy it has left (its runtime
    times its load, as a UPS estimating runtime from its load has it) spent at each moment's load.
    stops: (seconds from now, watts that stop then). A battery gives more than this at a lower load
    (Peukert's law), so the gain it shows is the least to expect."""
    energy, t, load = runtime_s * load_w, 0.0, load_w
    for at, watts in sorted(stops):
        if energy <= load * (at - t):
            break
        energy -= load * max(at - t, 0.0)
        t, load = max(at, t), load - watts
    return t + energy / load


def costs(regs: list[Registration], now: float | None = None) -> list[RunCost]:
    """The runs of these registrations, each rank of a run on this node folded into one."""
    now = time.time() if now is None else now
    by_name: dict[str, list[Registration]] = {}
    for r in regs:
        by_name.setdefault(r.name, []).append(r)
    out = []
    for name, ranks in sorted(by_name.items()):
        saves = [r.last_save for r in ranks]
        measured = all(s is not None and s.seconds > 0 for s in saves)
        newest = min((s.at for s in saves if s is not None), default=None)  # the run's checkpoint: every rank's
        out.append(
            RunCost(
                name=name,
                ranks=len(ranks),
                world=max(r.world for r in ranks),
                device=_device(ranks[0].ckpt_dir),
                save_s=max(save_seconds(s.seconds, s.nbytes) for s in saves if s is not None) if measured else None,
                nbytes=sum(s.nbytes for s in saves if s is not None),
                age_s=None if newest is None or not all(saves) else max(now - newest, 0.0),
            )
        )
    return out


def _device(path: str) -> int | None:
    try:
        return os.stat(path).st_dev
    except OSError:
        return None


def plan(
    runs: list[RunCost],
    runtime_s: float,
    runtime_said: str,
    guess: bool,
    margin_s: float,
    grace_s: float,
    ceiling: float | None = None,  # the disk's bytes a second; None: not the limit
) -> Plan:
    budget = max(runtime_s - margin_s - grace_s, 0.0)
    p = Plan(budget, runtime_s, runtime_said, guess, grace_s=grace_s)
    lanes: dict[int | None, list[RunCost]] = {}
    for r in runs:
        if r.save_s is None:
            p.cannot.append((r, "has no save measured yet: asked at once, beside the plan"))
        elif r.save_s > budget:
            p.cannot.append((r, f"cannot fit ({duration(r.save_s)} to save): {_stands(r)}"))
        else:
            lanes.setdefault(r.device, []).append(r)
    for members in lanes.values():
        chosen = _choose(members, budget, ceiling)
        for r in members:
            if r not in chosen:
                p.cannot.append((r, f"does not fit beside the others: {_stands(r)}"))
        if chosen:
            p.lanes.append(schedule(chosen, ceiling))
    return p


def schedule(runs: list[RunCost], ceiling: float | None) -> list[Slot]:
    """Each save's start and end on one disk: admitted in the order of compute kept per second while
    the rates of those running stay under the ceiling (one always runs), the next at the first end."""
    running: list[Slot] = []
    out: list[Slot] = []
    now = 0.0
    for r in sorted(runs, key=_density, reverse=True):
        assert r.save_s is not None
        while running and ceiling is not None and sum(s.run.rate for s in running) + r.rate > ceiling:
            first = min(running, key=lambda s: s.end_s)
            now = max(now, first.end_s)
            running.remove(first)
        slot = Slot(r, now, now + r.save_s)
        running.append(slot)
        out.append(slot)
    return out


def _stands(r: RunCost) -> str:
    return f"its last checkpoint stands, {duration(r.age_s)} old" if r.age_s is not None else "it was never saved"


def _density(r: RunCost) -> float:
    return r.worth_s / max(r.save_s or 0.0, 1e-3)


def _choose(members: list[RunCost], budget: float, ceiling: float | None) -> list[RunCost]:
    """The runs of one disk whose saves, so scheduled, end within the budget with the most compute kept."""

    def ends(combo: list[RunCost]) -> float:
        return max((s.end_s for s in schedule(combo, ceiling)), default=0.0)

    if len(members) > EXACT_UP_TO:
        chosen: list[RunCost] = []
        for r in sorted(members, key=_density, reverse=True):
            if ends([*chosen, r]) <= budget:
                chosen.append(r)
        return chosen
    best: tuple[float, int, float] = (-1.0, 0, 0.0)
    picked: tuple[RunCost, ...] = ()
    for k in range(len(members) + 1):
        for combo in combinations(members, k):
            took = ends(list(combo))
            if took <= budget:
                # The most compute kept; between equals, the most runs saved (one just saved is
                # worth nothing yet, and saving it costs only time that is left), then the soonest over.
                key = (sum(r.worth_s for r in combo), len(combo), -took)
                if key > best:
                    best, picked = key, combo
    return list(picked)
