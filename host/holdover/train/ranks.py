"""The ranks of a job, seen from one of them: who this process is, what the ranks agree on at a
step boundary (one all-reduce: the highest vote wins), and the job's records of each step every
rank saved (train.job). In a single process every agreement is the process's own value and there
is no job record to keep."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from holdover.train import job
from holdover.train.say import Log

# What the ranks vote at a step boundary; the highest wins (agree).
PERIODIC, EMERGENCY, EXIT = 1, 2, 3


def rank_world() -> tuple[int, int]:
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def gather(obj: Any, world: int) -> list[Any]:
    """`obj` from every rank, in rank order."""
    import torch.distributed as dist

    out: list[Any] = [None] * world
    dist.all_gather_object(out, obj)
    return out


def agree(value: int, world: int) -> int:
    """The maximum of `value` across ranks (identity in a single process)."""
    if world <= 1:
        return value
    import torch
    import torch.distributed as dist

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([value], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


class JobRecords:
    """This rank's done record of its newest checkpoint, and the job's record of a step once every
    rank has one (a step complete on all ranks is what a job resumes from). Failures to write
    them are said, never raised: the checkpoints themselves are safe."""

    def __init__(self, job_root: Path, rank: int, world: int, log: Log) -> None:
        self.job_root = job_root  # beside the ranks' own directories
        self.rank, self.world = rank, world
        self.log = log
        self.done: dict[str, Any] | None = None  # this rank's newest done record

    def saved(self, step: int, directory: Path) -> None:
        """This rank has `step` on disk: its done record, written."""
        if self.world <= 1:
            return
        try:
            self.done = job.done_record(self.rank, step, directory)
            job.write_done(self.job_root, self.done)
        except OSError as e:
            self.log(f"holdover: could not record rank {self.rank}'s step {step} as done: {e}")

    def resumed(self, step: int, directory: Path) -> None:
        """Every rank has verified `step`: its done record as it stands (written without a
        collective, or as the last run ended, it may lack one), for the next complete()."""
        try:
            self.done = job.done_record(self.rank, step, directory)
        except OSError as e:
            self.log(f"holdover: could not read step {step}'s manifest for the job's record: {e}")
            self.done = None

    def complete(self, step: int) -> None:
        """Every rank's done record of `step`, gathered (a collective: every rank calls it at
        once): when all ranks have one, the step is complete and each writes the job's record."""
        mine = self.done if self.done and self.done["step"] == step else None
        records = gather(mine, self.world)
        if all(records):
            self._write(step, records)
        else:
            missing = [r for r, rec in enumerate(records) if not rec]
            self.log(f"holdover: step {step} is not complete: rank(s) {missing} did not save it")

    def complete_from_disk(self, step: int) -> None:
        """complete() without a collective (past the last vote, a rank may have left): only
        what this disk shows; the next resume records it otherwise."""
        records = [job.read_done(self.job_root, step, r) for r in range(self.world)]
        if all(records) and self._write(step, records):
            return
        self.log(
            f"holdover: step {step} was saved as the run ended; the job's record of it is written when "
            "the ranks resume (not every rank's done record is on this disk)"
        )

    def _write(self, step: int, records: list[Any]) -> bool:
        try:
            job.write_complete(self.job_root, step, self.world, records)
            return True
        except OSError as e:
            self.log(f"holdover: could not write the job's record of step {step}: {e}")
            return False
