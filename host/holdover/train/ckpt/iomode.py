"""O_DIRECT or buffered writes, per device, chosen from what this device's own saves measured.

On this VM's disk, O_DIRECT from aligned staging buffers reached 0.7 to 0.9 of the parallel
ceiling. Buffered writes with fsync reached 0.1 to 0.3 (research: ckpt_anchors.md 2.2). Other
devices may go the other way: a RAID controller's write cache, or a network filesystem that
serves O_DIRECT slowly. So on each device the first large periodic save is written with O_DIRECT
and the next one buffered (fsync, then its pages dropped). Each one's rate is kept beside the
checkpoints (`.io-mode.json`), and from then on the faster of the two is used, for emergencies
too. Buffered wins only if it was at least 10 % faster. An emergency never probes: it takes what
is known, which is O_DIRECT until a measurement says otherwise. A device that refuses O_DIRECT
(tmpfs) is written buffered from the start.

Written by hand: no library chooses an I/O mode from measured saves. The probe costs nothing
extra, because it is a save that was due anyway, and there is no startup write to wait for.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from holdover.files import write_atomic
from holdover.train.ckpt.format import Manifest

RECORD = ".io-mode.json"
MARGIN = 1.1  # buffered must beat O_DIRECT by this much: the probes run a save apart, on a drifting disk
MIN_PROBE_BYTES = 256 << 20  # below this a save's time is mostly fsync latency, not throughput


def _read(root: Path) -> dict[str, Any]:
    """The record for the device `root` is on now (another device's, after a move, is ignored)."""
    try:
        dev = os.stat(root).st_dev
    except OSError:
        return {}
    with contextlib.suppress(OSError, ValueError, TypeError):
        rec = json.loads((root / RECORD).read_text())
        if isinstance(rec, dict) and rec.get("device") == dev:
            return rec
    return {"device": dev}


def direct(root: Path | str, probe: bool = False) -> bool:
    """Whether a save into `root` should use O_DIRECT. A periodic save (`probe`) may be the one
    that measures a mode not measured yet."""
    rec = _read(Path(root))
    if probe and not rec.get("refused") and ("direct" not in rec or "buffered" not in rec):
        return "direct" not in rec
    return _chosen(rec)


def _chosen(rec: dict[str, Any]) -> bool:
    """O_DIRECT, by the record: unless refused, or buffered measured MARGIN faster."""
    d, b = rec.get("direct"), rec.get("buffered")
    return not rec.get("refused") and not (d and b and b >= MARGIN * d)


def learn(root: Path | str, manifest: Manifest, tried_direct: bool) -> str | None:
    """Keeps the rate of a save just made if it is the first of its mode on this device; returns a
    line to log when that settles the choice."""
    root = Path(root)
    if manifest.nbytes < MIN_PROBE_BYTES or not manifest.seconds:
        return None
    rec = _read(root)
    if "device" not in rec:
        return None
    mode = manifest.meta.get("io")
    if mode not in ("direct", "buffered") or mode in rec:
        return None
    if tried_direct and mode == "buffered":
        rec["refused"] = True  # the filesystem would not take O_DIRECT: nothing to compare
    rec[mode] = round(manifest.nbytes / manifest.seconds)
    try:
        write_atomic(root / RECORD, json.dumps(rec, sort_keys=True))
    except OSError:
        return None  # measured again next time: the record is a hint, never in the way of a save
    if rec.get("refused"):
        return f"{root}: O_DIRECT refused on this filesystem; saves are written buffered"
    if "direct" in rec and "buffered" in rec:
        chosen = "O_DIRECT" if _chosen(rec) else "buffered"
        return (
            f"{root}: saves on this device use {chosen} writes "
            f"(O_DIRECT {rec['direct'] / 1e6:.0f} MB/s, buffered {rec['buffered'] / 1e6:.0f} MB/s)"
        )
    return None
