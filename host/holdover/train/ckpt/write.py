"""Writing a checkpoint: every file cut into chunks, each gathered from the tensors' memory into a
staging buffer, hashed there and written; fsync'd together, the manifest last, then one rename."""

from __future__ import annotations

import bisect
import ctypes
import errno
import os
import shutil
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import xxhash

from holdover.files import fsync_dir, write_atomic
from holdover.train.ckpt.engine import (
    THREADS,
    StagingBuffer,
    chunk_size,
    interleaved,
    open_for_write,
    preallocate,
    run_jobs,
)
from holdover.train.ckpt.format import (
    ALIGN,
    MANIFEST,
    TMP_PREFIX,
    CheckpointError,
    FileEntry,
    Manifest,
    Progress,
    Shard,
    combine,
    round_up,
    safetensors_header,
    step_dirname,
)
from holdover.train.registry import pid_alive


class FileWriter:
    """One file on its way to disk: where each of its bytes comes from, and its chunks' hashes.

    A file is a list of pieces (file offset, source address, length): the safetensors header and
    then each tensor's memory, or one small blob. A chunk is gathered from the pieces it covers,
    so any thread can write any chunk of any file without waiting for another.
    """

    def __init__(self, path: Path, parts: list[tuple[int, int]], keep: Any, image: memoryview | None = None) -> None:
        self.path = path
        self.image = image  # the file's bytes laid out in memory (Shard.image): chunks go from there
        self.pieces: list[tuple[int, int, int]] = []
        offset = 0
        for address, n in parts:
            if n:
                self.pieces.append((offset, address, n))
                offset += n
        self.starts = [p[0] for p in self.pieces]
        self.size = offset
        self.chunk = self.count = 0
        self.hashes: list[str] = []
        self.fd = -1
        self.direct = False
        self.keep = keep  # the header / blob buffers the pieces point into

    @classmethod
    def shard(cls, directory: Path, shard: Shard) -> FileWriter:
        on_device = next((t for t in shard.tensors if t.device != "cpu"), None)
        if on_device is not None:
            # Its address is not host memory: reading it would fault, not fail.
            raise CheckpointError(f"{shard.name}: {on_device.name} is on {on_device.device}, not staged to host memory")
        header = safetensors_header(shard)
        if shard.image is not None:
            size = len(header) + shard.nbytes
            if len(shard.image) < round_up(size) or shard.image[: len(header)] != header:
                raise CheckpointError(f"{shard.name}: its image in memory is not its file (a snapshot laid out wrong)")
            # One part of the file's size; gather never runs on an image, so it has no address.
            return cls(directory / shard.name, [(0, size)], shard, shard.image)
        hbuf = ctypes.create_string_buffer(header, len(header))
        parts = [(ctypes.addressof(hbuf), len(header))] + [(t.address, t.nbytes) for t in shard.tensors]
        return cls(directory / shard.name, parts, (hbuf, shard))

    @classmethod
    def blob(cls, directory: Path, name: str, data: bytes) -> FileWriter:
        buf = ctypes.create_string_buffer(data, len(data))
        return cls(directory / name, [(ctypes.addressof(buf), len(data))], buf)

    def cut(self, chunk: int) -> None:
        self.chunk = chunk
        self.count = max(1, -(-self.size // chunk))
        self.hashes = [""] * self.count

    @property
    def on_disk(self) -> int:
        """Room it takes: whole blocks, and one more for the filesystem's own bookkeeping."""
        return round_up(self.size) + ALIGN

    def gather(self, i: int, dst: int) -> int:
        """Copy chunk i's bytes to address dst; returns its length."""
        a = i * self.chunk
        b = min(a + self.chunk, self.size)
        k = bisect.bisect_right(self.starts, a) - 1
        pos = a
        while pos < b:
            off, address, n = self.pieces[k]
            lo = pos - off
            take = min(n - lo, b - pos)
            ctypes.memmove(dst + (pos - a), address + lo, take)  # releases the GIL
            pos += take
            k += 1
        return b - a

    def entry(self) -> FileEntry:
        return FileEntry(self.path.name, self.size, combine(self.hashes), self.chunk, list(self.hashes))


def _write_chunk(f: FileWriter, i: int, st: StagingBuffer) -> int:
    base = i * f.chunk
    if f.image is not None:
        n = min(f.chunk, f.size - base)
        src = f.image[base:]  # zero-padded to its block's end already
    else:
        n = f.gather(i, st.address)
        src = st.view
        if f.direct and n % ALIGN:
            # O_DIRECT writes whole blocks: pad the tail; the file is cut back to its size when done.
            ctypes.memset(st.address + n, 0, round_up(n) - n)
    f.hashes[i] = xxhash.xxh3_128(src[:n]).hexdigest()  # the bytes handed to the disk
    length = round_up(n) if f.direct else n
    view = src[:length]
    done = 0
    while done < length:
        done += os.pwrite(f.fd, view[done:], base + done)
    return n


def _free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def save(
    root: Path | str,
    step: int,
    shards: Sequence[Shard],
    meta: dict[str, Any] | None = None,
    blobs: dict[str, bytes] | None = None,
    threads: int = THREADS,
    direct: bool = True,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> tuple[Path, Manifest]:
    """Write one checkpoint durably; returns its directory and manifest.

    `blobs` are small extra files (training state as JSON), hashed and listed like the shards.
    Every file is cut into chunks written by `threads` threads at once, each chunk hashed from the
    buffer handed to the disk.

    Raises CheckpointError (naming the file and the cause) after removing the partial directory;
    nothing outside the new directory is touched, except dead writers' leftovers when the space
    they hold is needed. A save that cannot fit is refused before any byte is written. `cancel`
    set stops the save at its next chunk (CheckpointError, the partial directory removed): a
    background save giving the disk to an emergency one.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    final = root / step_dirname(step)
    n = 1
    while final.exists():
        # The same step saved twice (e.g. after a resume): keep both, never overwrite.
        n += 1
        final = root / f"{step_dirname(step)}.{n}"
    tmp = root / f"{TMP_PREFIX}{final.name}-{_writer_tag()}"
    files = [FileWriter.shard(tmp, s) for s in shards]
    files += [FileWriter.blob(tmp, name, data) for name, data in (blobs or {}).items()]
    total = sum(f.size for f in files)  # what progress counts: headers included
    chunk = chunk_size(total, threads)
    for f in files:
        f.cut(chunk)
    # Two more blocks for the manifest.
    free_before = _make_room(root, sum(f.on_disk for f in files) + 2 * ALIGN)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    lock = threading.Lock()
    done_bytes = 0

    def work(job: tuple[FileWriter, int], st: StagingBuffer) -> None:
        nonlocal done_bytes
        f, i = job
        if cancel is not None and cancel.is_set():
            raise CheckpointError(f"{tmp}: cancelled")
        try:
            k = _write_chunk(f, i, st)
            with lock:
                done_bytes += k
                d = done_bytes
            if progress:
                progress(d, total)
        except OSError as e:
            raise _explain(e, f.path, total, root, free_before) from None

    try:
        try:
            for f in files:
                f.fd, f.direct = open_for_write(f.path, direct)
                if f.direct:
                    preallocate(f.fd, round_up(f.size))
            run_jobs(interleaved(files), threads, chunk, work, keep=True)
            # Durable only now, all together: an fsync while other threads still write forces a
            # journal commit their block allocations wait behind (measured: +5 % this way). The
            # first fsync commits the allocations of every file; the others find nothing left.
            for f in files:
                if f.direct and f.size % ALIGN:
                    os.ftruncate(f.fd, f.size)
                os.fsync(f.fd)
                if not f.direct:
                    # Clean after the fsync: dropped, so a checkpoint does not push the training's
                    # own data out of the page cache (what O_DIRECT never puts there).
                    os.posix_fadvise(f.fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError as e:
            raise _explain(e, tmp, total, root, free_before) from None
        finally:
            for f in files:
                if f.fd >= 0:
                    os.close(f.fd)
        fsync_dir(tmp)
        if cancel is not None and cancel.is_set():
            raise CheckpointError(f"{tmp}: cancelled")
        meta = dict(meta or {})
        # How the bytes went to the disk (O_DIRECT may be refused, as by tmpfs): what iomode learns from.
        meta["io"] = "direct" if all(f.direct for f in files if f.size) else "buffered"
        manifest = Manifest(step, [f.entry() for f in files], meta, time.time())
        manifest.seconds = round(time.monotonic() - t0, 6)
        try:
            write_atomic(tmp / MANIFEST, manifest.to_json())  # fsync'd, and the directory with it
            os.rename(tmp, final)
            fsync_dir(root)
        except OSError as e:
            raise _explain(e, tmp / MANIFEST, total, root, free_before) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final, manifest


def _writer_tag() -> str:
    # host and pid: a temporary directory is only ever judged dead by a writer on its own host.
    return f"{os.getpid()}@{socket.gethostname()}"


def _dead_writer(name: str) -> bool:
    tag = name.rsplit("-", 1)[-1]
    pid, _, host = tag.partition("@")
    if host and host != socket.gethostname():
        return False
    return pid.isdigit() and not pid_alive(int(pid))


def leftovers(root: Path) -> list[Path]:
    """Temporary directories of writers that died on this host, and trash a prune left behind."""
    out = []
    for p in root.iterdir():
        if p.name.startswith(f"{TMP_PREFIX}trash-") or (p.name.startswith(TMP_PREFIX) and _dead_writer(p.name)):
            out.append(p)
    return out


def _make_room(root: Path, need: int) -> int:
    """Check that `need` bytes fit before writing any; reclaims dead writers' leftovers first if
    they do not. Returns the free space before the attempt (for messages)."""
    free = _free_bytes(root)
    if free >= need:
        return free
    for p in leftovers(root):
        shutil.rmtree(p, ignore_errors=True)
    free = _free_bytes(root)
    if free < need:
        raise CheckpointError(
            f"disk full: the checkpoint needs {need} bytes, {free} are free in {root}; "
            f"nothing was written and the previous checkpoint is untouched"
        )
    return free


def _explain(e: OSError, path: Path, total: int, root: Path, free_before: int) -> CheckpointError:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return CheckpointError(
            f"disk full writing {path}: the checkpoint needs {total} bytes, {free_before} were free in {root} "
            f"before the attempt (something else is writing there too); the previous checkpoint is untouched"
        )
    return CheckpointError(f"cannot write {path}: {e.strerror or e}")
