"""A 2-node job across real network namespaces (holdover.lab.cluster_net), torchrun on each node
with a static rendezvous, one gloo rank per node, each node its own checkpoint disk. The link
between the nodes dies while the ranks are training: no collective can complete, and each rank's
Guard saves its last whole step on its own; resumed on both nodes, the state is bit for bit what
it was at that step."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from holdover.cli.common import describe_job
from holdover.lab.broker import free_port
from holdover.lab.cluster_net import ClusterNet, node_addr
from holdover.node.launch import recover
from holdover.train import ckpt, registry
from holdover.train import job as jobrec

pytest.importorskip("torch")


class Job:
    """One torchrun a node, their workers' JSON lines gathered as they come."""

    def __init__(self, net: ClusterNet, tmp: Path, *args: str) -> None:
        port = free_port()
        self.tmp = tmp
        self.lines: dict[int, list[dict[str, Any]]] = {0: [], 1: []}
        self.procs: list[subprocess.Popen[str]] = []
        self.readers: list[threading.Thread] = []
        self.errs = [tmp / f"node{node}.err" for node in (0, 1)]
        for node in (0, 1):
            argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1"]
            argv += ["--node-rank", str(node), "--master-addr", node_addr(0), "--master-port", str(port)]
            argv += ["-m", "holdover.lab.ddp_trainee", "--ckpt", str(tmp / f"node{node}" / "ckpt")]
            argv += ["--registry", str(tmp / f"node{node}" / "reg"), *args]
            # gloo would take the address the hostname resolves to (loopback in a namespace)
            env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0"}
            p = subprocess.Popen(
                net.argv(node, argv),
                env=env,
                stdout=subprocess.PIPE,
                stderr=self.errs[node].open("w"),
                text=True,
                start_new_session=True,
            )
            self.procs.append(p)
            self.readers.append(threading.Thread(target=self._read, args=(node, p), daemon=True))
            self.readers[-1].start()

    def _read(self, node: int, p: subprocess.Popen[str]) -> None:
        assert p.stdout is not None
        for line in p.stdout:
            if line.startswith("{"):
                self.lines[node].append(json.loads(line))

    def step(self, node: int) -> int:
        return max((x.get("step", 0) for x in self.lines[node]), default=0)

    def digest(self, node: int, step: int) -> str:
        return next(x["digest"] for x in self.lines[node] if x.get("step") == step)

    def kill(self) -> None:
        """Every process of the job, -9: torchrun starts its workers in sessions of their own, so
        killing the agents alone would leave the ranks running."""
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(30)
        for node in (0, 1):
            for reg in registry.read_registrations(self.tmp / f"node{node}" / "reg")[0]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(reg.pid, signal.SIGKILL)
                _wait(lambda pid=reg.pid: not registry.pid_alive(pid), 30, f"rank {reg.rank} gone")

    def finish(self, timeout: float = 120) -> None:
        for p, t, err in zip(self.procs, self.readers, self.errs, strict=True):
            assert p.wait(timeout) == 0, err.read_text()[-2000:]
            t.join(10)


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
        job = Job(net, tmp_path, "--step-sleep", "0.02", "--stall-save", "3")
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

        again = Job(net, tmp_path, "--steps", str(saved + 2), "--step-sleep", "0")
        again.finish()
        for node in (0, 1):
            first = again.lines[node][0]
            assert first["resumed"] == saved and first["digest"] == job.digest(node, saved), first
