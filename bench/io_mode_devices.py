"""O_DIRECT against buffered writes on more than one device, and what Guard(io="auto") chose there.

The writer's mode is chosen per device at run time (holdover/train/ckpt/iomode.py): a run's first
large periodic save is written with O_DIRECT, the next one buffered, and the faster is kept. This
measures both modes on each device it can reach here, then lets a fresh Guard choose:

  disk       this VM's virtio disk (--dir)
  ram-disk   a RAM-backed block device: a loop device over a file in /dev/shm, ext4 on it (root;
             --no-ram-disk leaves it out). No seek, no queue, no write cache to flush: the
             other end of the range from a disk
  tmpfs      /dev/shm itself: refuses O_DIRECT before Linux 6.6 (then written buffered from the
             start), takes it since

Each round writes the state once each way from a snapshot, as a background periodic save does
(the snapshot's file images straight to the device), page cache dropped before every save, timed
from request to durable. Then a Guard(io="auto") saves the same state three times in the
background: O_DIRECT, buffered, and the choice.

    .venv/bin/python bench/io_mode_devices.py [--gb 2] [--rounds 3] [--dir /var/tmp/holdover-iomode]
        [--no-ram-disk] [--no-drop-caches]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from checkpoint_throughput import Cache, build
from common import parse

from holdover.train import ckpt, state
from holdover.train.ckpt import iomode
from holdover.train.guard import Guard


@contextlib.contextmanager
def ram_disk(nbytes: int) -> Iterator[Path]:
    """ext4 on a loop device over a file in /dev/shm, mounted for the length of the block."""
    fd, backing = tempfile.mkstemp(dir="/dev/shm", prefix="holdover-ramdisk-")
    mnt = Path(tempfile.mkdtemp(prefix="holdover-ramdisk-"))
    dev = ""
    try:
        # Allocated now: a sparse backing file pays the first touch of its shm pages inside the
        # first saves (measured: 430 MB/s for the first two, 4 GB/s after), which is not the device.
        os.posix_fallocate(fd, 0, nbytes)
        os.close(fd)
        fd = -1
        dev = subprocess.run(["losetup", "--find", "--show", backing], check=True, capture_output=True, text=True)
        dev = dev.stdout.strip()
        # Inode tables and journal zeroed now, not by ext4lazyinit behind the first saves.
        init = "lazy_itable_init=0,lazy_journal_init=0"
        subprocess.run(["mkfs.ext4", "-q", "-F", "-E", init, dev], check=True, capture_output=True)
        subprocess.run(["mount", dev, str(mnt)], check=True, capture_output=True)
        yield mnt
    finally:
        if fd >= 0:
            os.close(fd)
        subprocess.run(["umount", str(mnt)], capture_output=True)
        if dev:
            subprocess.run(["losetup", "-d", dev], capture_output=True)
        os.unlink(backing)
        mnt.rmdir()


def modes(root: Path, shards: list[ckpt.Shard], nbytes: int, rounds: int, cache: Cache) -> dict[str, list[float]]:
    """Rates (bytes/s) of the same snapshot written with O_DIRECT and buffered, interleaved; a mode
    the filesystem refused is reported under what it became (manifest meta.io)."""
    rates: dict[str, list[float]] = {}
    step = 0
    for _ in range(rounds):
        for direct in (True, False):
            cache()
            step += 1
            t0 = time.perf_counter()
            d, m = ckpt.save(root, step, shards, direct=direct)
            rates.setdefault(f"{'O_DIRECT' if direct else 'buffered'} asked, {m.meta['io']}", []).append(
                nbytes / (time.perf_counter() - t0)
            )
            shutil.rmtree(d)
    return rates


def auto(root: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, cache: Cache) -> tuple[list[str], str]:
    """A fresh Guard(io="auto") with three background periodic saves: how each was written, and
    what it logged about the choice."""
    log: list[str] = []
    g = Guard(
        root,
        "iomode",
        model=model,
        optimizer=opt,
        signal=None,
        registry_dir=root.parent / "reg",
        interval=1,
        keep=1,
        log=log.append,
    )
    how = []
    try:
        for step in (1, 2, 3):
            cache()
            g.step_end(step)
            g.wait_background()
            newest = max(root.glob("step_*"))
            how.append(json.loads((newest / ckpt.MANIFEST).read_text())["meta"]["io"])
    finally:
        g.close()
    said = next((line for line in log if "saves on this device use" in line or "refused" in line), "(nothing logged)")
    return how, said


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=2.0, help="state size (a transformer-shaped model with Adam)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/holdover-iomode"))
    ap.add_argument("--no-ram-disk", action="store_true", help="leave out the loop device over /dev/shm (needs root)")
    ap.add_argument("--no-drop-caches", action="store_true")
    args = parse(ap, gb=0.02, rounds=1, no_ram_disk=True, no_drop_caches=True)
    cache = Cache(not args.no_drop_caches)
    model, opt = build("model", args.gb)
    assert opt is not None
    cap = state.capture(model, opt)
    snap = ckpt.Snapshot()
    shards = snap.take(cap.shards)
    nbytes = cap.nbytes
    print(f"{nbytes / 1e9:.2f} GB state, {args.rounds} rounds, median (range), MB/s request to durable", flush=True)
    rows = []
    with contextlib.ExitStack() as stack:
        if args.smoke:  # beside a real run, never in its directory
            args.dir = Path(tempfile.mkdtemp(prefix="holdover-iomode-smoke-"))
            stack.callback(shutil.rmtree, args.dir, True)
        devices = [("disk", args.dir)]
        if not args.no_ram_disk:
            devices.append(("ram-disk", stack.enter_context(ram_disk(int(nbytes * 3.2)))))
        shm = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="holdover-iomode-"))
        stack.callback(shutil.rmtree, shm, True)  # RAM: nothing of it may stay
        devices.append(("tmpfs", shm))
        for name, where in devices:
            root = where / "ckpt"
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True)
            try:
                spread = modes(root, shards, nbytes, args.rounds, cache)
                rates = {k: statistics.median(v) for k, v in spread.items()}
                how, said = auto(root / "auto", model, opt, cache)
            finally:
                shutil.rmtree(root, ignore_errors=True)
                if name == "tmpfs":
                    where.rmdir()
            line = f"{name:9} " + ", ".join(
                f"{k} {rates[k] / 1e6:.0f} ({min(v) / 1e6:.0f}-{max(v) / 1e6:.0f})" for k, v in spread.items()
            )
            d, b = rates.get("O_DIRECT asked, direct"), rates.get("buffered asked, buffered")
            if d and b:
                line += f"; buffered / O_DIRECT {b / d:.2f}"
            rows.append(f"{line}\n{'':9} Guard(io=auto) wrote {' -> '.join(how)}: {said}")
            print(rows[-1], flush=True)
    snap.close()
    print(f"(auto keeps O_DIRECT unless buffered measured {iomode.MARGIN}x faster in its probe)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
