"""A job of two ranks resumes from the newest step every rank has: a newer step only one rank
saved, or one damaged on one rank, is passed over by both, and what they load is bit for bit the
state they saved. Two real processes, torch's gloo on loopback, the Guard in each
(holdover.lab.ddp_trainee), real checkpoint files."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from holdover.lab.broker import free_port
from holdover.train import job
from support import Forked

pytest.importorskip("torch")


def _ranks(tmp: Path, *args: str) -> list[tuple[int | None, str, str]]:
    """Both ranks run to their end: each one's exit status, output and errors. Each rank is its own
    process, forked from an interpreter that imported torch once (tests/support.Forked)."""
    port = free_port()
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        argv = ["--ckpt", str(tmp / "ckpt"), "--registry", str(tmp / f"reg{rank}"), "--step-sleep", "0", *args]
        procs.append(Forked("holdover.lab.ddp_trainee", argv, tmp / "output", env))
    done = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        done.append((p.returncode, out, err))
    return done


def _run(tmp: Path, steps: int, save_at: str = "", *more: str) -> dict[int, list[dict]]:
    """Both ranks to the end; each rank's JSON lines."""
    out = {}
    for rank, (rc, stdout, stderr) in enumerate(_ranks(tmp, "--steps", str(steps), "--save-at", save_at, *more)):
        assert rc == 0, stderr[-2000:]
        out[rank] = [json.loads(x) for x in stdout.splitlines() if x.startswith("{")]
    return out


def _at(lines: list[dict], step: int) -> str:
    return next(x["digest"] for x in lines if x.get("step") == step)


def test_both_ranks_resume_the_newest_step_both_have_bit_for_bit(tmp_path: Path) -> None:
    first = _run(tmp_path, 8, save_at="3,6")
    for rank in (0, 1):
        saved = sorted(p.name for p in (tmp_path / "ckpt" / f"rank{rank}").glob("step_*"))
        assert saved == ["step_000000003", "step_000000006"], saved
    # The job's record: step 6 complete on both ranks, each rank's manifest named by its hash.
    view = job.read(tmp_path / "ckpt")
    assert view.complete and view.complete["step"] == 6 and view.world == 2
    for rank in (0, 1):
        d = tmp_path / "ckpt" / f"rank{rank}" / "step_000000006"
        assert view.complete["ranks"][rank]["manifest_sha256"] == job.manifest_sha256(d)
        assert view.done[rank]["step"] == 6
    assert sorted(p.name for p in (tmp_path / "ckpt" / "complete").iterdir()) == [
        "step_000000003.json",
        "step_000000006.json",
    ]

    # Rank 1 never finished step 6 (its directory gone): both load 3, not rank 0's newer 6.
    shutil.rmtree(tmp_path / "ckpt" / "rank1" / "step_000000006")
    again = _run(tmp_path, 3)
    for rank in (0, 1):
        assert again[rank][0]["resumed"] == 3 and again[rank][0]["digest"] == _at(first[rank], 3), again[rank][0]
    assert (tmp_path / "ckpt" / "rank0" / "step_000000006").is_dir()  # passed over, not deleted


def test_a_step_damaged_on_one_rank_makes_both_fall_back_together(tmp_path: Path) -> None:
    first = _run(tmp_path, 8, save_at="3,6")
    shard = next((tmp_path / "ckpt" / "rank0" / "step_000000006").glob("*.safetensors"))
    with open(shard, "r+b") as f:  # a flipped byte in rank 0's newest
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))
    again = _run(tmp_path, 3)
    for rank in (0, 1):
        assert again[rank][0]["resumed"] == 3 and again[rank][0]["digest"] == _at(first[rank], 3), again[rank][0]
    # The damaged one is set aside on its rank, named so; rank 1's good step 6 is left as it is.
    assert [p.name for p in (tmp_path / "ckpt" / "rank0").glob("damaged-*")] == ["damaged-step_000000006"]
    assert (tmp_path / "ckpt" / "rank1" / "step_000000006").is_dir()

    # Every checkpoint of one rank damaged: the job stops on both ranks rather than start from 0.
    for d in (tmp_path / "ckpt" / "rank1").glob("step_*"):
        for f in d.glob("*.safetensors"):
            f.write_bytes(b"\0" * f.stat().st_size)
    for rc, _out, err in _ranks(tmp_path, "--steps", "3"):
        assert rc != 0 and "all damaged" in err, err[-1500:]


def _saved(tmp: Path, rank: int) -> list[str]:
    return sorted(p.name for p in (tmp / "ckpt" / f"rank{rank}").glob("step_*"))


def test_one_cut_asked_of_each_rank_a_step_apart_is_one_save(tmp_path: Path) -> None:
    """With a bridge on every node, one cut reaches rank 0 at step 3 and rank 1 a step later: the
    save the ranks agreed on for rank 0's request answers rank 1's too, rather than both saving
    again (join_window_s). With no window, the second request is a second save on both ranks."""
    out = _run(tmp_path / "a", 8, "3@0,4@1")
    for rank in (0, 1):
        assert _saved(tmp_path / "a", rank) == ["step_000000003"]
        (asked,) = out[rank][-1]["requests"]
        assert asked["state"] == "done" and asked["step"] == 3, asked
        assert asked["joined"] is (True if rank == 1 else None), asked
    assert job.read(tmp_path / "a" / "ckpt").complete["step"] == 3

    out = _run(tmp_path / "b", 8, "3@0,4@1", "--join-window", "0")
    for rank in (0, 1):
        assert _saved(tmp_path / "b", rank) == ["step_000000003", "step_000000004"]
    assert out[1][-1]["requests"][0]["step"] == 4

    # A second request to rank 1 a step later still is the next cut: a bridge asks a rank once a
    # cut, so a save answers one late request, never two.
    out = _run(tmp_path / "c", 8, "3@0,4@1,5@1")
    for rank in (0, 1):
        assert _saved(tmp_path / "c", rank) == ["step_000000003", "step_000000005"]
    assert [r["step"] for r in out[1][-1]["requests"]] == [3, 5]


def test_a_request_to_stop_after_the_save_stops_every_rank_at_that_step(tmp_path: Path) -> None:
    """Only rank 0's bridge has asked yet, with after=exit: both ranks save step 3 and both stop
    there (a rank going on alone would wait in its next collective for one that left)."""
    out = _run(tmp_path, 8, "3@0:exit,4@1:exit")
    for rank in (0, 1):
        assert max(x.get("step", 0) for x in out[rank]) == 3, out[rank]
        assert _saved(tmp_path, rank) == ["step_000000003"]
    assert out[0][-1]["requests"][0]["state"] == "done"
    assert out[1][-1]["requests"] == []  # rank 1 stopped before its step 4 came


def test_the_last_background_save_of_a_clean_end_is_recorded_complete(tmp_path: Path) -> None:
    """Periodic saves every 3 steps, in the background: step 6's is written after the run's last
    vote, so no collective gathers its done records. The rank that closes last finds both on this
    (shared) disk and writes the complete record; where they are not (one disk a node, here: the
    record removed), the next resume, which has every rank verify it, writes it."""
    _run(tmp_path, 7, "", "--save-every", "3")
    for rank in (0, 1):
        assert _saved(tmp_path, rank) == ["step_000000003", "step_000000006"]
    complete = tmp_path / "ckpt" / "complete"
    assert sorted(p.name for p in complete.iterdir()) == ["step_000000003.json", "step_000000006.json"]
    assert job.read(tmp_path / "ckpt").complete["step"] == 6
    (complete / "step_000000006.json").unlink()
    again = _run(tmp_path, 6)
    assert [again[r][0]["resumed"] for r in (0, 1)] == [6, 6]
    view = job.read(tmp_path / "ckpt")
    assert view.complete["step"] == 6 and [r["rank"] for r in view.complete["ranks"]] == [0, 1]
    for rank in (0, 1):
        d = tmp_path / "ckpt" / f"rank{rank}" / "step_000000006"
        assert view.complete["ranks"][rank]["manifest_sha256"] == job.manifest_sha256(d)


def test_a_request_heard_after_the_ranks_stopped_is_answered_by_their_save(tmp_path: Path) -> None:
    """Rank 0's bridge asked to save and exit at step 3; both ranks saved and stopped. Rank 1's
    bridge heard the same cut a moment later, after rank 1 had left its loop: close() answers it
    with step 3's save (joined), not with "the run stopped before saving"."""
    out = _run(tmp_path, 8, "3@0:exit", "--late-ask")
    for rank in (0, 1):
        assert _saved(tmp_path, rank) == ["step_000000003"]
    reqs = {rank: out[rank][-1]["requests"] for rank in (0, 1)}
    assert reqs[1] == [{"state": "done", "step": 3, "after": "exit", "joined": True}], reqs
    # Rank 0's own late ask came after the save it had asked for itself: only another rank's
    # request is joined, and only the first, so this one finds the run gone.
    assert [r["state"] for r in reqs[0]] == ["done", "failed"], reqs
