"""The checkpoint on disk: sharded safetensors files, hashed while written, committed atomically.

Layout of one checkpoint (a directory under the run's checkpoint root)::

    step_000001234/
        shard_000.safetensors      tensors of one group of layers (weights + their optimizer moments)
        ...
        MANIFEST.json              written last: every file with its size and XXH3-128 hash

The save is built in ``.tmp-step_…`` beside it, every file fsync'd, the manifest written and
fsync'd, then the directory renamed and its parent fsync'd. A directory without a manifest, or
with the temporary prefix, is never read as a checkpoint, so a crash at any moment leaves the
previous checkpoint as it was.

Writes go through page-aligned staging buffers with O_DIRECT where the filesystem allows it:
measured here, a buffered writer tops out near half the raw device speed because of the copy into
the page cache and dirty-page throttling (see ``bench/checkpoint_throughput.py``). The bytes are
hashed from the staging buffer, so the hash covers exactly what was handed to the disk. The copy
(``ctypes.memmove``), the hash and ``pwrite`` all release the GIL, so writer threads run in
parallel.

The tensor files are plain safetensors (the header is padded with spaces so tensor data starts on
a 4 KiB boundary, which the format allows), so ``safetensors.safe_open`` reads them too.

This module has no torch dependency: a tensor is anything with an address and a length.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import mmap
import os
import shutil
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xxhash

from holdover.train.registry import pid_alive

FORMAT = "holdover-ckpt/1"
MANIFEST = "MANIFEST.json"
TMP_PREFIX = ".tmp-"
ALIGN = 4096
CHUNK = 64 << 20  # large requests: O_DIRECT here ran 1.5 GB/s at 8 MiB, 2.9 GB/s at 64 MiB
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
    hash: str


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
                "files": [{"name": f.name, "size": f.size, "hash": f.hash} for f in self.files],
                "meta": self.meta,
            },
            indent=1,
        )

    @classmethod
    def parse(cls, text: str, where: Path) -> Manifest:
        try:
            d = json.loads(text)
            if d.get("format") != FORMAT:
                raise CheckpointError(f"{where}: unknown format {d.get('format')!r} (expected {FORMAT})")
            if d.get("hash") != HASH:
                raise CheckpointError(f"{where}: unknown hash {d.get('hash')!r}")
            files = [FileEntry(str(f["name"]), int(f["size"]), str(f["hash"])) for f in d["files"]]
            for f in files:
                if "/" in f.name or f.name.startswith("."):
                    raise CheckpointError(f"{where}: file name {f.name!r} escapes the checkpoint directory")
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
    """A page-aligned buffer (anonymous mmap) for O_DIRECT, one per writer thread."""

    def __init__(self, size: int = CHUNK) -> None:
        self.map = mmap.mmap(-1, size)
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


def _write_shard(
    path: Path, shard: Shard, staging: _Staging, direct: bool, advance: Callable[[int], None]
) -> FileEntry:
    fd, is_direct = _open_for_write(path, direct)
    hasher = xxhash.xxh3_128()
    buf, base = staging.view, staging.address
    fill = 0  # bytes staged in buf
    written = 0  # file offset of buf[0]

    def flush(final: bool) -> None:
        nonlocal fill, written
        if not fill:
            return
        hasher.update(buf[:fill])
        length = fill
        if is_direct and final and fill % ALIGN:
            # O_DIRECT writes whole blocks: pad the tail, then cut the file back to its true size.
            length = -(-fill // ALIGN) * ALIGN
            ctypes.memset(base + fill, 0, length - fill)
        view = buf[:length]
        done = 0
        while done < length:
            done += os.pwrite(fd, view[done:], written + done)
        written += fill
        advance(fill)
        fill = 0

    try:
        header = _header(shard)
        buf[: len(header)] = header
        fill = len(header)
        for t in shard.tensors:
            done = 0
            while done < t.nbytes:
                n = min(staging.size - fill, t.nbytes - done)
                ctypes.memmove(base + fill, t.address + done, n)
                fill += n
                done += n
                if fill == staging.size:
                    flush(final=False)
        flush(final=True)
        if is_direct:
            os.ftruncate(fd, written)
        os.fsync(fd)
    finally:
        os.close(fd)
    return FileEntry(path.name, written, hasher.hexdigest())


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
    threads: int = 4,
    direct: bool = True,
    progress: Progress | None = None,
) -> tuple[Path, Manifest]:
    """Write one checkpoint durably; returns its directory and manifest.

    `blobs` are small extra files (training state as JSON), hashed and listed like the shards.

    Raises CheckpointError (naming the file and the cause, e.g. a full disk) after removing the
    partial directory; nothing outside the new directory is ever touched.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    total = sum(s.nbytes for s in shards)
    final = root / step_dirname(step)
    n = 1
    while final.exists():
        # The same step saved twice (e.g. after a resume): keep both, never overwrite.
        n += 1
        final = root / f"{step_dirname(step)}.{n}"
    tmp = root / f"{TMP_PREFIX}{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    lock = threading.Lock()
    done_bytes = 0

    def advance(k: int) -> None:
        nonlocal done_bytes
        with lock:
            done_bytes += k
            d = done_bytes
        if progress:
            progress(d, total)

    stagings: list[_Staging] = []
    local = threading.local()

    def job(shard: Shard) -> FileEntry:
        st = getattr(local, "staging", None)
        if st is None:
            st = local.staging = _Staging()
            with lock:
                stagings.append(st)
        return _write_shard(tmp / shard.name, shard, st, direct, advance)

    try:
        # Largest first, so the last thread to finish is not the one that started the biggest file last.
        order = sorted(range(len(shards)), key=lambda i: -shards[i].nbytes)
        entries: list[FileEntry | None] = [None] * len(shards)
        with ThreadPoolExecutor(max_workers=max(1, min(threads, len(shards)))) as pool:
            futures = {i: pool.submit(job, shards[i]) for i in order}
            errors = []
            for i, fut in futures.items():
                try:
                    entries[i] = fut.result()
                except OSError as e:
                    errors.append((shards[i].name, e))
            if errors:
                name, e = errors[0]
                raise _explain(e, tmp / name, total, root) from None
        files = [e for e in entries if e]
        for name, data in (blobs or {}).items():
            try:
                _write_small(tmp / name, data)
            except OSError as e:
                raise _explain(e, tmp / name, total, root) from None
            files.append(FileEntry(name, len(data), xxhash.xxh3_128(data).hexdigest()))
        fsync_dir(tmp)
        manifest = Manifest(step, files, dict(meta or {}), time.time())
        manifest.seconds = round(time.monotonic() - t0, 6)
        try:
            _write_small(tmp / MANIFEST, manifest.to_json().encode())
            fsync_dir(tmp)
            os.rename(tmp, final)
            fsync_dir(root)
        except OSError as e:
            raise _explain(e, tmp / MANIFEST, total, root) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        for st in stagings:
            st.close()
    return final, manifest


def _explain(e: OSError, path: Path, total: int, root: Path) -> CheckpointError:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        try:
            free = _free_bytes(root)
        except OSError:
            free = -1
        return CheckpointError(
            f"disk full writing {path}: the checkpoint needs {total} bytes, {free} were free in {root}; "
            f"the previous checkpoint is untouched"
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


def _read_checked(path: Path, entry: FileEntry, direct: bool, whole: bool) -> mmap.mmap | None:
    """Read a file from the media (O_DIRECT where allowed), checking its size and hash.

    With `whole`, the file lands in one page-aligned buffer that is returned, so a loader uses
    the bytes it just verified; otherwise one chunk-sized buffer is reused (verification only).
    """
    size = _checked_size(path, entry)
    cap = -(-max(size, 1) // ALIGN) * ALIGN
    buf = _Staging(cap if whole else CHUNK)
    hasher = xxhash.xxh3_128()
    try:
        fd, _ = _open_for_read(path, direct)
        try:
            off = 0
            while off < size:
                start = off if whole else 0
                window = buf.view[start : start + min(CHUNK, buf.size - start)]
                n = os.preadv(fd, [window], off)
                if n <= 0:
                    raise CheckpointError(f"{path}: short read at {off} of {size} bytes")
                hasher.update(window[: min(n, size - off)])
                off += n
        finally:
            os.close(fd)
    except OSError as e:
        buf.close()
        raise CheckpointError(f"{path}: read failed: {e.strerror or e}") from None
    except BaseException:
        buf.close()
        raise
    if hasher.hexdigest() != entry.hash:
        buf.close()
        raise CheckpointError(f"{path}: hash mismatch (the file is damaged)")
    if not whole:
        buf.close()
        return None
    buf.view.release()
    return buf.map


def read_file(path: Path, entry: FileEntry, direct: bool = True) -> mmap.mmap:
    """Read one file whole and check size and hash; returns the buffer holding its bytes."""
    m = _read_checked(path, entry, direct, whole=True)
    assert m is not None
    return m


def verify(directory: Path | str, threads: int = 4, direct: bool = True) -> Manifest:
    """Check every file of a checkpoint against its manifest; raises CheckpointError naming the first bad file."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(manifest.files) or 1))) as pool:
        futures = [pool.submit(_read_checked, directory / f.name, f, direct, False) for f in manifest.files]
        for fut in futures:
            fut.result()
    return manifest


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
    """The newest checkpoint that verifies, telling `log` about each damaged one skipped."""
    for p in candidates(root):
        try:
            return p, verify(p)
        except CheckpointError as e:
            log(f"holdover: skipping damaged checkpoint {p.name}: {e}")
    return None


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
    for p in root.iterdir():
        if p.name.startswith(f"{TMP_PREFIX}trash-"):
            shutil.rmtree(p, ignore_errors=True)
        elif p.name.startswith(TMP_PREFIX):
            pid = p.name.rsplit("-", 1)[-1]
            if pid.isdigit() and not pid_alive(int(pid)):
                shutil.rmtree(p, ignore_errors=True)
    return removed
