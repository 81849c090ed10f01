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

This package has no torch dependency: a tensor is anything with an address and a length. Its rooms:
``format`` (the manifest and the file layout), ``engine`` (staging buffers, O_DIRECT handles, the
thread pool), ``write``, ``read``, ``store`` (the checkpoints of a run: newest, pinned, rotation),
``snapshot`` (the copy a background save writes from) and ``iomode`` (O_DIRECT or buffered, per device).
Everything public is here as ``holdover.train.ckpt.X``.
"""

from holdover.files import fsync_dir
from holdover.train.ckpt import iomode
from holdover.train.ckpt.engine import CHUNK, MIN_CHUNK, STAGING, THREADS, PageLock, chunk_size
from holdover.train.ckpt.format import (
    ALIGN,
    DAMAGED_PREFIX,
    FORMAT,
    FORMATS,
    HASH,
    MANIFEST,
    PIN,
    TMP_PREFIX,
    TRAIN_JSON,
    CheckpointError,
    FileEntry,
    Manifest,
    Progress,
    Shard,
    Tensor,
    combine,
    parse_header,
    round_up,
    step_dirname,
)
from holdover.train.ckpt.read import read_all, read_blob, read_header, read_into, read_manifest, verify
from holdover.train.ckpt.snapshot import Snapshot, Stager
from holdover.train.ckpt.store import candidates, newest_verified, pin, pinned, prune, set_aside
from holdover.train.ckpt.write import save

__all__ = [
    "ALIGN",
    "CHUNK",
    "DAMAGED_PREFIX",
    "FORMAT",
    "FORMATS",
    "HASH",
    "MANIFEST",
    "MIN_CHUNK",
    "PIN",
    "STAGING",
    "THREADS",
    "TMP_PREFIX",
    "TRAIN_JSON",
    "CheckpointError",
    "FileEntry",
    "Manifest",
    "PageLock",
    "Progress",
    "Shard",
    "Snapshot",
    "Stager",
    "Tensor",
    "candidates",
    "chunk_size",
    "combine",
    "fsync_dir",
    "iomode",
    "newest_verified",
    "parse_header",
    "pin",
    "pinned",
    "prune",
    "read_all",
    "read_blob",
    "read_header",
    "read_into",
    "read_manifest",
    "round_up",
    "save",
    "set_aside",
    "step_dirname",
    "verify",
]
