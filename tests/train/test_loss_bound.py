"""A run told a bound on what a cut may lose (the bridge's {"op": "bound"}, node/cadence.py) saves
by the clock, behind its loop, often enough that a cut at any step loses at most about the bound.
Measured from outside the Guard's own sums: at every step, the age of the state of the newest
checkpoint its registration says is on disk."""

from __future__ import annotations

import array
import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from holdover.train import ckpt, registry
from holdover.train.guard import Guard
from holdover.train.schedule import LossBound


def test_a_save_is_due_the_bound_less_a_save_and_a_step_after_the_last_state_never_sooner_than_a_save() -> None:
    b = LossBound(taken=100.0)
    assert not b.due(1e9) and b.every_s() is None and b.meets()  # no bound: the run's own interval decides
    b.max_loss_s, b.save_s = 60.0, 10.0
    b.observe_step_time(2.0)
    assert b.every_s() == 48.0 and b.meets()
    assert not b.due(147.9) and b.due(148.0)
    b.observe_step_time(1.0)  # a fast step counts slowly, a slow one at once
    assert b.step_s == pytest.approx(1.9)
    b.observe_step_time(5.0)
    assert b.step_s == 5.0
    b.save_s = 40.0  # a save too long to keep the bound: back to back, and said so
    assert b.every_s() == 40.0 and not b.meets()
    assert b.as_dict() == {"max_loss_s": 60.0, "every_s": 40.0, "save_s": 40.0, "step_s": 5.0, "meets": False}


class Run:
    """A torch-free Guard over a 4 MB state, stepped on this thread every `step_s`."""

    def __init__(self, tmp: Path, step_s: float = 0.01) -> None:
        self.w = array.array("f", bytes(4 << 20))
        self.g = Guard(tmp / "ckpt", "bounded", capture=self._capture, signal=None, registry_dir=tmp / "reg").start()
        self.step, self.step_s = 0, step_s
        self.at: dict[int, float] = {}  # step -> when its state was complete

    def _capture(self, step: int, extra: dict[str, Any] | None) -> tuple[list[ckpt.Shard], dict[str, Any]]:
        t = ckpt.Tensor.from_buffer("w", "F32", [len(self.w)], memoryview(self.w))
        return [ckpt.Shard("shard_000.safetensors", [t])], {"step": step}

    def train(self, seconds: float) -> list[float]:
        """Steps for `seconds`; at each, the age of the newest saved state (from the run's start if none)."""
        ages, end = [], time.monotonic() + seconds
        start = self.at.get(0, time.monotonic())
        self.at.setdefault(0, start)
        while time.monotonic() < end:
            self.step += 1
            self.w[self.step % len(self.w)] += 1.0
            self.at[self.step] = time.monotonic()
            self.g.step_end(self.step)
            last = self.g.reg.last_save
            ages.append(time.monotonic() - self.at[last.step if last else 0])
            time.sleep(self.step_s)
        return ages

    def ask(self, msg: dict[str, Any]) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(self.g.reg.socket)
            s.sendall(registry.encode(msg))
            return json.loads(s.makefile("rb").readline())

    def registered(self) -> registry.Registration:
        path = registry.registration_path(self.g.registry, "bounded")
        return registry.Registration.from_json(path.read_text())


def test_a_bounded_run_saves_by_the_clock_so_a_cut_at_any_step_loses_at_most_about_the_bound(tmp_path: Path) -> None:
    run = Run(tmp_path)
    try:
        run.train(0.6)
        assert run.g.reg.last_save is None  # no interval and no bound: no periodic save at all
        answer = run.ask({"op": "bound", "max_loss_s": 0.8})
        assert answer["max_loss_s"] == 0.8 and answer["meets"] and 0.5 < answer["every_s"] <= 0.8, answer
        assert run.registered().bound == answer  # published for the bridge and the doctor at once
        run.train(0.3)  # the start is already 0.9 s old: the first save comes at the next step
        first = run.g.reg.last_save
        assert first is not None
        ages = run.train(3.0)
        saved = run.g.reg.last_save
        assert saved is not None and saved.step > first.step
        saves = len({p.name for p in (tmp_path / "ckpt").glob("step_*")})
        # Spaced by the clock, not every step: 3 s at a save every ~0.75 s is 3 to 5 saves, kept 3.
        assert saves >= 3 and saved.step - first.step > 100, (saves, first, saved)
        assert max(ages) <= 0.8 * 1.25, sorted(ages)[-5:]  # the bound, with a loaded machine's jitter
        held = run.registered().bound
        assert held is not None and held["save_s"] > 0  # the save time it plans with, measured
        # Lifted: no more saves by the clock.
        assert run.ask({"op": "bound", "max_loss_s": None})["max_loss_s"] is None
        run.train(0.1)
        last = run.g.reg.last_save
        run.train(1.2)
        assert run.g.reg.last_save == last and run.registered().bound is None
    finally:
        run.g.close()


@pytest.mark.parametrize("bad", ["ten", -5, 0, True, float("inf")])
def test_a_malformed_bound_is_refused_by_name_and_the_one_held_stands(tmp_path: Path, bad: Any) -> None:
    run = Run(tmp_path)
    try:
        assert run.ask({"op": "bound", "max_loss_s": 60})["max_loss_s"] == 60.0
        raw = json.dumps({"op": "bound", "max_loss_s": bad}).replace("Infinity", "1e999")
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(run.g.reg.socket)
            s.sendall(raw.encode() + b"\n")
            answer = json.loads(s.makefile("rb").readline())
        assert "max_loss_s must be seconds above 0" in answer["error"], answer
        assert run.g.bound.max_loss_s == 60.0
    finally:
        run.g.close()
