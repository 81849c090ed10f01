"""Snapshots of tensors on a GPU, as far as a machine without one can take them: the Snapshot hands
every device tensor to a stager (pinned buffer, copies on a side stream, waited for before the loop
goes on), the writer never reads a device address, the bytes land where the plan says, and a
CPU-only run never reaches CUDA. The stager here is a stand-in at the lowest layer: it places the
bytes with the same call (`device.copy_to_host`) the CUDA stager makes on its stream, but late, in
its wait, so a Snapshot that did not wait would write zeros. The CUDA calls themselves are untried."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import subprocess
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from holdover.train import ckpt, device, restore, state
from holdover.train.ckpt.engine import StagingBuffer
from holdover.train.guard import Guard


class LateStager:
    """Copies in its wait, not before: the Snapshot must wait for the device copies it started."""

    def __init__(self) -> None:
        self.pinned: list[tuple[int, int]] = []
        self.unpinned: list[int] = []
        self.copied = 0

    def pin(self, address: int, size: int) -> Callable[[], None]:
        self.pinned.append((address, size))
        return lambda: self.unpinned.append(address)

    def to_host(self, items: Sequence[tuple[int, Any, int]]) -> Callable[[], None]:
        def wait() -> None:
            for address, src, nbytes in items:
                device.copy_to_host(address, src, nbytes)
                self.copied += 1

        return wait


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.Linear(64, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _train(model, opt)
    return model, opt


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    opt.zero_grad()
    model(torch.randn(4, 64)).pow(2).mean().backward()
    opt.step()


def _on_device(shards: list[ckpt.Shard], every: int = 2) -> list[ckpt.Shard]:
    """Every `every`-th tensor marked as living on a GPU: no host address, only the tensor."""
    out, k = [], 0
    for s in shards:
        ts = []
        for t in s.tensors:
            on = k % every == 0
            ts.append(dataclasses.replace(t, address=0, device="cuda:0") if on else t)
            k += 1
        out.append(ckpt.Shard(s.name, ts, dict(s.metadata)))
    return out


def _tensors(d: Path) -> dict[str, torch.Tensor]:
    return state.load(d).tensors


def test_device_tensors_are_staged_through_one_pinned_buffer_and_waited_for(tmp_path: Path) -> None:
    model, opt = _model()
    cap = state.capture(model, opt, step=1)
    want = {t.name: bytes(state.flat_bytes(t.keepalive)) for s in cap.shards for t in s.tensors}
    stager, snap = LateStager(), ckpt.Snapshot()
    shards = snap.take(_on_device(cap.shards), stager=stager)
    assert all(t.device == "cpu" and t.keepalive is snap.buf for s in shards for t in s.tensors)
    assert stager.copied == sum(1 for s in _on_device(cap.shards) for t in s.tensors if t.device != "cpu") > 3
    # The buffer was pinned once, whole, when made; a second snapshot reuses it as it is.
    assert stager.pinned == [(snap.buf.address, snap.buf.size)]
    _train(model, opt)  # the live tensors move on; the snapshot holds step 1
    d, _ = ckpt.save(tmp_path, 1, shards, blobs={ckpt.TRAIN_JSON: json.dumps(cap.train).encode()})
    got = {k: bytes(state.flat_bytes(v)) for k, v in _tensors(d).items()}
    assert got == want
    snap.take(_on_device(state.capture(model, opt, step=2).shards), stager=stager)
    assert len(stager.pinned) == 1 and not stager.unpinned
    snap.close()
    assert stager.unpinned == [stager.pinned[0][0]]  # unpinned before the memory goes


def test_a_device_tensor_never_reaches_the_writer_unstaged(tmp_path: Path) -> None:
    model, opt = _model()
    shards = _on_device(state.capture(model, opt).shards)
    # Its address is 0: a writer that read it would crash the process, not fail the save.
    with pytest.raises(ckpt.CheckpointError, match=r"0\.weight is on cuda:0, not staged to host memory"):
        ckpt.save(tmp_path, 1, shards)
    with pytest.raises(ckpt.CheckpointError, match=r"0\.weight is on cuda:0 and no stager"):
        ckpt.Snapshot().take(shards)
    assert not list(tmp_path.glob("step_*"))


@pytest.mark.parametrize(
    "t",
    [
        torch.arange(12, dtype=torch.bfloat16).reshape(3, 4),
        torch.arange(7, dtype=torch.int64) * -3,
        torch.tensor(2.5),  # 0-dim: a step count
        torch.tensor([True, False, True]),
        torch.empty(0, 5),
    ],
    ids=["bf16", "i64", "scalar", "bool", "empty"],
)
def test_copy_to_host_places_a_tensor_s_bytes_at_its_offset(t: torch.Tensor) -> None:
    n = t.numel() * t.element_size()
    buf = StagingBuffer(4096)
    try:
        buf.view[:] = b"\xee" * 4096
        device.copy_to_host(buf.address + 64, t, n)
        assert bytes(buf.view[64 : 64 + n]) == bytes(state.flat_bytes(t))
        assert bytes(buf.view[:64]) == b"\xee" * 64 and bytes(buf.view[64 + n : 128 + n]) == b"\xee" * 64
        with pytest.raises(ValueError, match="bytes where"):
            device.copy_to_host(buf.address, t, n + 1)
    finally:
        buf.close()


def test_the_guard_stages_a_gpu_state_for_its_background_saves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Guard's own path: a state with tensors on a GPU gets a stager (made once), the loop
    changes every parameter after each snapshot, and each checkpoint holds its step."""
    stager = LateStager()
    monkeypatch.setattr(device, "CudaStager", lambda log: stager)
    real = state.capture

    def capture(*a: Any, **kw: Any) -> state.Captured:
        cap = real(*a, **kw)
        if a[-1]:  # on_device: what a model on a GPU gives
            cap.shards = _on_device(cap.shards)
        return cap

    monkeypatch.setattr(state, "capture", capture)
    model, opt = _model()
    g = Guard(
        tmp_path / "ckpt", "gpu", model=model, optimizer=opt, signal=None, registry_dir=tmp_path / "r", interval=1
    )
    g.start()
    want = {}
    for step in (1, 2):
        want[step] = {k: v.clone() for k, v in model.state_dict().items()}
        g.step_end(step)
        _train(model, opt)
    g.close()
    assert len(stager.pinned) == 1 and stager.unpinned == [stager.pinned[0][0]]
    for step, sd in want.items():
        got = _tensors(tmp_path / "ckpt" / f"step_{step:09d}")
        assert all(torch.equal(got[k], v) for k, v in sd.items()), step


def test_a_cpu_only_run_never_reaches_cuda(tmp_path: Path) -> None:
    # A fresh process: the suite's own imports must not decide it.
    script = textwrap.dedent(
        f"""
        import json, sys, torch
        from holdover.train.guard import Guard
        model = torch.nn.Linear(32, 32)
        opt = torch.optim.Adam(model.parameters())
        g = Guard({str(tmp_path / "ckpt")!r}, "cpu", model=model, optimizer=opt, signal=None,
                  registry_dir={str(tmp_path / "r")!r}, interval=1).start()
        for step in range(1, 4):
            opt.zero_grad(); model(torch.randn(4, 32)).sum().backward(); opt.step()
            g.step_end(step)
        g.close()
        g2 = Guard({str(tmp_path / "ckpt")!r}, "cpu", model=model, optimizer=opt, signal=None,
                   registry_dir={str(tmp_path / "r")!r})
        print(json.dumps({{"resumed": g2.resume(), "device_module": "holdover.train.device" in sys.modules,
                           "cuda_initialized": torch.cuda.is_initialized()}}))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"resumed": 3, "device_module": False, "cuda_initialized": False}, out.stderr


def test_a_resume_onto_a_gpu_page_locks_the_read_staging_for_the_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a destination on a GPU, load_into has the reader page-lock its staging buffers: each is
    locked before a chunk lands in it and unlocked before the call returns (kept buffers go back as
    every other user expects them); the state loads bit for bit. On the CPU nothing is locked."""
    model, opt = _model()
    d, _ = state.save(tmp_path, 1, model, opt)
    want = {k: v.clone() for k, v in model.state_dict().items()}
    assert restore._page_lock(dict(model.state_dict()), print) is None  # CPU only: CUDA never asked

    locked: list[tuple[int, int]] = []
    unlocked: list[int] = []

    def page_lock(address: int, size: int) -> Callable[[], None]:
        locked.append((address, size))
        return lambda: unlocked.append(address)

    # Stands in for the choice a state on a GPU makes (device.pin_host, cudaHostRegister).
    monkeypatch.setattr(restore, "_page_lock", lambda dest, log: page_lock)
    landed: list[bool] = []
    real_read = ckpt.read_into

    def read_into(directory: Any, deliver: Any, *a: Any, **kw: Any) -> Any:
        def check(name: str, offset: int, data: memoryview) -> None:
            if len(data):
                at = ctypes.addressof(ctypes.c_char.from_buffer(data))
                landed.append(not unlocked and any(a <= at and at + len(data) <= a + n for a, n in locked))
            deliver(name, offset, data)

        return real_read(directory, check, *a, **kw)

    monkeypatch.setattr(restore.ckpt, "read_into", read_into)
    _train(model, opt)  # every tensor moves away from the checkpoint
    restore.load_into(d, model, opt, threads=2)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in want.items())
    assert landed and all(landed), landed  # every chunk read into locked memory
    assert len(locked) >= 1 and sorted(unlocked) == sorted(a for a, _ in locked)  # each unlocked, once
