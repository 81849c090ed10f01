"""The Guard's collective-free path: when the loop is stuck (a rank blocked in a collective whose
peer is gone, a hung data loader), its watchdog thread saves the step the model and optimizer
still hold, and refuses when they hold none. The training loop runs in a thread here and is held
where a dead link holds a rank: after backward, before optimizer.step()."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from holdover.lab.ddp_trainee import _digest  # noqa: E402
from holdover.train import ckpt, state  # noqa: E402
from holdover.train.guard import Guard  # noqa: E402
from holdover.train.toy import build  # noqa: E402


class Loop:
    """A toy training loop on a thread that stops at `hold` (before or inside the update) until
    released; it records each ended step's digest and RNG state."""

    def __init__(self, tmp: Path, hold: int, inside_update: bool = False, **guard: Any) -> None:
        torch.manual_seed(0)
        self.model = build(64, 2)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.logs: list[str] = []
        self.guard = Guard(
            tmp / "ckpt", "wd", model=self.model, optimizer=self.opt, registry_dir=tmp / "reg", signal=None,
            log=self.logs.append, **guard,
        ).start()  # fmt: skip
        self.hold, self.release, self.held = hold, threading.Event(), threading.Event()
        self.ended: dict[int, tuple[str, Any]] = {}
        self.stop = False
        if inside_update:  # a hook after the Guard's: the update has begun when it blocks
            self.opt.register_step_pre_hook(lambda *a: self._wait(self._step))
        self._inside = inside_update
        self._step = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _wait(self, step: int) -> None:
        if step == self.hold:
            self.held.set()
            self.release.wait(30)

    def _run(self) -> None:
        for step in range(1, 1000):
            self._step = step
            loss = self.model(torch.randn(8, 64)).pow(2).mean()  # draws from the global RNG
            self.opt.zero_grad()
            loss.backward()
            if not self._inside:
                self._wait(step)  # where a rank waits in its gradient all-reduce
            self.opt.step()
            self.ended[step] = (_digest(self.model, self.opt), torch.get_rng_state())
            if self.guard.step_end(step, loss=loss.item(), extra={"pos": step}) or self.stop:
                return
            time.sleep(0.002)

    def close(self) -> None:
        self.stop = True
        self.release.set()
        self.thread.join(30)
        self.guard.close()


def _wait_for(pred: Any, timeout: float = 20.0) -> Any:
    end = time.monotonic() + timeout
    while not (got := pred()):
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)
    return got


def test_a_stuck_loop_is_saved_at_its_last_whole_step_without_a_collective(tmp_path: Path) -> None:
    loop = Loop(tmp_path, hold=6, boundary_wait_s=0.3)
    try:
        assert loop.held.wait(20)
        t0 = time.monotonic()
        rid = loop.guard.request("mains_lost")
        req = _wait_for(
            lambda: loop.guard.requests()[rid]["state"] in ("done", "failed") and loop.guard.requests()[rid]
        )
        took = time.monotonic() - t0
        assert req["state"] == "done" and req["step"] == 5, req
        assert took < 10, took
        d = Path(req["dir"])
        loaded = state.load(d)
        assert loaded.step == 5 and loaded.train["extra"] == {"pos": 5}
        assert loaded.manifest.meta["collective_free"] is True and ckpt.pinned(d)
        # What was saved is step 5 bit for bit, and the RNG as it stood at step 5's end, not as
        # the held step 6 left it after drawing its batch.
        m2, o2 = build(64, 2), None
        o2 = torch.optim.Adam(m2.parameters(), lr=1e-3)
        state.apply(loaded, m2, o2)
        assert _digest(m2, o2) == loop.ended[5][0]
        assert torch.equal(torch.get_rng_state(), loop.ended[5][1])

        # Released, the loop goes on; the boundary of step 6 is a new step, saved by the loop.
        loop.release.set()
        _wait_for(lambda: 8 in loop.ended)
        rid2 = loop.guard.request("again")
        req2 = _wait_for(lambda: loop.guard.requests()[rid2]["state"] == "done" and loop.guard.requests()[rid2])
        assert req2["step"] > 6 and "collective_free" not in state.load(Path(req2["dir"])).manifest.meta
    finally:
        loop.close()


def test_inside_an_update_it_refuses_and_says_why_then_the_loop_saves_at_the_boundary(tmp_path: Path) -> None:
    loop = Loop(tmp_path, hold=6, inside_update=True, boundary_wait_s=0.3)
    try:
        assert loop.held.wait(20)
        rid = loop.guard.request("mains_lost")
        req = _wait_for(lambda: loop.guard.requests()[rid].get("waiting") and loop.guard.requests()[rid])
        assert req["state"] == "queued" and "inside an update" in req["waiting"]
        assert not ckpt.candidates(loop.guard.root)
        assert sum("inside an update" in m for m in loop.logs) == 1  # said once, not every 0.1 s
        loop.release.set()
        req = _wait_for(lambda: loop.guard.requests()[rid]["state"] == "done" and loop.guard.requests()[rid])
        assert req["step"] == 6 and "collective_free" not in state.load(Path(req["dir"])).manifest.meta
    finally:
        loop.close()


def test_a_stall_longer_than_stall_save_s_is_saved_once_unasked(tmp_path: Path) -> None:
    loop = Loop(tmp_path, hold=4, stall_save_s=0.5)
    try:
        assert loop.held.wait(20)
        d = _wait_for(lambda: ckpt.candidates(loop.guard.root))[0]
        meta = ckpt.verify(d).meta
        assert ckpt.verify(d).step == 3 and meta["reason"] == "stalled" and meta["collective_free"]
        time.sleep(1.0)
        assert len(ckpt.candidates(loop.guard.root)) == 1
        assert any("no step has ended for" in m and "saving step 3" in m for m in loop.logs), loop.logs
    finally:
        loop.close()
