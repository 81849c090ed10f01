"""The I/O engine under the writer and the reader: page-aligned staging buffers, O_DIRECT file
handles, and a pool of threads that runs chunk jobs round robin over files.

Why these sizes: requests of 32 MiB from 8 threads reached the device's parallel ceiling here
(fio's 4 jobs x queue depth 2); smaller requests cost more per byte, larger ones only more staging
memory. Figures: bench/checkpoint_throughput.py, docs/checkpoints.md.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import errno
import mmap
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# Requests of 32 MiB from 8 threads reached the device's parallel ceiling here (fio's 4 jobs x
# queue depth 2); smaller requests cost more per byte, larger ones only more staging memory.
CHUNK = 32 << 20
MIN_CHUNK = 4 << 20
THREADS = 8
STAGING = 512 << 20  # staging buffers used in turn, and kept by a saving process (why: run_jobs)


class StagingBuffer:
    """A page-aligned buffer (anonymous mmap) for O_DIRECT: one per I/O thread, or one per file read whole."""

    def __init__(self, size: int) -> None:
        self.map = mmap.mmap(-1, size)
        if size >= 2 << 20:
            # Fewer page faults on first touch: at several GB/s the 4 KiB faults were a visible share.
            with contextlib.suppress(AttributeError, OSError):
                self.map.madvise(mmap.MADV_HUGEPAGE)
        self.view = memoryview(self.map)
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        self.size = size

    def close(self) -> None:
        self.view.release()
        with contextlib.suppress(BufferError):
            self.map.close()


def open_for_write(path: Path, direct: bool) -> tuple[int, bool]:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
    if direct and hasattr(os, "O_DIRECT"):
        try:
            return os.open(path, flags | os.O_DIRECT, 0o644), True
        except OSError as e:
            # tmpfs and some FUSE filesystems refuse O_DIRECT; the buffered path is correct, only slower.
            if e.errno != errno.EINVAL:
                raise
    return os.open(path, flags, 0o644), False


def open_for_read(path: Path, direct: bool) -> tuple[int, bool]:
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
    if direct and hasattr(os, "O_DIRECT"):
        try:
            return os.open(path, flags | os.O_DIRECT), True
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
    return os.open(path, flags), False


_libc = ctypes.CDLL(None, use_errno=True)


def preallocate(fd: int, length: int) -> None:
    """Give the file its blocks (and size) before the chunks arrive. Writes inside the size are
    not extending writes, which ext4 serialises per file (the inode lock held for the whole
    I/O): one huge tensor's chunks then go down in parallel (measured: +14 % for a 2 GB tensor).
    fallocate(2) itself, not posix_fallocate, which writes zeros where it is not supported."""
    if length and _libc.fallocate(fd, 0, ctypes.c_long(0), ctypes.c_long(length)) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise OSError(err, os.strerror(err))


def chunk_size(total: int, threads: int) -> int:
    """Chunk length for a save of `total` bytes: several chunks per thread, so no thread idles on
    a small state, but no smaller than MIN_CHUNK (each request has a fixed cost)."""
    c = CHUNK
    while c > MIN_CHUNK and total < c * threads * 4:
        c //= 2
    return c


def interleaved(files: Sequence[Any]) -> list[tuple[Any, int]]:
    """Chunk jobs (a file being written or read, a chunk index), round robin over the files
    (largest first): threads running at the same moment mostly work on different files, which
    filesystems that serialise writers per inode prefer."""
    order = sorted(files, key=lambda f: -f.size)
    return [(f, r) for r in range(max((f.count for f in order), default=0)) for f in order if r < f.count]


class KeptBuffers:
    """Staging buffers a writing process keeps between saves. First touch of fresh memory ran at
    0.9-2.8 GB/s on this VM, so STAGING bytes of new buffers would cost an emergency save a
    visible share of its time; after the first save a training process pays it no more."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.free: list[StagingBuffer] = []

    def take(self, size: int) -> StagingBuffer:
        with self.lock:
            for i, st in enumerate(self.free):
                if st.size >= size:
                    return self.free.pop(i)
        return StagingBuffer(size)

    def give(self, st: StagingBuffer) -> None:
        with self.lock:
            if sum(s.size for s in self.free) + st.size <= STAGING:
                self.free.append(st)
                return
        st.close()


kept = KeptBuffers()


# Page-locks host memory (address, bytes) for a device's DMA; returns what undoes it.
PageLock = Callable[[int, int], Callable[[], None]]


def run_jobs(
    jobs: list[Any],
    threads: int,
    size: int,
    work: Callable[[Any, StagingBuffer], None],
    keep: bool = False,
    page_lock: PageLock | None = None,
) -> None:
    """Run work(job, staging) on `threads` threads; the first exception stops the others taking
    new jobs and is raised here.

    Staging buffers of `size` bytes are used in turn, least recently used first: the disk here
    ran 15-25 % slower, reading and writing alike, when a buffer went back to it soon (8 threads
    of 32 MiB writes, 4 GB in all: 256 MiB of buffers in turn 1.6-1.8 GB/s, 512 MiB 1.9-2.1,
    1 GiB 2.1; fio's best cell holds 1 GiB). Kept buffers (`keep`: a saving process keeps them
    for its next save) go up to STAGING bytes; new ones for a single call up to an eighth of the
    bytes they carry, as fresh memory costs about as much to touch as to read here."""
    it = iter(jobs)
    lock = threading.Lock()
    failed: list[BaseException] = []
    budget = STAGING if keep else min(STAGING, len(jobs) * size // 8)
    count = max(1, min(len(jobs), max(threads, budget // size))) if size else 0
    ring: collections.deque[StagingBuffer] = collections.deque(
        kept.take(size) if keep else StagingBuffer(size) for _ in range(count)
    )
    unlock: list[Callable[[], None]] = []

    def worker() -> None:
        try:
            while not failed:
                with lock:
                    job = next(it, None)
                    st = ring.popleft() if job is not None and count else None
                if job is None:
                    return
                try:
                    work(job, st)  # type: ignore[arg-type]
                finally:
                    if st is not None:
                        with lock:
                            ring.append(st)
        except BaseException as e:  # handed to the caller, whatever it is
            failed.append(e)

    n = max(1, min(threads, len(jobs)))
    try:
        # Locked for this call only: a kept buffer goes back unlocked, as its other users expect.
        for st in ring if page_lock is not None else ():
            unlock.append(page_lock(st.address, st.size))
        if n == 1:
            worker()
        else:
            pool = [threading.Thread(target=worker, name=f"holdover-io-{k}", daemon=True) for k in range(n)]
            for t in pool:
                t.start()
            for t in pool:
                t.join()
    finally:
        for undo in unlock:
            undo()
        for st in ring:
            if keep:
                kept.give(st)
            else:
                st.close()
    if failed:
        raise failed[0]
