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

from holdover.bridge.service import Bridge, BridgeThread
from holdover.cli.common import describe_job
from holdover.journal import Journal
from holdover.lab.broker import free_port
from holdover.lab.cluster_net import ClusterNet, TorchrunJob, node_addr
from holdover.node.launch import recover
from holdover.settings import Settings
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


def test_a_silent_peer_makes_the_nodes_bridge_ask_its_rank_to_save_without_a_collective(tmp_path: Path) -> None:
    """The bridge on node 0 checks node 1 every 0.2 s; the link between them dies; after
    lost_after_s it raises peer_lost, whose rescue asks rank 0 to save, and rank 0's Guard serves
    it from its watchdog (its own stall save is off here), at the last step it completed."""
    with ClusterNet(2) as net:
        job = TorchrunJob(net, tmp_path, "--step-sleep", "0.02", "--stall-save", "0")
        s = Settings.model_validate(
            {
                "mqtt": {"port": free_port()},  # no broker: the peer check and the rescue need none
                "journal": {"path": str(tmp_path / "node0.db")},
                "failover": {"node": "node0"},
                "protect": {"registry": str(tmp_path / "node0" / "reg"), "grace": 0, "gcore": False},
                "cluster": {
                    "peers": [f"{node_addr(1)}:22"],  # nothing listens: refused, which is an answer
                    "every_s": 0.2,
                    "timeout_s": 0.3,
                    "lost_after_s": 1.0,
                    "netns": net.node_names[0],
                },
            }
        )
        bridge = BridgeThread(Bridge(s)).start()
        try:
            _wait(lambda: job.step(0) >= 10 and job.step(1) >= 10, 120, "both ranks training")
            time.sleep(1.0)
            with Journal(tmp_path / "node0.db", readonly=True) as j:
                assert not j.events(kinds=["peer_lost"])  # a peer that refuses is a peer that answers
            net.partition()
            t0 = time.monotonic()
            d = _wait(lambda: _saved(tmp_path, 0), 30, "rank 0 saved")[0]
            took = time.monotonic() - t0
            print(f"link lost -> peer_lost -> rank 0 saved in {took:.2f} s (lost_after_s 1, boundary_wait_s 2)")
            m = ckpt.verify(d)
            assert m.meta["collective_free"] is True and m.step == job.step(0), (m.step, job.step(0))
            assert not _saved(tmp_path, 1)  # node 1 has no bridge here: its rank only blocks
            with Journal(tmp_path / "node0.db", readonly=True) as j:
                lost = j.events(kinds=["peer_lost"])
                assert [e.data["peer"] for e in lost] == [f"{node_addr(1)}:22"]
            net.partition(False)
            _wait(lambda: bridge.bridge.peers and not bridge.bridge.peers.lost, 10, "peer_back")
        finally:
            bridge.stop()
            job.kill()
