"""Checkpoint write throughput: holdover's writer against the raw device limit and the article's recipe.

One run, same disk, page cache dropped before each case (needs root; without it the figures say
"cache not dropped"). State: a transformer-shaped model (24 blocks) of fp32 weights plus Adam's two
moments, about 6 GB at the default size. Cases:

  raw      O_DIRECT sequential write of the same byte count from an aligned buffer + fsync (the limit)
  article  torch.save of one file + fsync, then MD5 of the file read back (the source article)
  ours     holdover.train.state.save: request to durable, hashed manifest
  read     O_DIRECT sequential read of the raw file (the limit for verification)
  verify   holdover.train.ckpt.verify of our checkpoint, cold (resume-side check)

Prints MB/s and the ratio to `raw` for each. Usage:
    .venv/bin/python bench/checkpoint_throughput.py [--gb 6] [--dir /var/tmp/holdover-bench] [--threads 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import hashlib
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from holdover.train import ckpt, state


def drop_caches() -> bool:
    subprocess.run(["sync"], check=True)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def build(gb: float) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    # weights = gb/3 (Adam keeps two more copies); 24 blocks of qkv, proj, fc1, fc2 -> 12 h^2 per block.
    params = gb * 1e9 / 3 / 4
    hidden = int((params / 24 / 12) ** 0.5)
    torch.manual_seed(0)
    blocks = []
    for _ in range(24):
        blocks.append(
            torch.nn.ModuleDict(
                {
                    "qkv": torch.nn.Linear(hidden, 3 * hidden, bias=False),
                    "proj": torch.nn.Linear(hidden, hidden, bias=False),
                    "fc1": torch.nn.Linear(hidden, 4 * hidden, bias=False),
                    "fc2": torch.nn.Linear(4 * hidden, hidden, bias=False),
                    "ln": torch.nn.LayerNorm(hidden),
                }
            )
        )
    model = torch.nn.ModuleDict({"blocks": torch.nn.ModuleList(blocks)})
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    for p in model.parameters():
        # Incompressible, non-zero moments without a 2 GB backward pass.
        p.grad = torch.randn_like(p)
    opt.step()
    for p in model.parameters():
        p.grad = None
    return model, opt


def raw_direct(path: Path, nbytes: int) -> float:
    buf = mmap.mmap(-1, ckpt.CHUNK)
    buf.write(os.urandom(ckpt.CHUNK))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    t0 = time.perf_counter()
    off = 0
    view = memoryview(buf)
    while off < nbytes:
        off += os.pwrite(fd, view, off)
    os.fsync(fd)
    dt = time.perf_counter() - t0
    os.close(fd)
    view.release()
    return dt


def raw_direct_read(path: Path) -> float:
    buf = mmap.mmap(-1, ckpt.CHUNK)
    view = memoryview(buf)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    t0 = time.perf_counter()
    off = 0
    while n := os.preadv(fd, [view], off):
        off += n
    dt = time.perf_counter() - t0
    os.close(fd)
    view.release()
    return dt


def article(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer) -> float:
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, f)
        f.flush()
        os.fsync(f.fileno())
    h = hashlib.md5()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=6.0, help="state size in GB (weights + Adam moments)")
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/holdover-bench"))
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-article", action="store_true", help="leave out the slow torch.save+MD5 case")
    args = ap.parse_args()
    work = args.dir
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    model, opt = build(args.gb)
    cap = state.capture(model, opt, threads=args.threads)
    nbytes = cap.nbytes
    ntensors = sum(len(s.tensors) for s in cap.shards)
    print(f"state: {nbytes / 1e9:.2f} GB in {len(cap.shards)} shards, {ntensors} tensors")
    del cap
    times: dict[str, list[float]] = {}
    sizes: dict[str, int] = {}
    dropped = True

    def record(name: str, dt: float, n: int) -> None:
        times.setdefault(name, []).append(dt)
        sizes[name] = n

    try:
        # Interleaved repeats and medians: on this VM one case's throughput swings by 2x between runs.
        for _ in range(args.repeats):
            dropped &= drop_caches()
            record("raw O_DIRECT + fsync", raw_direct(work / "raw.bin", nbytes), nbytes)
            dropped &= drop_caches()
            record("raw O_DIRECT read (limit for verify)", raw_direct_read(work / "raw.bin"), nbytes)
            (work / "raw.bin").unlink()
            dropped &= drop_caches()
            t0 = time.perf_counter()
            d, manifest = state.save(work / "ours", 1, model, opt, threads=args.threads)
            record(f"ours: {args.threads} threads, xxh3-128, manifest", time.perf_counter() - t0, manifest.nbytes)
            dropped &= drop_caches()
            t0 = time.perf_counter()
            ckpt.verify(d, threads=args.threads)
            record("ours: verify on resume (cold)", time.perf_counter() - t0, manifest.nbytes)
            shutil.rmtree(d)
        if not args.skip_article:
            dropped &= drop_caches()
            record("article: torch.save + fsync + MD5", article(work / "a.pt", model, opt), nbytes)
            (work / "a.pt").unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = [(name, statistics.median(ts), sizes[name], len(ts)) for name, ts in times.items()]
    base = rows[0][2] / rows[0][1]
    print(f"{'case (median of runs)':44} {'runs':>4} {'GB':>6} {'s':>7} {'MB/s':>7} {'ratio':>6}")
    for name, dt, n, k in rows:
        rate = n / dt
        print(f"{name:44} {k:4} {n / 1e9:6.2f} {dt:7.2f} {rate / 1e6:7.0f} {rate / base:6.2f}")
    if not dropped:
        print("note: the page cache could not be dropped (not root); cold figures are warm")
    return 0


if __name__ == "__main__":
    sys.exit(main())
