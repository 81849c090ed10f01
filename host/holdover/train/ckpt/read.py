"""Reading a checkpoint back: one reader behind verify and the loader, every chunk of every file
read from the media in parallel and checked against the manifest."""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import xxhash

from holdover.train.ckpt.engine import CHUNK, THREADS, PageLock, StagingBuffer, interleaved, open_for_read, run_jobs
from holdover.train.ckpt.format import (
    ALIGN,
    MANIFEST,
    CheckpointError,
    FileEntry,
    Manifest,
    parse_header,
    round_up,
)


def read_manifest(directory: Path) -> Manifest:
    path = directory / MANIFEST
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise CheckpointError(f"{directory}: no {MANIFEST} (the save did not finish)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: unreadable: {e}") from None
    return Manifest.parse(text, path)


def _checked_size(path: Path, entry: FileEntry) -> int:
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    if size != entry.size:
        raise CheckpointError(f"{path}: size {size} bytes, the manifest says {entry.size}")
    return size


Deliver = Callable[[str, int, memoryview], None]


class FileReader:
    """One file being read back: its descriptor, where its bytes land, and what they must hash to."""

    def __init__(self, path: Path, entry: FileEntry, whole: bool, deliver: Deliver | None = None) -> None:
        self.path = path
        self.entry = entry
        self.deliver = deliver  # each chunk, once checked, handed on from the staging buffer
        self.size = _checked_size(path, entry)
        # Format 1 files have one hash over the whole file: one job reads them front to back.
        self.chunk = entry.chunk or max(self.size, 1)
        self.count = len(entry.chunks) if entry.chunk else 1
        self.fd = -1
        self.buf = StagingBuffer(round_up(max(self.size, 1))) if whole else None


def _read_chunk(f: FileReader, i: int, st: StagingBuffer | None) -> None:
    a = i * f.chunk
    b = min(a + f.chunk, f.size)
    hasher = xxhash.xxh3_128()
    off = a
    try:
        while off < b:
            if f.buf is not None:
                # Up to this chunk's end (block-rounded), never into the next chunk: that one is
                # another thread's, and reading it here too would read it twice.
                window = f.buf.view[off : min(off + CHUNK, round_up(b), f.buf.size)]
            elif f.deliver is not None:
                assert st is not None
                # The whole chunk in staging, so what is handed on is exactly what was checked.
                window = st.view[off - a : round_up(b - a)]
            else:
                assert st is not None
                window = st.view[: min(CHUNK, round_up(b - off))]
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
    if f.deliver is not None:
        assert st is not None
        f.deliver(f.entry.name, a, st.view[: b - a])


def _read_job(job: tuple[FileReader, int], st: StagingBuffer) -> None:
    _read_chunk(job[0], job[1], st)


def _read(
    directory: Path,
    threads: int,
    direct: bool,
    whole: bool,
    keep: bool = False,
    deliver: Deliver | None = None,
    manifest: Manifest | None = None,
    page_lock: PageLock | None = None,
) -> tuple[Manifest, dict[str, mmap.mmap]]:
    """The one reader behind verify and load: every chunk of every file read from the media
    (O_DIRECT where allowed) by `threads` threads at once and checked against the manifest."""
    manifest = manifest or read_manifest(directory)
    files: list[FileReader] = []
    try:
        for entry in manifest.files:
            if deliver is not None and not entry.chunk and entry.size > CHUNK:
                raise CheckpointError(f"{directory / entry.name}: one hash for all of it (format 1): read it whole")
            files.append(FileReader(directory / entry.name, entry, whole, deliver))
            try:
                files[-1].fd, _ = open_for_read(files[-1].path, direct)
            except OSError as e:
                raise CheckpointError(f"{files[-1].path}: cannot open: {e.strerror or e}") from None
        # Staging as long as the longest chunk, block-rounded (format 1 files are read in CHUNK pieces).
        longest = max((min(f.chunk, f.size) for f in files), default=0)
        # A reader handing chunks on holds each whole chunk, checked, in its staging.
        size = 0 if whole else max(ALIGN, round_up(longest)) if deliver else min(CHUNK, max(ALIGN, round_up(longest)))
        run_jobs(interleaved(files), threads, size, _read_job, keep=keep, page_lock=page_lock)
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


def read_header(path: Path) -> tuple[bytes, dict[str, Any], int]:
    """A safetensors file's header as it is on disk (its length field and JSON, not yet checked
    against the manifest: the chunk that holds it is), parsed, and where its data section starts."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) == 8:
                (n,) = struct.unpack("<Q", head)
                head += f.read(n if n <= 100 << 20 else 0)  # parse_header says why a length is wrong
    except OSError as e:
        raise CheckpointError(f"{path}: unreadable: {e.strerror or e}") from None
    header, start = parse_header(head, path)
    return head, header, start


def read_blob(directory: Path, entry: FileEntry) -> bytes:
    """A small file of a checkpoint (its train.json), read whole and checked against the manifest."""
    path = directory / entry.name
    _checked_size(path, entry)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CheckpointError(f"{path}: unreadable: {e.strerror or e}") from None
    if entry.chunk:
        got = [xxhash.xxh3_128_hexdigest(data[a : a + entry.chunk]) for a in range(0, max(len(data), 1), entry.chunk)]
        ok = got == entry.chunks
    else:
        ok = xxhash.xxh3_128_hexdigest(data) == entry.hash
    if not ok:
        raise CheckpointError(f"{path}: hash mismatch (the file is damaged)")
    return data


def read_into(
    directory: Path | str,
    deliver: Deliver,
    threads: int = THREADS,
    direct: bool = True,
    manifest: Manifest | None = None,
    page_lock: PageLock | None = None,
) -> Manifest:
    """Read and check every chunk of a checkpoint into staging buffers and hand each one, once
    checked, to deliver(file name, offset, bytes) on the reading thread (so deliveries run in
    parallel, each chunk exactly once, in no order). What deliver keeps of the bytes it must copy:
    the buffer is the next chunk's. Raises CheckpointError at the first bad chunk, after which
    some chunks were delivered and others not. `page_lock` page-locks each staging buffer for the
    call (a GPU's copies out of it are then DMA, not the driver's bounce buffer)."""
    return _read(
        Path(directory), threads, direct, whole=False, deliver=deliver, manifest=manifest, page_lock=page_lock
    )[0]
