"""A 2-node job across real network namespaces (holdover.lab.cluster_net), torchrun on each node
with a static rendezvous, one gloo rank per node, each node its own checkpoint disk. The link
between the nodes dies while the ranks are training: no collective can complete, and each rank's
Guard saves its last whole step on its own; resumed on both nodes, the state is bit for bit what
it was at that step."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from holdover.cli.common import describe_job
from holdover.lab.cluster_net import ClusterNet, TorchrunJob
from holdover.node.launch import recover
from holdover.train import ckpt
from holdover.train import job as jobrec

pytest.importorskip("torch")


def _wait(pred: Any, timeout: float, what: str) -> Any:
    end = time.monotonic() + timeout
    while not (got := pred()):
        assert time.monotonic() < end, f"timed out: {what}"
        time.sleep(0.05)
    return got


def _saved(tmp: Path, node: int) -> list[Path]:
    return ckpt.candidates(tmp / f"node{node}" / "ckpt" / f"rank{node}")


def test_link_loss_mid_training_each_rank_saves_alone_and_both_resume_bit_for_bit(tmp_path: Path) -> None:
    with ClusterNet(2) as net:
        job = TorchrunJob(net, tmp_path, "--step-sleep", "0.02", "--stall-save", "3")
        try:
            _wait(lambda: job.step(0) >= 10 and job.step(1) >= 10, 120, "both ranks training")
            net.partition()
            t0 = time.monotonic()
            dirs = _wait(
                lambda: all(_saved(tmp_path, n) for n in (0, 1)) and [_saved(tmp_path, n)[0] for n in (0, 1)],
                60,
                "both ranks saved",
            )
            took = time.monotonic() - t0
            steps = [ckpt.verify(d).step for d in dirs]
            print(f"link lost -> both ranks saved and verified in {took:.2f} s (stall_save_s 3), steps {steps}")
            assert steps[0] == steps[1], steps  # the same step: neither rank passed the other's collective
            for d in dirs:
                assert ckpt.verify(d).meta["collective_free"] is True
            saved = steps[0]
            assert job.step(0) == job.step(1) == saved  # the last step either rank completed
            # Each node's disk: its rank done at that step, and no complete record (the ranks could
            # not agree; resume settles it).
            for n in (0, 1):
                view = jobrec.read(tmp_path / f"node{n}" / "ckpt")
                assert view.complete is None and view.done[n]["step"] == saved, view
        finally:
            job.kill()
        # What `holdover recover` says on node 1 afterwards: one job, its rank here gone, the step
        # it saved alone, and no step known complete on all ranks.
        runs = {r["name"]: r for r in recover(tmp_path / "node1" / "reg")}
        line = describe_job(runs["train"])
        assert runs["train"]["world"] == 2 and runs["train"]["multi"]["ranks_here"] == {
            "1": {"step": saved, "host": os.uname().nodename}
        }
        assert (
            line and f"rank 1 saved step {saved} alone" in line and "no step complete" in line and "rank 1 gone" in line
        ), line
        net.partition(False)

        again = TorchrunJob(net, tmp_path, "--steps", str(saved + 2), "--step-sleep", "0")
        assert again.finish() == [0, 0], [e.read_text()[-1500:] for e in again.errs]
        for node in (0, 1):
            first = again.lines[node][0]
            assert first["resumed"] == saved and first["digest"] == job.digest(node, saved), first
