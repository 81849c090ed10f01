"""Periodic saves written in the background (Guard(background=True), the default): the loop pays a
copy of the state at the boundary, the write runs beside training, and what lands is exactly the
state of the step it was taken at. An emergency save takes the disk from an older background
save, and is answered by one of its own step."""

from __future__ import annotations

import errno
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from holdover.train import ckpt, memory, state
from holdover.train.ckpt import snapshot as snapshot_mod
from holdover.train.guard import Guard
from support import Forked


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    _train(model, opt)
    return model, opt


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    opt.zero_grad()
    model(torch.randn(8, 256)).pow(2).mean().backward()
    opt.step()


def _state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    out = {k: v.clone() for k, v in model.state_dict().items()}
    for i, st in opt.state_dict()["state"].items():
        out |= {f"{i}/{k}": v.clone() for k, v in st.items() if isinstance(v, torch.Tensor)}
    return out


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _holds(d: Path, want: dict[str, torch.Tensor]) -> bool:
    """The checkpoint `d`, loaded into a model and optimizer of its own, is `want` bit for bit."""
    back, back_opt = _model()
    _train(back, back_opt)
    state.apply(state.load(d), back, back_opt)
    return _equal(_state(back, back_opt), want)


class Gate:
    """Holds every background write until opened (or until the save is cancelled)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.open = threading.Event()
        self.started = threading.Event()
        real = ckpt.save

        def save(*a: Any, cancel: threading.Event | None = None, **kw: Any) -> Any:
            if threading.current_thread().name == "holdover-background-save":
                self.started.set()
                while not self.open.is_set() and not (cancel and cancel.is_set()):
                    time.sleep(0.005)
            return real(*a, cancel=cancel, **kw)

        monkeypatch.setattr(ckpt, "save", save)


def _guard(tmp: Path, model: Any, opt: Any, log: list[str], **kw: Any) -> Guard:
    return Guard(
        tmp / "ckpt", "bg", model=model, optimizer=opt, signal=None, registry_dir=tmp / "reg", log=log.append, **kw
    ).start()


def _writing(
    tmp: Path, monkeypatch: pytest.MonkeyPatch, step: int, **kw: Any
) -> tuple[Gate, Any, Any, list[str], Guard]:
    """A Guard whose periodic save of `step` has begun and is held at the gate."""
    gate = Gate(monkeypatch)
    model, opt = _model()
    log: list[str] = []
    g = _guard(tmp, model, opt, log, **kw)
    g.step_end(step)
    assert gate.started.wait(5)
    return gate, model, opt, log, g


def test_a_background_save_holds_the_step_it_was_taken_at_while_training_changes_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate, model, opt, _log, g = _writing(tmp_path, monkeypatch, 5, interval=5)  # copied, written behind
    at5 = _state(model, opt)  # step_end changed nothing: the state it copied
    for _ in range(3):  # every parameter and moment changes while the write waits
        _train(model, opt)
    assert not _equal(_state(model, opt), at5)
    assert not list((tmp_path / "ckpt").glob("step_*"))  # not on disk yet: the loop did not wait
    gate.open.set()
    g.close()
    (d,) = (tmp_path / "ckpt").glob("step_*")
    assert d.name == "step_000000005" and ckpt.verify(d).meta["background"] is True
    assert _holds(d, at5)  # the state of step 5, not of the steps after it
    # The same bytes a blocking save of that state writes.
    state.apply(state.load(d), model, opt)
    blocking = Guard(tmp_path / "b", "b", model=model, optimizer=opt, signal=None, registry_dir=tmp_path / "r2")
    db, _ = blocking.save(5)
    assert _equal(state.load(d).tensors, state.load(db).tensors)
    [(step, copy_s, waited)] = list(g.stalls)
    assert step == 5 and waited == 0.0 and copy_s > 0


def test_the_next_periodic_save_waits_for_the_previous_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate, model, opt, log, g = _writing(tmp_path, monkeypatch, 1, interval=1)
    _train(model, opt)
    at2 = _state(model, opt)
    # Opened 0.3 s from now, from another thread: the wait is counted from step_end on.
    threading.Timer(0.3, gate.open.set).start()
    g.step_end(2)  # the buffer of step 1's snapshot is still being written: wait, then copy
    g.close()
    assert [s[0] for s in g.stalls] == [1, 2] and g.stalls[1][2] >= 0.2, g.stalls
    assert any("step 2 waited" in m and "previous one to finish writing" in m for m in log), log
    names = sorted(d.name for d in (tmp_path / "ckpt").glob("step_*"))
    assert names == ["step_000000001", "step_000000002"]
    assert _holds(tmp_path / "ckpt" / "step_000000002", at2)


def test_an_emergency_takes_the_disk_from_an_older_background_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The gate never opened: the background write of step 1 is still waiting.
    _gate, model, opt, log, g = _writing(tmp_path, monkeypatch, 1, interval=1)
    _train(model, opt)
    at2 = _state(model, opt)
    rid = g.request("mains_lost")
    g.step_end(2)
    req = g.requests()[rid]
    assert req["state"] == "done" and req["step"] == 2, req
    g.close()
    assert sorted(d.name for d in (tmp_path / "ckpt").iterdir() if not d.name.startswith("reg")) == [
        "step_000000002"
    ]  # step 1's partial directory removed, nothing else left behind
    assert any("background save of step 1 stopped for an emergency save" in m for m in log), log
    assert _holds(tmp_path / "ckpt" / "step_000000002", at2)


def test_an_emergency_at_the_step_being_written_is_answered_by_that_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop stops after a periodic save began (here: it never calls step_end again); the
    watchdog's emergency save of the same step waits for the background write instead of
    writing the step twice, and reports done once it is durable."""
    gate, _m, _opt, _log, g = _writing(tmp_path, monkeypatch, 3, interval=3, boundary_wait_s=0.2, stall_save_s=0)
    rid = g.request("mains_lost")
    time.sleep(0.6)  # past boundary_wait_s: the watchdog is waiting on the write
    assert g.requests()[rid]["state"] == "queued"
    gate.open.set()
    deadline = time.monotonic() + 10
    while g.requests()[rid]["state"] != "done":
        assert time.monotonic() < deadline, g.requests()[rid]
        time.sleep(0.02)
    req = g.requests()[rid]
    g.close()
    assert req["step"] == 3 and Path(req["dir"]).name == "step_000000003", req
    assert sorted(d.name for d in (tmp_path / "ckpt").glob("step_*")) == ["step_000000003"]
    assert ckpt.pinned(Path(req["dir"]))  # asked for in a cut: kept out of rotation like any emergency save


def test_kill_9_during_a_background_write_leaves_the_previous_checkpoint_whole(tmp_path: Path) -> None:
    """The toy run (a 200 MB state, a background save every 2 steps) killed -9 while a background
    write is half done: the checkpoint before it verifies, and the next run resumes from it."""
    ck = tmp_path / "ckpt"
    argv = ["--ckpt", str(ck), "--registry", str(tmp_path / "reg")]
    argv += ["--width", "2048", "--depth", "4", "--every", "2", "--shard-bytes", str(50 << 20)]
    p = Forked("holdover.train.toy", [*argv, "--steps", "100000"], tmp_path / "output")
    try:
        deadline = time.monotonic() + 120
        while not (ck.is_dir() and any(ck.glob("step_*")) and any(ck.glob(".tmp-step_*"))):
            assert p.poll() is None and time.monotonic() < deadline, p.stderr() if p.poll() else "timed out"
            time.sleep(0.002)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
    finally:
        p.kill()
        p.wait(10)
    half = list(ck.glob(".tmp-step_*"))
    assert half, "the write finished before the kill: nothing was interrupted"
    newest = ckpt.candidates(ck)[0]
    assert ckpt.verify(newest).step < int(half[0].name.split("_")[1].split("-")[0])
    again = Forked("holdover.train.toy", [*argv, "--steps", "1"], tmp_path / "output")
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err[-2000:]
    first = json.loads(out.splitlines()[0])
    assert first == {"resumed": ckpt.verify(newest).step}, (first, err[-2000:])


@pytest.mark.parametrize("short", ["room", "mmap"])
def test_with_no_memory_for_a_snapshot_periodic_saves_run_in_the_loop_and_say_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, short: str
) -> None:
    """A snapshot buffer the size of the state that would leave less than the headroom free (or
    that the kernel refuses) is not made: the periodic save is written in the loop, said once, and
    the background comes back when memory does."""
    room = {"bytes": 0}
    if short == "room":  # what memory.room() reads: MemAvailable, or a cgroup's limit less its use
        monkeypatch.setattr(memory, "room", lambda: room["bytes"])
    else:
        real = snapshot_mod.StagingBuffer

        def buffer(size: int) -> Any:
            if room["bytes"] == 0:
                raise OSError(errno.ENOMEM, "Cannot allocate memory")
            return real(size)

        monkeypatch.setattr(snapshot_mod, "StagingBuffer", buffer)
    model, opt = _model()
    log: list[str] = []
    g = _guard(tmp_path, model, opt, log, interval=1)
    want = {}
    for step in (1, 2, 3):
        if step == 3:
            room["bytes"] = 64 << 30
        want[step] = _state(model, opt)
        g.step_end(step)
        if step < 3:  # on disk when step_end returns: written in the loop
            d = tmp_path / "ckpt" / f"step_{step:09d}"
            assert ckpt.verify(d).meta.get("background") is None
        _train(model, opt)
    g.close()
    said = [m for m in log if "written in the loop" in m]
    assert len(said) == 1 and "step 1" in said[0], log  # once, not every save
    assert ("needs" in said[0] and "GB is free" in said[0]) if short == "room" else "could not be made" in said[0]
    assert g.warnings == [said[0].removeprefix("holdover: ")]
    assert any("in the background again from step 3" in m for m in log), log
    assert [s[0] for s in g.stalls] == [3]
    assert ckpt.verify(tmp_path / "ckpt" / "step_000000003").meta["background"] is True
    for step, st in want.items():
        assert _holds(tmp_path / "ckpt" / f"step_{step:09d}", st), step


class CopyGate:
    """Holds the snapshot's overlapped copy (the part left for the next forward pass) until opened."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.open = threading.Event()
        self.held = threading.Event()
        self.later: list[int] = []  # bytes of each overlapped copy
        real = snapshot_mod._copy

        def copy(jobs: list[tuple[int, int, int]], threads: int, wait: Any) -> None:
            if threading.current_thread().name == "holdover-background-save":
                self.later.append(sum(j[2] for j in jobs))
                self.held.set()
                assert self.open.wait(10)
            real(jobs, threads, wait)

        monkeypatch.setattr(snapshot_mod, "_copy", copy)


def _bn_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.BatchNorm1d(64), torch.nn.Linear(64, 64))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    _bn_train(model, opt)
    return model, opt


def _forward_backward(model: torch.nn.Module) -> None:
    model.zero_grad()
    model(torch.randn(8, 64)).pow(2).mean().backward()  # BatchNorm's running statistics change here


def _bn_train(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    _forward_backward(model)
    opt.step()


def test_the_parameters_copy_overlaps_the_next_forward_pass_and_the_optimizer_step_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """step_end returns with the parameters and moments still to copy; the forward pass runs
    meanwhile (and changes the buffers, copied at the boundary); optimizer.step() waits for the
    copy; the checkpoint is step 5 exactly, buffers included, and the wait is charged as stall."""
    gate = CopyGate(monkeypatch)
    model, opt = _bn_model()
    log: list[str] = []
    g = _guard(tmp_path, model, opt, log, interval=5)
    at5 = _state(model, opt)
    g.step_end(5)
    assert gate.held.wait(5)
    params = sum(p.numel() * 4 for p in model.parameters())
    assert gate.later == [3 * params + 4 * len(list(model.parameters()))]  # parameters, two moments, Adam's steps
    _forward_backward(model)  # the next step's forward and backward, beside the copy
    stepped = threading.Event()

    def step() -> None:
        opt.step()
        stepped.set()

    threading.Thread(target=step).start()
    assert not stepped.wait(0.3)  # held at the optimizer step
    assert _equal(
        {k: v for k, v in _state(model, opt).items() if "running" not in k and "batches" not in k},
        {k: v for k, v in at5.items() if "running" not in k and "batches" not in k},
    )
    gate.open.set()
    assert stepped.wait(5)
    assert not _equal(_state(model, opt), at5)
    g.close()
    assert _holds_bn(tmp_path / "ckpt" / "step_000000005", at5)
    [(s, copy_s, waited)] = list(g.stalls)
    assert s == 5 and copy_s >= 0.25 and waited == 0.0, g.stalls  # the optimizer's wait is the loop's cost


def _holds_bn(d: Path, want: dict[str, torch.Tensor]) -> bool:
    back, back_opt = _bn_model()
    _bn_train(back, back_opt)
    state.apply(state.load(d), back, back_opt)
    return _equal(_state(back, back_opt), want)


@pytest.mark.parametrize("how", ["another optimizer", "overlap=False"])
def test_what_changes_outside_the_hooked_optimizer_is_copied_at_the_boundary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A second optimizer (a GAN's) steps the second layer with no hook to wait on; with
    overlap=False a loop may change any parameter by hand: either way the checkpoint holds the
    boundary's values."""
    gate = CopyGate(monkeypatch)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    first = torch.optim.SGD(model[0].parameters(), lr=0.1)
    second = torch.optim.SGD(model[1].parameters(), lr=0.1)
    g = _guard(tmp_path, model, first, [], interval=5, overlap=how == "another optimizer")
    at5 = {k: v.clone() for k, v in model.state_dict().items()}
    g.step_end(5)
    assert gate.held.wait(5)
    if how == "another optimizer":
        model.zero_grad()
        model(torch.randn(8, 64)).pow(2).mean().backward()
        second.step()  # no pre-hook here
        assert gate.later == [sum(p.numel() * 4 for p in model[0].parameters())]
    else:
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(2)
        assert gate.later == [0]  # everything copied at the boundary
    assert not _equal(model.state_dict(), at5)
    gate.open.set()
    g.close()
    back = state.load(tmp_path / "ckpt" / "step_000000005").tensors
    assert _equal({k: back[k] for k in at5}, at5)
