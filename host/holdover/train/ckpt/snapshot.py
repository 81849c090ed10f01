"""A copy of the training state taken at a step boundary, for a save written while training goes on.

The writer reads tensors' live memory; a save that runs beside training needs memory that the
next optimizer step does not change. Copying the state into one buffer is the cheapest snapshot
that is consistent by construction: a copy-on-write fork of a multi-threaded training process can
deadlock in the child (locks held by threads that do not exist there) and pays a page fault per
page the parent then writes, which is every page of the model. The buffer is kept for the next
snapshot, so first-touch of fresh memory (about as dear as the copy itself on this VM) is paid once.

The buffer holds each shard as its file, byte for byte: the safetensors header, then the tensors,
each file starting on a block and padded to one. The writer then hashes and writes every chunk
where it lies (O_DIRECT straight from the snapshot) instead of gathering it into a staging buffer
first: one copy of the state instead of two, and the cores that copy no more are training's.

Tensors on a device (a GPU) are copied into the same buffer by a Stager the caller hands in
(holdover.train.device for CUDA): the buffer is pinned once, when made, so the device-to-host
copies are DMA on a side stream; they run while the host tensors are copied here, and take returns
once both are done. This module never imports torch: a CPU-only run never reaches CUDA.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from holdover.train.ckpt.engine import THREADS, StagingBuffer, run_jobs
from holdover.train.ckpt.format import ALIGN, CheckpointError, Shard, Tensor, round_up, safetensors_header

PIECE = 64 << 20  # copy jobs: large tensors split so every thread has work


class Stager(Protocol):
    """Copies device tensors into host memory."""

    def pin(self, address: int, size: int) -> Callable[[], None]:
        """Page-locks host memory for DMA; returns what undoes it."""
        ...

    def to_host(self, items: Sequence[tuple[int, Any, int]]) -> Callable[[], None]:
        """Starts copying each (host address, device tensor, bytes); returns what waits for all."""
        ...


class Snapshot:
    """One reusable snapshot buffer (host memory the size of the state)."""

    def __init__(self) -> None:
        self.buf: StagingBuffer | None = None
        self._unpin: Callable[[], None] | None = None

    @property
    def nbytes(self) -> int:
        return self.buf.size if self.buf else 0

    def take(self, shards: Sequence[Shard], threads: int = THREADS, stager: Stager | None = None) -> list[Shard]:
        """Copies every tensor of `shards` into the buffer (on `threads` threads; tensors on a
        device through `stager`) and returns the same shards pointing at the copies, all in host
        memory. The copies hold until the next take: the save written from them must finish (or
        be cancelled) before then."""
        out, rest = self.begin(shards, threads, stager)
        rest()
        return out

    def begin(
        self,
        shards: Sequence[Shard],
        threads: int = THREADS,
        stager: Stager | None = None,
        later: Callable[[Tensor], bool] | None = None,
    ) -> tuple[list[Shard], Callable[[], None]]:
        """`take`, in two parts: the tensors `later` picks are only placed (their device copies
        started); the rest are copied before this returns. Returns the shards over the buffer and
        what copies the picked ones, which must run before anything changes them (a training loop:
        before the next optimizer step, while the next forward and backward pass run)."""
        on_device = next((t for s in shards for t in s.tensors if t.device != "cpu"), None)
        if on_device is not None and stager is None:
            raise CheckpointError(f"{on_device.name} is on {on_device.device} and no stager copies it to the host")
        headers = [safetensors_header(s) for s in shards]
        starts, total = _layout(shards, headers)
        if self.buf is None or self.buf.size < total or (on_device is not None and self._unpin is None):
            self.close()
            self.buf = StagingBuffer(max(total, 1))
            if on_device is not None and stager is not None:
                # Pinned once per buffer: registering GBs of pages costs about as much as a copy.
                self._unpin = stager.pin(self.buf.address, self.buf.size)
        base, view = self.buf.address, self.buf.view
        # (destination, source, length) for host tensors, (destination, device tensor, length)
        # for device ones; [0] copied now, [1] later.
        jobs: tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]] = ([], [])
        device: tuple[list[tuple[int, Any, int]], list[tuple[int, Any, int]]] = ([], [])
        out: list[Shard] = []
        for s, header, start in zip(shards, headers, starts, strict=True):
            size = len(header) + s.nbytes
            view[start : start + len(header)] = header
            # Zeros to the block's end: O_DIRECT writes the last chunk whole (the file is cut back).
            ctypes.memset(base + start + size, 0, round_up(size) - size)
            copied = []
            dst = base + start + len(header)
            for t in s.tensors:
                when = 1 if later is not None and later(t) else 0
                if t.device != "cpu":
                    device[when].append((dst, t.keepalive, t.nbytes))
                for a in range(0, t.nbytes if t.device == "cpu" else 0, PIECE):
                    jobs[when].append((dst + a, t.address + a, min(PIECE, t.nbytes - a)))
                copied.append(Tensor(t.name, t.dtype, list(t.shape), dst, t.nbytes, self.buf))
                dst += t.nbytes
            out.append(Shard(s.name, copied, dict(s.metadata), view[start : start + round_up(size)]))
        # Every device copy starts now, on a stream that waits for the step's last kernels: the
        # later ones overlap the next forward pass, which does not change what they copy.
        waits = [stager.to_host(d) if d and stager is not None else None for d in device]
        _copy(jobs[0], threads, waits[0])
        return out, lambda: _copy(jobs[1], threads, waits[1])

    @staticmethod
    def size_of(shards: Sequence[Shard]) -> int:
        """The buffer a snapshot of `shards` takes."""
        return _layout(shards, [safetensors_header(s) for s in shards])[1]

    def close(self) -> None:
        if self._unpin is not None:
            self._unpin()
            self._unpin = None
        if self.buf is not None:
            self.buf.close()
            self.buf = None


def _copy(jobs: list[tuple[int, int, int]], threads: int, wait: Callable[[], None] | None) -> None:
    # memmove releases the GIL, so the copies run in parallel like the writer's gathers.
    try:
        run_jobs(jobs, threads, 0, lambda job, _st: ctypes.memmove(*job))
    finally:
        if wait is not None:
            wait()  # the loop may change the device tensors again once this returns


def _layout(shards: Sequence[Shard], headers: Sequence[bytes]) -> tuple[list[int], int]:
    """Where each shard's file starts in the buffer (on a block), and the buffer's size."""
    starts: list[int] = []
    total = 0
    for s, header in zip(shards, headers, strict=True):
        starts.append(total)
        total += round_up(len(header) + s.nbytes, ALIGN)
    return starts, total
