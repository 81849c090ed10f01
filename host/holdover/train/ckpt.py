"""The checkpoint on disk: sharded safetensors files, hashed while written, committed atomically.

Layout of one checkpoint (a directory under the run's checkpoint root)::

    step_000001234/
        shard_000.safetensors      tensors of one group of layers (weights + their optimizer moments)
        ...
        MANIFEST.json              written last: every file with its size, chunk length and the
                                   XXH3-128 of each chunk

The save is built in ``.tmp-step_…-<pid>@<host>`` beside it, every file fsync'd, the manifest
written and fsync'd, then the directory renamed and its parent fsync'd. A directory without a
manifest, or with the temporary prefix, is never read as a checkpoint, so a crash at any moment
leaves the previous checkpoint as it was.

Every file is cut into chunks (up to CHUNK bytes), and THREADS threads write any chunk of any file:
each gathers its chunk's bytes from the tensors into a page-aligned staging buffer (STAGING bytes of
them go round, least recently used first), hashes them there (so the hash covers exactly what
was handed to the disk) and writes them with O_DIRECT where the filesystem allows it. A chunk's
hash does not depend on any other chunk, so no thread waits for another; one huge tensor is
written as fast as many small ones. The copy
(``ctypes.memmove``), the hash and ``pwrite`` all release the GIL. Reading back (``verify`` and the
loader share one reader) is the same in reverse: parallel O_DIRECT reads of chunks, each checked.
Measured figures and how they were taken: ``bench/checkpoint_throughput.py``, docs/checkpoints.md.

The tensor files are plain safetensors (the header is padded with spaces so tensor data starts on
a 4 KiB boundary, which the format allows), so ``safetensors.safe_open`` reads them too.

This module has no torch dependency: a tensor is anything with an address and a length.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import ctypes
import errno
import json
import mmap
import os
import shutil
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xxhash

from holdover.train.registry import pid_alive

FORMAT = "holdover-ckpt/2"  # /2: files cut into chunks, each hashed (/1: one hash per file, still read)
FORMATS = ("holdover-ckpt/1", FORMAT)
MANIFEST = "MANIFEST.json"
TMP_PREFIX = ".tmp-"
DAMAGED_PREFIX = "damaged-"  # a checkpoint that failed its check, set aside for inspection
ALIGN = 4096
# Requests of 32 MiB from 8 threads reached the device's parallel ceiling here (fio's 4 jobs x
# queue depth 2); smaller requests cost more per byte, larger ones only more staging memory.
CHUNK = 32 << 20
MIN_CHUNK = 4 << 20
THREADS = 8
STAGING = 512 << 20  # staging buffers used in turn, and kept by a saving process (why: _run_jobs)
HASH = "xxh3_128"


class CheckpointError(Exception):
    """A save or load that could not be done; the message names the file and the cause."""


@dataclass
class Tensor:
    """One tensor's raw bytes: where they are in memory, and how safetensors describes them."""

    name: str
    dtype: str  # safetensors dtype code: F32, BF16, I64, ...
    shape: list[int]
    address: int
    nbytes: int
    keepalive: Any = None  # the object owning the memory, held until the write is done

    @classmethod
    def from_buffer(cls, name: str, dtype: str, shape: list[int], buf: bytes | bytearray | memoryview) -> Tensor:
        # A private writable copy: from_buffer needs write access, and the caller may reuse buf.
        owned = bytearray(buf)
        address = ctypes.addressof(ctypes.c_char.from_buffer(owned)) if owned else 0
        return cls(name, dtype, shape, address, len(owned), owned)


@dataclass
class Shard:
    name: str  # file name without directory, e.g. shard_000.safetensors
    tensors: list[Tensor]
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


@dataclass
class FileEntry:
    name: str
    size: int
    hash: str  # format 2: combine(chunks); format 1: XXH3-128 of the whole file
    chunk: int = 0  # bytes per chunk (the last may be shorter); 0 in format 1
    chunks: list[str] = field(default_factory=list)


@dataclass
class Manifest:
    step: int
    files: list[FileEntry]
    meta: dict[str, Any]
    created: float
    seconds: float = 0.0
    format: str = FORMAT
    hash: str = HASH

    @property
    def nbytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": self.format,
                "step": self.step,
                "created": self.created,
                "seconds": self.seconds,
                "hash": self.hash,
                "files": [
                    {"name": f.name, "size": f.size, "hash": f.hash, "chunk": f.chunk, "chunks": f.chunks}
                    for f in self.files
                ],
                "meta": self.meta,
            },
            indent=1,
        )

    @classmethod
    def parse(cls, text: str, where: Path) -> Manifest:
        try:
            d = json.loads(text)
            if d.get("format") not in FORMATS:
                raise CheckpointError(f"{where}: unknown format {d.get('format')!r} (expected {FORMAT})")
            if d.get("hash") != HASH:
                raise CheckpointError(f"{where}: unknown hash {d.get('hash')!r}")
            chunked = d["format"] != FORMATS[0]
            files = []
            for f in d["files"]:
                e = FileEntry(str(f["name"]), int(f["size"]), str(f["hash"]))
                if chunked:
                    e.chunk, e.chunks = int(f["chunk"]), [str(h) for h in f["chunks"]]
                    if e.chunk <= 0 or e.chunk % ALIGN or len(e.chunks) != max(1, -(-e.size // e.chunk)):
                        raise CheckpointError(f"{where}: {e.name}: chunk list does not match its size")
                    if combine(e.chunks) != e.hash:
                        raise CheckpointError(f"{where}: {e.name}: chunk hashes do not match the file's hash")
                if "/" in e.name or e.name.startswith("."):
                    raise CheckpointError(f"{where}: file name {e.name!r} escapes the checkpoint directory")
                files.append(e)
            return cls(int(d["step"]), files, dict(d.get("meta", {})), float(d["created"]), float(d.get("seconds", 0)))
        except CheckpointError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"{where}: manifest is not valid: {e!r}") from None


Progress = Callable[[int, int], None]  # (bytes done, bytes total)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _header(shard: Shard) -> bytes:
    entries: dict[str, Any] = {}
    offset = 0
    for t in shard.tensors:
        entries[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    if shard.metadata:
        entries["__metadata__"] = dict(shard.metadata)
    raw = json.dumps(entries, separators=(",", ":")).encode()
    # Pad with spaces so the data section begins on an ALIGN boundary (8-byte length prefix + header).
    padded = -(-(8 + len(raw)) // ALIGN) * ALIGN - 8
    raw += b" " * (padded - len(raw))
    return struct.pack("<Q", len(raw)) + raw


class _Staging:
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


def _open_for_write(path: Path, direct: bool) -> tuple[int, bool]:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
    if direct and hasattr(os, "O_DIRECT"):
        try:
            return os.open(path, flags | os.O_DIRECT, 0o644), True
        except OSError as e:
            # tmpfs and some FUSE filesystems refuse O_DIRECT; the buffered path is correct, only slower.
            if e.errno != errno.EINVAL:
                raise
    return os.open(path, flags, 0o644), False


_libc = ctypes.CDLL(None, use_errno=True)


def _preallocate(fd: int, length: int) -> None:
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


def combine(chunks: Sequence[str]) -> str:
    """A chunked file's own hash: XXH3-128 over its chunk hashes, so a file has one identity."""
    return xxhash.xxh3_128(b"".join(bytes.fromhex(h) for h in chunks)).hexdigest()


class _Out:
    """One file on its way to disk: where each of its bytes comes from, and its chunks' hashes.

    A file is a list of pieces (file offset, source address, length): the safetensors header and
    then each tensor's memory, or one small blob. A chunk is gathered from the pieces it covers,
    so any thread can write any chunk of any file without waiting for another.
    """

    def __init__(self, path: Path, parts: list[tuple[int, int]], keep: Any) -> None:
        self.path = path
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
    def shard(cls, directory: Path, shard: Shard) -> _Out:
        header = _header(shard)
        hbuf = ctypes.create_string_buffer(header, len(header))
        parts = [(ctypes.addressof(hbuf), len(header))] + [(t.address, t.nbytes) for t in shard.tensors]
        return cls(directory / shard.name, parts, (hbuf, shard))

    @classmethod
    def blob(cls, directory: Path, name: str, data: bytes) -> _Out:
        buf = ctypes.create_string_buffer(data, len(data))
        return cls(directory / name, [(ctypes.addressof(buf), len(data))], buf)

    def cut(self, chunk: int) -> None:
        self.chunk = chunk
        self.count = max(1, -(-self.size // chunk))
        self.hashes = [""] * self.count

    @property
    def on_disk(self) -> int:
        """Room it takes: whole blocks, and one more for the filesystem's own bookkeeping."""
        return -(-self.size // ALIGN) * ALIGN + ALIGN

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


def _write_chunk(f: _Out, i: int, st: _Staging) -> int:
    n = f.gather(i, st.address)
    f.hashes[i] = xxhash.xxh3_128(st.view[:n]).hexdigest()  # the bytes handed to the disk
    length = n
    if f.direct and n % ALIGN:
        # O_DIRECT writes whole blocks: pad the tail; the file is cut back to its size when done.
        length = -(-n // ALIGN) * ALIGN
        ctypes.memset(st.address + n, 0, length - n)
    view = st.view[:length]
    base = i * f.chunk
    done = 0
    while done < length:
        done += os.pwrite(f.fd, view[done:], base + done)
    return n


def _interleaved(files: Sequence[Any]) -> list[tuple[Any, int]]:
    """Chunk jobs (a file being written or read, a chunk index), round robin over the files
    (largest first): threads running at the same moment mostly work on different files, which
    filesystems that serialise writers per inode prefer."""
    order = sorted(files, key=lambda f: -f.size)
    return [(f, r) for r in range(max((f.count for f in order), default=0)) for f in order if r < f.count]


class _Kept:
    """Staging buffers a writing process keeps between saves. First touch of fresh memory ran at
    0.9-2.8 GB/s on this VM, so STAGING bytes of new buffers would cost an emergency save a
    visible share of its time; after the first save a training process pays it no more."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.free: list[_Staging] = []

    def take(self, size: int) -> _Staging:
        with self.lock:
            for i, st in enumerate(self.free):
                if st.size >= size:
                    return self.free.pop(i)
        return _Staging(size)

    def give(self, st: _Staging) -> None:
        with self.lock:
            if sum(s.size for s in self.free) + st.size <= STAGING:
                self.free.append(st)
                return
        st.close()


_kept = _Kept()


def _run_jobs(
    jobs: list[Any], threads: int, size: int, work: Callable[[Any, _Staging], None], keep: bool = False
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
    ring: collections.deque[_Staging] = collections.deque(
        _kept.take(size) if keep else _Staging(size) for _ in range(count)
    )

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
        if n == 1:
            worker()
        else:
            pool = [threading.Thread(target=worker, name=f"holdover-io-{k}", daemon=True) for k in range(n)]
            for t in pool:
                t.start()
            for t in pool:
                t.join()
    finally:
        for st in ring:
            if keep:
                _kept.give(st)
            else:
                st.close()
    if failed:
        raise failed[0]


def step_dirname(step: int) -> str:
    return f"step_{step:09d}"


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
) -> tuple[Path, Manifest]:
    """Write one checkpoint durably; returns its directory and manifest.

    `blobs` are small extra files (training state as JSON), hashed and listed like the shards.
    Every file is cut into chunks written by `threads` threads at once, each chunk hashed from the
    buffer handed to the disk.

    Raises CheckpointError (naming the file and the cause) after removing the partial directory;
    nothing outside the new directory is touched, except dead writers' leftovers when the space
    they hold is needed. A save that cannot fit is refused before any byte is written.
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
    files = [_Out.shard(tmp, s) for s in shards]
    files += [_Out.blob(tmp, name, data) for name, data in (blobs or {}).items()]
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

    def work(job: tuple[_Out, int], st: _Staging) -> None:
        nonlocal done_bytes
        f, i = job
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
                f.fd, f.direct = _open_for_write(f.path, direct)
                if f.direct:
                    _preallocate(f.fd, -(-f.size // ALIGN) * ALIGN)
            _run_jobs(_interleaved(files), threads, chunk, work, keep=True)
            # Durable only now, all together: an fsync while other threads still write forces a
            # journal commit their block allocations wait behind (measured: +5 % this way). The
            # first fsync commits the allocations of every file; the others find nothing left.
            for f in files:
                if f.direct and f.size % ALIGN:
                    os.ftruncate(f.fd, f.size)
                os.fsync(f.fd)
        except OSError as e:
            raise _explain(e, tmp, total, root, free_before) from None
        finally:
            for f in files:
                if f.fd >= 0:
                    os.close(f.fd)
        fsync_dir(tmp)
        manifest = Manifest(step, [f.entry() for f in files], dict(meta or {}), time.time())
        manifest.seconds = round(time.monotonic() - t0, 6)
        try:
            _write_small(tmp / MANIFEST, manifest.to_json().encode())
            fsync_dir(tmp)
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


def _leftovers(root: Path) -> list[Path]:
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
    for p in _leftovers(root):
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


def _write_small(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


# --- reading -----------------------------------------------------------------------------------


def read_manifest(directory: Path) -> Manifest:
    path = directory / MANIFEST
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise CheckpointError(f"{directory}: no {MANIFEST} (the save did not finish)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: unreadable: {e}") from None
    return Manifest.parse(text, path)


def _open_for_read(path: Path, direct: bool) -> tuple[int, bool]:
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
    if direct and hasattr(os, "O_DIRECT"):
        try:
            return os.open(path, flags | os.O_DIRECT), True
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
    return os.open(path, flags), False


def _checked_size(path: Path, entry: FileEntry) -> int:
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    if size != entry.size:
        raise CheckpointError(f"{path}: size {size} bytes, the manifest says {entry.size}")
    return size


class _In:
    """One file being read back: its descriptor, where its bytes land, and what they must hash to."""

    def __init__(self, path: Path, entry: FileEntry, whole: bool) -> None:
        self.path = path
        self.entry = entry
        self.size = _checked_size(path, entry)
        # Format 1 files have one hash over the whole file: one job reads them front to back.
        self.chunk = entry.chunk or max(self.size, 1)
        self.count = len(entry.chunks) if entry.chunk else 1
        self.fd = -1
        self.buf = _Staging(-(-max(self.size, 1) // ALIGN) * ALIGN) if whole else None


def _read_chunk(f: _In, i: int, st: _Staging | None) -> None:
    a = i * f.chunk
    b = min(a + f.chunk, f.size)
    hasher = xxhash.xxh3_128()
    off = a
    try:
        while off < b:
            if f.buf is not None:
                # Up to this chunk's end (block-rounded), never into the next chunk: that one is
                # another thread's, and reading it here too would read it twice.
                window = f.buf.view[off : min(off + CHUNK, -(-b // ALIGN) * ALIGN, f.buf.size)]
            else:
                assert st is not None
                window = st.view[: min(CHUNK, -(-(b - off) // ALIGN) * ALIGN)]
            got = os.preadv(f.fd, [window], off)
            if got <= 0:
                raise CheckpointError(f"{f.path}: short read at {off} of {f.size} bytes")
            hasher.update(window[: min(got, b - off)])
            off += got
    except OSError as e:
        raise CheckpointError(f"{f.path}: read failed: {e.strerror or e}") from None
    want = f.entry.chunks[i] if f.entry.chunk else f.entry.hash
    if hasher.hexdigest() != want:
        where = f" (bytes {a}-{b})" if f.count > 1 else ""
        raise CheckpointError(f"{f.path}: hash mismatch{where} (the file is damaged)")


def _read_job(job: tuple[_In, int], st: _Staging) -> None:
    _read_chunk(job[0], job[1], st)


def _read(
    directory: Path, threads: int, direct: bool, whole: bool, keep: bool = False
) -> tuple[Manifest, dict[str, mmap.mmap]]:
    """The one reader behind verify and load: every chunk of every file read from the media
    (O_DIRECT where allowed) by `threads` threads at once and checked against the manifest."""
    manifest = read_manifest(directory)
    files: list[_In] = []
    try:
        for entry in manifest.files:
            files.append(_In(directory / entry.name, entry, whole))
            try:
                files[-1].fd, _ = _open_for_read(files[-1].path, direct)
            except OSError as e:
                raise CheckpointError(f"{files[-1].path}: cannot open: {e.strerror or e}") from None
        # Staging as long as the longest chunk, block-rounded (format 1 files are read in CHUNK pieces).
        longest = max((min(f.chunk, f.size) for f in files), default=0)
        size = 0 if whole else min(CHUNK, max(ALIGN, -(-longest // ALIGN) * ALIGN))
        _run_jobs(_interleaved(files), threads, size, _read_job, keep=keep)
    except BaseException:
        for f in files:
            if f.buf is not None:
                f.buf.close()
        raise
    finally:
        for f in files:
            if f.fd >= 0:
                os.close(f.fd)
    out: dict[str, mmap.mmap] = {}
    for f in files:
        if f.buf is not None:
            f.buf.view.release()
            out[f.entry.name] = f.buf.map
    return manifest, out


def verify(directory: Path | str, threads: int = THREADS, direct: bool = True, keep_buffers: bool = False) -> Manifest:
    """Check every byte of a checkpoint against its manifest; raises CheckpointError naming the first bad file.

    `keep_buffers`: keep the staging buffers for this process's next save or verify (a training
    process that saves keeps them anyway); a daemon verifying now and then lets them go."""
    return _read(Path(directory), threads, direct, whole=False, keep=keep_buffers)[0]


def read_all(
    directory: Path | str, threads: int = THREADS, direct: bool = True
) -> tuple[Manifest, dict[str, mmap.mmap]]:
    """Read and check a whole checkpoint; each file's bytes in a buffer of its own (the loader
    builds tensors on them, so what it uses is exactly what was checked)."""
    return _read(Path(directory), threads, direct, whole=True)


def candidates(root: Path | str) -> list[Path]:
    """Committed checkpoint directories under root, newest step first (not yet verified)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith("step_") and (p / MANIFEST).exists():
            head, _, n = p.name.partition(".")
            try:
                step = int(head[5:])
                gen = int(n) if n else 1
            except ValueError:
                continue
            found.append((step, gen, p))
    found.sort(reverse=True)
    return [p for _, _, p in found]


def newest_verified(root: Path | str, log: Callable[[str], None] = print) -> tuple[Path, Manifest] | None:
    """The newest checkpoint that verifies, telling `log` about each damaged one skipped (a
    read-only look: nothing is moved; `Guard.resume` sets damaged ones aside)."""
    for p in candidates(root):
        try:
            return p, verify(p)
        except CheckpointError as e:
            log(f"holdover: skipping damaged checkpoint {p.name}: {e}")
    return None


def set_aside(directory: Path | str, why: str) -> Path:
    """Rename a damaged checkpoint out of the rotation (``damaged-step_…``), with the reason in a
    DAMAGED file beside its files: kept for inspection, never read, never counted by `keep`,
    never pruned."""
    directory = Path(directory)
    target = directory.with_name(DAMAGED_PREFIX + directory.name)
    n = 1
    while target.exists():
        n += 1
        target = directory.with_name(f"{DAMAGED_PREFIX}{directory.name}~{n}")
    os.rename(directory, target)
    with contextlib.suppress(OSError):
        (target / "DAMAGED").write_text(f"{why}\nset aside at {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n")
    fsync_dir(directory.parent)
    return target


def parse_header(buf: mmap.mmap | bytes, path: Path) -> tuple[dict[str, Any], int]:
    """The safetensors header of a file read into buf, and where its data section starts."""
    if len(buf) < 8:
        raise CheckpointError(f"{path}: too short for a safetensors header")
    (n,) = struct.unpack_from("<Q", buf, 0)
    if n > 100 << 20 or 8 + n > len(buf):
        raise CheckpointError(f"{path}: header length {n} is not plausible")
    try:
        header = json.loads(bytes(buf[8 : 8 + n]))
    except ValueError as e:
        raise CheckpointError(f"{path}: header is not JSON: {e}") from None
    return header, 8 + n


TRAIN_JSON = "train.json"  # the training state beside the shards (step, RNG, data position, ...)
PIN = "PINNED"  # in a checkpoint directory: rotation never removes it (emergency saves)


def pin(directory: Path | str, reason: str) -> None:
    """Keep this checkpoint out of rotation: it is what an outage was survived with. Outside the
    manifest, so pinning and unpinning (deleting the file) never change what verifies."""
    directory = Path(directory)
    with open(directory / PIN, "w") as f:
        json.dump({"reason": reason, "at": time.time()}, f)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(directory)


def pinned(directory: Path | str) -> bool:
    return (Path(directory) / PIN).exists()


def prune(root: Path | str, keep: int, protect: Iterable[Path] = ()) -> list[Path]:
    """Remove all but the newest `keep` committed checkpoints that are not pinned (and stale
    temporaries of dead writers). Pinned ones are kept and not counted."""
    root = Path(root)
    removed = []
    rotating = [p for p in candidates(root) if not pinned(p)]
    keepers = set(rotating[: max(1, keep)]) | {Path(p) for p in protect}
    for p in rotating:
        if p not in keepers:
            # Rename first so a crash mid-delete never leaves a half-deleted dir that looks committed.
            trash = root / f"{TMP_PREFIX}trash-{p.name}"
            os.rename(p, trash)
            shutil.rmtree(trash, ignore_errors=True)
            removed.append(p)
    for p in _leftovers(root):
        shutil.rmtree(p, ignore_errors=True)
    return removed
