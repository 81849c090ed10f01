"""The checkpoints of one run side by side: which are committed, the newest that verifies, the
damaged ones set aside, the pinned ones kept, the rotation."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from holdover.files import fsync_dir, write_atomic
from holdover.train.ckpt.format import DAMAGED_PREFIX, MANIFEST, PIN, TMP_PREFIX, CheckpointError, Manifest
from holdover.train.ckpt.read import verify
from holdover.train.ckpt.write import leftovers


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


def pin(directory: Path | str, reason: str) -> None:
    """Keep this checkpoint out of rotation: it is what an outage was survived with. Outside the
    manifest, so pinning and unpinning (deleting the file) never change what verifies."""
    write_atomic(Path(directory) / PIN, json.dumps({"reason": reason, "at": time.time()}))


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
    for p in leftovers(root):
        shutil.rmtree(p, ignore_errors=True)
    return removed
