"""The job-level record of a multi-rank run: which step every rank saved, and where.

A job's checkpoint root holds one directory a rank (``rank0/``, ``rank1/``, ...) and beside them:

    done/step_000000012.rank1.json     written by a rank once its checkpoint of that step is durable
                                       (fsynced, manifest last): host, directory, manifest's SHA-256
    complete/step_000000012.json       written by every rank once all `world` ranks reported their
                                       done records for that step (gathered through the process
                                       group): the step is one checkpoint of the whole job

On separate disks (one a node), each node sees its own ranks' done records and, for every step the
ranks could still agree on, the same complete record. A step saved without a collective (the link
between the nodes dead) has done records only: complete or not is settled at resume, when the ranks
can talk again (`Guard.resume` loads only a step every rank has verified, and writes its complete
record). So is the last periodic save of a run that ended cleanly, written in the background after
the last collective: at `close()` the complete record is written by a rank that finds every rank's
done record on its disk (a shared filesystem), else at the next resume. The files are small
JSON, written atomically; a damaged one is read as absent, never as complete.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from holdover.files import write_atomic
from holdover.train import ckpt

DONE = "done"
COMPLETE = "complete"


def manifest_sha256(directory: Path) -> str:
    return hashlib.sha256((directory / ckpt.MANIFEST).read_bytes()).hexdigest()


def _write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(data, sort_keys=True))


def done_record(rank: int, step: int, directory: Path) -> dict[str, Any]:
    return {
        "rank": rank,
        "step": step,
        "host": os.uname().nodename,
        "dir": str(directory),
        "manifest_sha256": manifest_sha256(directory),
        "at": time.time(),
    }


def write_done(job_root: Path, record: dict[str, Any]) -> None:
    _write(job_root / DONE / f"{ckpt.step_dirname(record['step'])}.rank{record['rank']}.json", record)


def read_done(job_root: Path, step: int, rank: int) -> dict[str, Any] | None:
    """Rank `rank`'s done record of `step`, if this disk has it."""
    d = _read(job_root / DONE / f"{ckpt.step_dirname(step)}.rank{rank}.json")
    return d if d and d["step"] == step and d.get("rank") == rank else None


def write_complete(job_root: Path, step: int, world: int, ranks: list[dict[str, Any]]) -> None:
    data = {"step": step, "world": world, "ranks": sorted(ranks, key=lambda r: r["rank"]), "at": time.time()}
    _write(job_root / COMPLETE / f"{ckpt.step_dirname(step)}.json", data)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
        int(data["step"])
        return data if isinstance(data, dict) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass
class JobView:
    """What one node's disk says of a job: its newest complete step, and each local rank's newest
    done step (a rank ahead of the complete step saved alone: the link died, or a rank failed)."""

    world: int | None = None
    complete: dict[str, Any] | None = None  # the newest complete record
    done: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> its newest done record

    def as_dict(self) -> dict[str, Any]:
        c = self.complete
        return {
            "world": self.world,
            "complete_step": c["step"] if c else None,
            "complete_on": [{"rank": r["rank"], "host": r.get("host")} for r in c["ranks"]] if c else [],
            "ranks_here": {str(k): {"step": v["step"], "host": v.get("host")} for k, v in sorted(self.done.items())},
        }


def read(job_root: Path) -> JobView:
    view = JobView()
    for p in sorted((job_root / COMPLETE).glob("step_*.json"), reverse=True):
        c = _read(p)
        if c and isinstance(c.get("ranks"), list) and len(c["ranks"]) == c.get("world"):
            view.complete, view.world = c, int(c["world"])
            break
    with contextlib.suppress(OSError):
        for p in (job_root / DONE).glob("step_*.rank*.json"):
            d = _read(p)
            if d and (d["rank"] not in view.done or d["step"] > view.done[d["rank"]]["step"]):
                view.done[int(d["rank"])] = d
    return view
