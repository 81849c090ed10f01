"""`holdover demo --cluster`: a power cut on a Slurm cluster, without owning one.

Debian's own slurmctld, slurmd and munge in network namespaces (lab/slurm.py: a controller and two
nodes, n1 and n2, on circuit rack1), a bridge beside the controller (`[slurm]`, as docs/cluster.md
configures it) and one on each node (reporting its runs), all on one Mosquitto with the emulated
sentinel. A 2-node torch job (gloo on the lab's network, one rank a node, the Guard in each) trains;
the cut drains the circuit, signals every rank, both save one step, the job is requeued; power back
and steady resumes the nodes and the job starts again from that step. Everything it started is
gone when it ends (the lab ends whatever still runs in its namespaces), Ctrl-C included.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from holdover import events
from holdover.bridge.service import Bridge, BridgeThread
from holdover.cluster.slurm import SlurmError
from holdover.errors import HoldoverError
from holdover.journal import Journal
from holdover.lab import slurm
from holdover.lab.broker import BrokerError, free_port
from holdover.lab.ddp_trainee import resumed
from holdover.lab.demo import Timeline, headings, hold, until, verdict
from holdover.lab.rig import Rig
from holdover.settings import Settings, WebSettings
from holdover.train import ckpt

NODES = {"n1": f"{slurm.SUBNET}.11", "n2": f"{slurm.SUBNET}.12"}
CIRCUIT = "rack1"


def missing() -> str | None:
    """What this machine lacks for the cluster demo, in words, or None."""
    if os.geteuid() != 0:
        return "the cluster demo builds network namespaces for Slurm's daemons: run it as root"
    if not slurm.available():
        return (
            "the cluster demo runs Debian's own Slurm: sudo apt-get install slurmctld slurmd munge "
            "(their services need not run: the demo starts its own in namespaces)"
        )
    if importlib.util.find_spec("torch") is None:
        return "the cluster demo trains a 2-node torch job (gloo, CPU): pip install torch"
    return None


def _journaled(journal: Path, kind: str) -> list[dict[str, Any]]:
    with Journal(journal, readonly=True) as j:
        return [e.data for e in reversed(j.events(kinds=[kind]))]


def _node_bridge(rig: Rig, lab: slurm.SlurmLab, node: str) -> BridgeThread:
    """The bridge on a node: it hears the sentinel, asks its node's runs to save, reports them,
    and watches the other node of its job (`[cluster] peers`, here slurmd's port, checked from
    inside its node's namespace)."""
    other = next(addr for n, addr in NODES.items() if n != node)
    cfg = Settings.model_validate(
        {
            "mqtt": {"host": rig.broker.host, "port": rig.broker.port, "client_id": f"holdover-{node}"},
            "journal": {"path": str(lab.dir / f"journal-{node}.db")},
            "protect": {"registry": str(lab.dir / f"reg-{node}")},
            "failover": {"node": node},
            "cluster": {
                "peers": [f"{other}:6818"],
                "every_s": 0.5,
                "timeout_s": 0.5,
                "lost_after_s": 1.5,
                "netns": lab.ns_names[node],
            },
            "web": {"enabled": False},
        }
    )
    return BridgeThread(Bridge(cfg)).start()


def _saved_alone(lab: slurm.SlurmLab, after: int) -> dict[str, int] | None:
    """Each node's newest checkpoint of its rank, when both are past `after` and made without a
    collective (the Guard's watchdog, while the rank is blocked in one): {node: step}."""
    got = {}
    for node, rank in (("n1", 0), ("n2", 1)):
        for d in ckpt.candidates(lab.dir / f"ckpt-{node}" / f"rank{rank}"):
            with contextlib.suppress(HoldoverError, OSError):
                v = ckpt.verify(d)
                if v.step > after and v.meta.get("collective_free"):
                    got[node] = v.step
                break
    return got if len(got) == 2 else None


def run_cluster_demo(hold_s: float = 0.0) -> int:
    console = Console(soft_wrap=True)
    heading = headings(console)
    logging.getLogger("holdover").setLevel(logging.CRITICAL)
    lacking = missing()
    if lacking:
        console.print(f"[bold red]demo --cluster cannot run here:[/] {lacking}")
        return 2
    tl = Timeline(console)
    heading("holdover demo --cluster: a power cut on a 2-node Slurm cluster")
    checks: dict[str, bool] = {}
    try:
        # Closed in reverse, on every way out (Ctrl-C too): the bridges, then the lab, which ends
        # whatever still runs in its namespaces (the job's slurmstepd ignores SIGTERM).
        with contextlib.ExitStack() as stack:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="holdover-demo-")))
            lab = stack.enter_context(slurm.SlurmLab(NODES))
            tl.say("slurm", f"slurmctld on ctl, slurmd on n1 and n2 (Debian's own, in namespaces; conf {lab.conf})")
            circuit = {"name": CIRCUIT, "sentinel": "demo", "nodes": "n[1-2]"}
            rig = Rig(
                tmp,
                bridge_extra={
                    "slurm": {
                        "circuits": [circuit],
                        "conf": str(lab.conf),
                        "netns": lab.netns,
                        "grace": 0.5,
                        "resume_after_s": 1.0,
                        "then": "requeue",
                        "save_timeout_s": 60,
                    }
                },
                on_line=tl.line,
                on_seen=tl.seen,
                web=WebSettings(port=free_port()),
            )
            stack.callback(rig.close)
            rig.start()
            dashboard = f"http://127.0.0.1:{rig.web.port}/" if rig.web else ""
            tl.say("bridge", f"beside slurmctld: circuit {CIRCUIT} is n[1-2] on sentinel demo; dashboard {dashboard}")
            for n in NODES:
                stack.callback(_node_bridge(rig, lab, n).stop)
            tl.say("bridge", "one on each node, n1 and n2: each asks its node's runs to save and reports them")
            rig.wait("boot", timeout=20)

            run = (
                f"{sys.executable} -m holdover.lab.ddp_trainee --ckpt {lab.dir}/ckpt-$SLURMD_NODENAME"
                f" --registry {lab.dir}/reg-$SLURMD_NODENAME --step-sleep 0.05"
            )
            job = lab.run(
                "sbatch", "--parsable", "-N2", "-J", "llama-demo", "-o", str(lab.dir / "job-%j.out"),
                "--export", f"ALL,MASTER_ADDR={NODES['n1']},MASTER_PORT=29500,GLOO_SOCKET_IFNAME=eth0",
                "--wrap", f"srun bash -c '{run}'",
            ).strip()  # fmt: skip
            regs = [lab.dir / "reg-n1" / "train.json", lab.dir / "reg-n2" / "train.rank1.json"]
            until("both ranks registered", lambda: all(r.exists() for r in regs), 90)
            tl.say("slurm", f"job {job} (llama-demo): 2 ranks, one on each node, gloo, the Guard in each; training")
            time.sleep(1.0)  # a few steps, so the save is not of step 0

            journal = rig.dir / "journal.db"
            tl.say("demo", "cutting mains on rack1")
            t = time.monotonic()
            rig.control.send(mains=False)
            rig.wait("mains_lost", since=t)
            drained = until("the circuit drained", lambda: _journaled(journal, events.SLURM_DRAINED), 15)[0]
            tl.say("slurm", f"drained {drained.get('nodes', 'n[1-2]')}: nothing new starts on battery")
            checks["the circuit drained"] = True
            saved = until("the job saved on both nodes", lambda: _journaled(journal, events.SLURM_JOB_SAVED), 60)[0]
            step = saved["step"]
            tl.say(
                "slurm",
                f"job {saved['job']}: USR2 to every rank; both saved step {step} ({saved['count']} nodes), "
                f"{saved['then']} ({time.monotonic() - t:.1f} s after the cut)",
            )
            on_disk = all(
                (lab.dir / f"ckpt-{n}" / f"rank{rank}" / f"step_{step:09d}").is_dir()
                for n, rank in (("n1", 0), ("n2", 1))
            )
            checks["both ranks saved one step, each on its node's disk"] = saved["count"] == 2 and on_disk
            pending = until("the job pending", lambda: "PENDING" in lab.run("squeue", "-h", "-j", job, "-o", "%T"), 15)
            tl.say("slurm", f"job {job} requeued: pending while its nodes are drained")
            checks["the job requeued"] = saved["then"] == "requeued" and bool(pending)

            tl.say("demo", "power back")
            t = time.monotonic()
            rig.control.send(mains=True)
            rig.wait("mains_restored", since=t)
            until("the nodes resumed", lambda: _journaled(journal, events.SLURM_RESUMED), 20)
            tl.say("slurm", "power steady: n[1-2] resumed (holdover drained them, so holdover resumes them)")
            checks["the nodes resumed"] = True
            # Slurm holds a requeued job back (its BeginTime, about two minutes): a person in a
            # hurry says "now", as here.
            lab.run("scontrol", "update", f"JobId={job}", "StartTime=now")
            tl.say("slurm", f"scontrol update JobId={job} StartTime=now (Slurm holds a requeued job ~2 min)")
            out = lab.dir / f"job-{job}.out"

            def restarted() -> dict[int, int] | None:  # the first run said 0 on both ranks
                r = resumed(out.read_text(errors="replace")) if out.exists() else {}
                return r if len(r) == 2 and min(r.values()) >= step else None

            back = until("both ranks resumed", restarted, 90)
            tl.say("slurm", f"job {job} running again: rank 0 resumed from step {back[0]}, rank 1 from {back[1]}")
            checks[f"both ranks resumed from step {step}"] = back == {0: step, 1: step}
            time.sleep(1.0)  # a few steps of the resumed run

            tl.say("demo", "the link between n1 and n2 dies (every frame between them dropped); power stays on")
            t = time.monotonic()
            lab.partition()
            lost = until("peer_lost on a node", lambda: _journaled(lab.dir / "journal-n1.db", events.PEER_LOST), 20)
            tl.say(
                "bridge",
                f"on n1: {lost[0].get('peer', 'n2')} silent {time.monotonic() - t:.1f} s: peer_lost, "
                "asks its rank to save (n2's bridge the same)",
            )
            alone = until("both ranks saved without a collective", lambda: _saved_alone(lab, step), 30)
            tl.say(
                "slurm",
                f"each rank, blocked in its all-reduce, saved alone: n1 step {alone['n1']}, n2 step {alone['n2']}, "
                f"no collective ({time.monotonic() - t:.1f} s after the link died)",
            )
            checks["a link loss: both ranks saved one step without a collective"] = alone["n1"] == alone["n2"]
            lab.partition(False)
            if hold_s > 0:
                hold(tl, rig, [], dashboard, hold_s)
        tl.say("demo", "the lab closed: its daemons, the job's steps and slurmstepd ended")
    except KeyboardInterrupt:
        tl.close()
        console.print("[bold yellow]demo interrupted:[/] the lab, its job and the bridges are stopped")
        return 130
    except (BrokerError, HoldoverError, SlurmError, TimeoutError, OSError) as e:
        tl.close()
        console.print(f"[bold red]demo failed:[/] {e}")
        return 1
    tl.close()
    heading("verdict")
    return verdict(console, checks)
