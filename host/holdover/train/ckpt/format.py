"""What a checkpoint is on disk: the manifest, the safetensors files it lists, their names.

Nothing here reads or writes a file; `write`, `read` and `store` do, through `engine`.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xxhash

from holdover.errors import HoldoverError

FORMAT = "holdover-ckpt/2"  # /2: files cut into chunks, each hashed (/1: one hash per file, still read)
FORMATS = ("holdover-ckpt/1", FORMAT)
MANIFEST = "MANIFEST.json"
TMP_PREFIX = ".tmp-"
DAMAGED_PREFIX = "damaged-"  # a checkpoint that failed its check, set aside for inspection
TRAIN_JSON = "train.json"  # the training state beside the shards (step, RNG, data position, ...)
PIN = "PINNED"  # in a checkpoint directory: rotation never removes it (emergency saves)
ALIGN = 4096
HASH = "xxh3_128"


def round_up(n: int, to: int = ALIGN) -> int:
    """n up to the next multiple of `to` (a block for O_DIRECT, a page for a buffer)."""
    return -(-n // to) * to


class CheckpointError(HoldoverError):
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
    # "cpu": the bytes are host memory at address. Anything else names the device the tensor
    # (keepalive) lives on; a Snapshot copies it to host memory before anything reads it.
    device: str = "cpu"

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
    # The file itself, byte for byte (header, then the tensors), already in memory: a Snapshot
    # lays its copies out this way, starting on a block and zero-padded to a whole block, so the
    # writer hands it to the disk (O_DIRECT) and hashes it where it lies, without gathering it.
    image: memoryview | None = None

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


def step_dirname(step: int) -> str:
    return f"step_{step:09d}"


def combine(chunks: Sequence[str]) -> str:
    """A chunked file's own hash: XXH3-128 over its chunk hashes, so a file has one identity."""
    return xxhash.xxh3_128(b"".join(bytes.fromhex(h) for h in chunks)).hexdigest()


def safetensors_header(shard: Shard) -> bytes:
    entries: dict[str, Any] = {}
    offset = 0
    for t in shard.tensors:
        entries[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    if shard.metadata:
        entries["__metadata__"] = dict(shard.metadata)
    raw = json.dumps(entries, separators=(",", ":")).encode()
    # Pad with spaces so the data section begins on an ALIGN boundary (8-byte length prefix + header).
    padded = round_up(8 + len(raw)) - 8
    raw += b" " * (padded - len(raw))
    return struct.pack("<Q", len(raw)) + raw


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
