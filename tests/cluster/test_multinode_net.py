"""A 2-node job across real network namespaces (holdover.lab.cluster_net), torchrun on each node
with a static rendezvous, one gloo rank per node, each node its own checkpoint disk and its own
bridge. A power cut: both ranks save one step, agreed over the link, and each node's bridge
verifies its rank's files. The link between the nodes dies while the ranks are training: no
collective can complete, and each rank's Guard saves its last whole step on its own. A rank killed
in the middle of its save: that step is not the job's. In every case, resumed on both nodes, the
state is bit for bit what it was at the step resumed."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from holdover.bridge.service import Bridge, BridgeThread
from holdover.cli.common import describe_job
from holdover.journal import Journal
from holdover.lab.broker import free_port
from holdover.lab.cluster_net import ClusterNet, NodeBridges, TorchrunJob, node_addr
from holdover.node.launch import recover
from holdover.settings import Settings
from holdover.train import ckpt, registry
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


def _resume_bit_for_bit(net: ClusterNet, tmp: Path, job: TorchrunJob, step: int, *args: str) -> None:
    """The job started again on both nodes: each rank loads `step`, its model and optimizer bit for
    bit as `job` printed them at that step."""
    again = TorchrunJob(net, tmp, "--steps", str(step + 2), "--step-sleep", "0", *args)
    assert again.finish() == [0, 0], [e.read_text()[-1500:] for e in again.errs]
    for node in (0, 1):
        first = again.lines[node][0]
        assert first["resumed"] == step and first["digest"] == job.digest(node, step), first


@pytest.mark.long
def test_a_cut_saves_one_step_on_both_nodes_each_bridge_verifies_its_rank_and_both_resume_bit_for_bit(
    tmp_path: Path,
) -> None:
    """One broker, one emulated sentinel, one bridge a node (holdover.lab.cluster_net.NodeBridges)."""
    with ClusterNet(2) as net, NodeBridges(tmp_path) as site:
        job = TorchrunJob(net, tmp_path, "--step-sleep", "0.02")
        try:
            _wait(lambda: job.registered() and min(job.step(0), job.step(1)) >= 5, 120, "both ranks training")
            t0 = time.monotonic()
            site.rig.control.send(mains=False)
            site.rig.wait("mains_lost", 5, t0)
            got = _wait(lambda: all(map(site.verified, (0, 1))) and [site.verified(n) for n in (0, 1)], 60, "verified")
            took = time.monotonic() - t0
            dirs = [Path(g[0]["dir"]) for g in got]
            steps = [ckpt.verify(d).step for d in dirs]
            print(f"cut -> both bridges verified their rank's checkpoint in {took:.2f} s (grace 0.5 s), steps {steps}")
            # One cut, two bridges, two requests some ms apart: the save the ranks agreed on for
            # the first answers the second (the Guard's join_window_s), so one step on both.
            assert steps[0] == steps[1], steps
            saved = steps[0]
            for n in (0, 1):
                assert dirs[n] == job.ckpt(n) / f"rank{n}" / f"step_{saved:09d}", dirs  # each bridge its own rank
                rec = lambda n=n: (jobrec.read(job.ckpt(n)).complete or {}).get("step") == saved  # noqa: E731
                _wait(rec, 10, f"node {n}'s record of step {saved} complete on both ranks")
        finally:
            job.kill()
        _resume_bit_for_bit(net, tmp_path, job, saved)


@pytest.mark.long
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
            # not agree; resume settles it). The done record follows the checkpoint's rename (seen:
            # read between the two on a loaded host), so it is waited for.
            for n in (0, 1):
                root = tmp_path / f"node{n}" / "ckpt"
                view = _wait(lambda root=root, n=n: (v := jobrec.read(root)).done.get(n) and v, 10, f"rank {n} done")
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

        _resume_bit_for_bit(net, tmp_path, job, saved)


@pytest.mark.long
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


@pytest.mark.long
def test_a_rank_killed_during_its_save_leaves_that_step_to_no_one_and_both_resume_the_one_before(
    tmp_path: Path,
) -> None:
    """Both ranks save at steps 3 and 6 (a 200 MB state, so a save lasts long enough to be caught
    in); rank 1 is killed -9 the moment its step-6 directory is being built."""
    with ClusterNet(2) as net:
        job = TorchrunJob(
            net, tmp_path, "--step-sleep", "0", "--width", "4096", "--save-at", "3,6", "--stall-save", "0"
        )
        try:
            _wait(lambda: (jobrec.read(job.ckpt(1)).complete or {}).get("step") == 3, 120, "step 3 complete")
            [reg] = registry.read_registrations(tmp_path / "node1" / "reg")[0]
            rank1 = job.ckpt(1) / "rank1"
            end = time.monotonic() + 60
            while not any(p.name.startswith(".tmp-step_000000006") for p in rank1.iterdir()):
                assert time.monotonic() < end, "rank 1 never began its step-6 save"
            os.kill(reg.pid, signal.SIGKILL)
            assert not (rank1 / "step_000000006").exists(), "the save finished before the kill: a bigger --width"
        finally:
            job.kill()
        for n in (0, 1):
            view = jobrec.read(job.ckpt(n))
            assert view.complete and view.complete["step"] == 3, view  # step 6 was never the job's
        assert jobrec.read(job.ckpt(1)).done[1]["step"] == 3
        assert [ckpt.verify(d).step for d in _saved(tmp_path, 1)] == [3]  # the half-built 6 is no candidate

        _resume_bit_for_bit(net, tmp_path, job, 3, "--width", "4096")
