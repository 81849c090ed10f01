"""Last resorts for a run that cannot checkpoint in time: a core dump with gcore, a copy of its /dev/shm files.

Measured on the development machine: gcore writes about 0.35 GB/s with ~10 s of fixed cost
(attach, symbol load), and a core holds host memory only. A process with GPU memory mapped gets a
core without the device state, which the record says; NVIDIA's cuda-checkpoint, where installed,
first moves device memory into the host so the core has it.
"""

from __future__ import annotations

import asyncio
import glob
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import xxhash

from holdover import proc
from holdover.train.ckpt import fsync_dir

CHUNK = 8 << 20


def hash_file(path: Path) -> tuple[int, str]:
    h = xxhash.xxh3_128()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def uses_gpu(pid: int) -> bool:
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False
    return "/dev/nvidia" in maps or "/dev/kfd" in maps or "/dev/dri/renderD" in maps


def estimate_gcore_seconds(pid: int, rate_mb_s: float) -> float:
    try:
        rss = psutil.Process(pid).memory_info().rss
    except psutil.Error:
        rss = 0
    return 10.0 + rss * 1.2 / (rate_mb_s * 1e6)  # cores run ~1.2x RSS here, plus attach and symbols


@dataclass
class DumpResult:
    ok: bool
    detail: dict[str, Any] = field(default_factory=dict)


async def gcore(pid: int, out_dir: Path, label: str, timeout: float) -> DumpResult:
    out_dir.mkdir(parents=True, exist_ok=True)
    exe = shutil.which("gcore")
    if exe is None:
        return DumpResult(False, {"error": "gcore not found (install gdb)"})
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in label)
    prefix = out_dir / f"core.{safe}"
    notes: list[str] = []
    gpu = uses_gpu(pid)
    if gpu:
        cc = shutil.which("cuda-checkpoint")
        if cc:
            r = await proc.run([cc, "--toggle", "--pid", str(pid)], timeout=max(min(timeout / 2, 120), 1))
            notes.append(f"cuda-checkpoint --toggle: {r.describe()}")
            if r.ok:
                notes.append("device memory was moved into host memory before the dump")
        else:
            notes.append("the process maps GPU memory; its device state is NOT in this core (no cuda-checkpoint)")
    t0 = time.monotonic()
    r = await proc.run([exe, "-o", str(prefix), str(pid)], timeout=max(timeout, 1))
    seconds = time.monotonic() - t0
    core = Path(f"{prefix}.{pid}")
    if not r.ok or not core.exists():
        return DumpResult(
            False, {"error": f"gcore {r.describe()}: {r.output[-400:]}", "seconds": seconds, "notes": notes}
        )
    size, digest = await asyncio.to_thread(hash_file, core)
    return DumpResult(
        True,
        {
            "core": str(core),
            "bytes": size,
            "xxh3_128": digest,
            "seconds": round(seconds, 3),
            "gpu": gpu,
            "notes": notes,
        },
    )


async def copy_shm(patterns: list[str], out_dir: Path) -> DumpResult:
    """Copy the files matching the globs (they must lie under /dev/shm) with fsync and a hash each."""
    dest = out_dir / "shm"
    files = []
    errors = []
    for pat in patterns:
        for src in sorted(glob.glob(pat)):
            p = Path(src)
            if not p.resolve().is_relative_to("/dev/shm") and not os.environ.get("HOLDOVER_SHM_ANYWHERE"):
                errors.append(f"{src}: not under /dev/shm, skipped")
                continue
            if not p.is_file():
                continue
            try:
                files.append(await asyncio.to_thread(_copy_one, p, dest / p.name))
            except OSError as e:
                errors.append(f"{src}: {e.strerror or e}")
    return DumpResult(not errors, {"files": files, "errors": errors})


def _copy_one(src: Path, dst: Path) -> dict[str, Any]:
    dst.parent.mkdir(parents=True, exist_ok=True)
    h = xxhash.xxh3_128()
    size = 0
    tmp = dst.with_name(f".{dst.name}.tmp")
    with open(src, "rb") as fi, open(tmp, "wb") as fo:
        while chunk := fi.read(CHUNK):
            h.update(chunk)
            fo.write(chunk)
            size += len(chunk)
        fo.flush()
        os.fsync(fo.fileno())
    os.replace(tmp, dst)
    fsync_dir(dst.parent)
    return {"src": str(src), "dst": str(dst), "bytes": size, "xxh3_128": h.hexdigest()}
