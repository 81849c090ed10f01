"""A copy of the training state taken at a step boundary, for a save written while training goes on.

The writer reads tensors' live memory; a save that runs beside training needs memory that the
next optimizer step does not change. Copying the state into one buffer is the cheapest snapshot
that is consistent by construction: a copy-on-write fork of a multi-threaded training process can
deadlock in the child (locks held by threads that do not exist there) and pays a page fault per
page the parent then writes, which is every page of the model. The buffer is kept for the next
snapshot, so first-touch of fresh memory (about as dear as the copy itself on this VM) is paid once.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

from holdover.train.ckpt.engine import THREADS, StagingBuffer, run_jobs
from holdover.train.ckpt.format import Shard, Tensor

PIECE = 64 << 20  # copy jobs: large tensors split so every thread has work
ALIGN_TENSOR = 64  # each tensor's copy starts on a cache line, as torch's allocator places them


class Snapshot:
    """One reusable snapshot buffer (host memory the size of the state)."""

    def __init__(self) -> None:
        self.buf: StagingBuffer | None = None

    @property
    def nbytes(self) -> int:
        return self.buf.size if self.buf else 0

    def take(self, shards: Sequence[Shard], threads: int = THREADS) -> list[Shard]:
        """Copies every tensor of `shards` into the buffer (on `threads` threads) and returns the
        same shards pointing at the copies. The copies hold until the next take: the save written
        from them must finish (or be cancelled) before then."""
        offsets: list[int] = []
        total = 0
        for s in shards:
            for t in s.tensors:
                offsets.append(total)
                total += -(-t.nbytes // ALIGN_TENSOR) * ALIGN_TENSOR
        if self.buf is None or self.buf.size < total:
            if self.buf is not None:
                self.buf.close()
            self.buf = StagingBuffer(max(total, 1))
        base = self.buf.address
        jobs: list[tuple[int, int, int]] = []  # (destination, source, length)
        out: list[Shard] = []
        k = 0
        for s in shards:
            copied = []
            for t in s.tensors:
                dst = base + offsets[k]
                for a in range(0, t.nbytes, PIECE):
                    jobs.append((dst + a, t.address + a, min(PIECE, t.nbytes - a)))
                copied.append(Tensor(t.name, t.dtype, list(t.shape), dst, t.nbytes, self.buf))
                k += 1
            out.append(Shard(s.name, copied, dict(s.metadata)))
        # memmove releases the GIL, so the copies run in parallel like the writer's gathers.
        run_jobs(jobs, threads, 0, lambda job, _st: ctypes.memmove(*job))
        return out

    def close(self) -> None:
        if self.buf is not None:
            self.buf.close()
            self.buf = None
