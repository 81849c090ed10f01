#!/usr/bin/env python3
"""A site of dozens of Slurm nodes on one machine: what one cut of a circuit costs as the site grows.

Per site size (--sizes, nodes): Debian's slurmctld with that many slurmd, each in a network
namespace of its own (holdover.lab.slurm, grown), on two circuits (rackA: the first half, watched by
the emulated sentinel; rackB: the rest, by a second sentinel that stays quiet); a real Mosquitto; the
controller's bridge beside slurmctld (`holdover bridge`, [slurm] with both circuits, grace 0) and a
bridge on every node (`holdover bridge`, [failover] node = its name), each a process of its own, all
on the one broker, all with the same alert channel (an ntfy-style receiver on loopback). Jobs: a
single-node job on every node but the two on each side of the circuits' border, and a two-node job
on each such pair, spanning both circuits. Every job trains under the Guard: a single-node job the
torch-free trainee (holdover.lab.trainee), a two-node job the torch data-parallel one
(holdover.lab.ddp_trainee: gloo between the namespaces, the ranks agreeing on the step they save);
each rank is started by a shell that traps USR2 and writes the time it got it, beside the Guard
that gets it too. The controller's bridge has [slurm] then = "suspend".

Each cut (--cuts a size): the sentinel's mains cut, then timed from that moment: until slurmctld's
nodes of rackA are drained (the controller's slurm_drained event), until every task of every job
with a step on rackA has its signal (the latest trap's time), and until every such job is saved at
one step on all its nodes (each node's bridge reporting its ranks' verified checkpoints) and
suspended (the last slurm_job_saved); power back: until the nodes and the jobs are resumed.
Counted over each cut's window (cut to resumed, then 1 s): Slurm commands the controller's bridge
ran (a logging shim before Slurm's own on its PATH), MQTT messages on the broker (a subscriber to
#), alerts the receiver got. At the end, each bridge's resident memory and CPU over the cuts.

Then one cut of both circuits at once (rackB's sentinel's signed events published by the bench, as
its board would send them): every job told once (a job across both circuits is signalled by one
circuit's cut only), saved, suspended once, and resumed when both are back. And what the broker keeps
retained at the end (a new subscriber to # gets it all): messages and bytes, by kind.

Last, one cut with the controller's bridge restarted with then = "requeue" (a requeued job does not
run again for a next cut): until every job on rackA is saved and requeued, and pending in Slurm.

    .venv/bin/python bench/site_scale.py [--sizes 2,8,16,32] [--cuts 5] [--smoke]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "host"))

import paho.mqtt.client as mqtt
import psutil
import tomli_w
from common import parse, wait

from holdover.firmware import protocol
from holdover.journal import Journal, NoJournalYet
from holdover.lab.ntfy import Ntfy
from holdover.lab.rig import Rig
from holdover.lab.slurm import SUBNET, SlurmLab
from holdover.lab.stats import percentile

SLURM_COMMANDS = ("scancel", "scontrol", "squeue", "sinfo")
# Each rank under a shell whose trap stamps the signal's arrival; the rank (in the background, so
# the trap runs at once and not when the rank ends) gets the same signal from slurmstepd.
TASK = (
    """srun bash -c 'trap "date +%s.%N > {dir}/sig-$SLURM_JOB_ID-$SLURMD_NODENAME" USR2; """
    """{run} --ckpt {work}/ckpt-$SLURM_JOB_ID --registry {work}/reg-$SLURMD_NODENAME --step-sleep 0.05 & """
    """while kill -0 $! 2>/dev/null; do wait $!; done'"""
)
SINGLE = f"{sys.executable} -m holdover.lab.trainee --name train --mb 1"
PAIR = f"{sys.executable} -m holdover.lab.ddp_trainee --name train"
HOLDOVER = Path(sys.executable).with_name("holdover")


class Counter:
    """Every MQTT message on the broker, by when it arrived."""

    def __init__(self, host: str, port: int) -> None:
        self.at: list[float] = []
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="site-scale-counter")
        self.c.on_connect = lambda c, *_a: c.subscribe("#", qos=0)
        self.c.on_message = lambda *_a: self.at.append(time.time())
        self.c.connect(host, port)
        self.c.loop_start()

    def between(self, t0: float, t1: float) -> int:
        return sum(1 for t in list(self.at) if t0 <= t < t1)

    def close(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


class Board:
    """A sentinel without an emulator: its signed events, as firmware/protocol.py frames them."""

    def __init__(self, sid: str, key: str, host: str, port: int) -> None:
        self.sid, self.signer = sid, protocol.Signer(key)
        self.boot, self.seq, self.t0 = secrets.token_hex(4), 0, time.monotonic()
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"site-scale-{sid}")
        self.c.connect(host, port)
        self.c.loop_start()

    def send(self, kind: str) -> None:
        self.seq += 1
        ms = int((time.monotonic() - self.t0) * 1000)
        raw = protocol.encode(self.signer, self.sid, self.boot, self.seq, ms, int(time.time()), kind, {})
        self.c.publish(protocol.topic(self.sid, protocol.EVENT), raw, qos=1)

    def close(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


def retained(host: str, port: int) -> dict[str, list[int]]:
    """What the broker keeps retained, by the topic's first levels: each message's bytes."""
    got: dict[str, int] = {}
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="site-scale-retained")
    c.on_connect = lambda c, *_a: c.subscribe("#", qos=0)
    c.on_message = lambda _c, _u, m: got.__setitem__(m.topic, len(m.payload)) if m.retain else None
    c.connect(host, port)
    c.loop_start()
    seen, quiet_since = -1, time.monotonic()
    while time.monotonic() - quiet_since < 1.0:  # they come at once on subscribing; then nothing
        time.sleep(0.1)
        if len(got) != seen:
            seen, quiet_since = len(got), time.monotonic()
    c.loop_stop()
    c.disconnect()
    by: dict[str, list[int]] = {}
    for topic, size in got.items():
        parts = topic.split("/")
        kind = f"{parts[0]}/node/*/{parts[-1]}" if parts[1:2] == ["node"] else f"{parts[0]}/*/{parts[-1]}"
        by.setdefault(kind, []).append(size)
    return by


def shim(where: Path) -> Path:
    """Slurm's commands, each logging its arguments before running Slurm's own."""
    where.mkdir()
    log = where / "calls.log"
    for name in SLURM_COMMANDS:
        real = shutil.which(name)
        assert real, name
        p = where / name
        p.write_text(f'#!/bin/sh\necho "$(date +%s.%N) {name} $*" >> {log}\nexec {real} "$@"\n')
        p.chmod(0o755)
    return log


def calls(log: Path, t0: float, t1: float) -> list[str]:
    """The Slurm commands run between t0 and t1, each as "<epoch s> <command> <arguments>"."""
    if not log.exists():
        return []
    return [line for line in log.read_text().splitlines() if t0 <= float(line.split(" ", 1)[0]) < t1]


def events(journal: Path, kind: str) -> list[Any]:
    try:
        with Journal(journal, readonly=True) as j:
            # All of them: the journal's default page (100) would cap what the cuts are counted by.
            return list(reversed(j.events(kinds=[kind], limit=1_000_000)))
    except NoJournalYet:  # the bridge has not made it yet
        return []


def told(sig: Path, tasks: set[tuple[str, str]], t0: float) -> float | None:
    """Seconds from t0 to the last of these (job, node) tasks' traps, once every one has fired."""
    times = {}
    for f in sig.glob("sig-*"):
        text = f.read_text().strip()
        if text:  # written, not only opened
            _, job, node = f.name.split("-", 2)
            times[(job, node)] = float(text)
    return max(times.values()) - t0 if set(times) >= tasks else None


def saved(journal: Path, since: int, jobs: set[str]) -> list[Any] | None:
    """The slurm_job_saved events after the first `since`, once they name every one of these jobs."""
    new = events(journal, "slurm_job_saved")[since:]
    return new if {e.data["job"] for e in new} >= jobs else None


def running_again(lab: SlurmLab, jobs: dict[str, list[str]]) -> None:
    wait(
        "every job running again",
        lambda: len(lab.run("squeue", "-h", "-t", "RUNNING", "-o", "%i").split()) == len(jobs),
        30,
    )


def bridge(config: Path, cfg: dict[str, Any], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    config.write_text(tomli_w.dumps(cfg))
    return subprocess.Popen(
        [str(HOLDOVER), "bridge", "--config", str(config)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(log, "wb"),
        start_new_session=True,
    )


def site(n: int, work: Path, cuts: int) -> dict[str, Any]:
    nodes = {f"n{i}": f"{SUBNET}.{10 + i}" for i in range(1, n + 1)}
    half = n // 2
    a_nodes = [f"n{i}" for i in range(1, half + 1)]
    out: dict[str, Any] = {"nodes": n, "drained": [], "told": [], "resumed": [], "commands": [], "messages": [],
                           "alerts": [], "twice": [], "heard": [], "first_call": [], "jobs_told": 0}  # fmt: skip
    receiver = Ntfy().start()
    t_lab = time.monotonic()
    with SlurmLab(nodes) as lab:
        up_s = time.monotonic() - t_lab
        sig = work / "sig"
        sig.mkdir(parents=True)
        log = shim(work / "shim")
        alerts = {"channels": [{"name": "phone", "url": receiver.url("site"), "per_hour": 3600}],
                  "dedup_s": 0}  # fmt: skip
        rig = Rig(work / "rig")
        quiet = {"id": "quiet", "key": secrets.token_hex(16)}
        rig.bridge_extra = {
            "sentinels": [{"id": rig.sid, "key": rig.key}, quiet],
            "slurm": {
                "circuits": [
                    {"name": "rackA", "sentinel": rig.sid, "nodes": f"n[1-{half}]"},
                    {"name": "rackB", "sentinel": "quiet", "nodes": f"n[{half + 1}-{n}]"},
                ],
                "grace": 0,
                "resume_after_s": 0,
                "then": "suspend",
                "save_timeout_s": 60,
                "conf": str(lab.conf),
                "netns": lab.netns,
            },
            "alerts": alerts,
            "web": {"enabled": False},
        }
        rig.start(bridge=False, emulator=False)
        env = {**os.environ, "PATH": f"{log.parent}:{os.environ['PATH']}"}
        procs: dict[str, subprocess.Popen[bytes]] = {}
        counter = None
        try:
            procs["controller"] = bridge(rig.dir / "holdover.toml", rig.bridge_config(), work / "ctl.err", env)
            for name in nodes:
                # Each node hears its own circuit's sentinel, as a site's nodes are set up.
                mine = {"id": rig.sid, "key": rig.key} if name in a_nodes else quiet
                cfg = {
                    "mqtt": {"host": rig.broker.host, "port": rig.broker.port, "client_id": f"holdover-{name}"},
                    "sentinels": [mine],
                    "journal": {"path": str(work / f"journal-{name}.db")},
                    "protect": {"registry": str(work / f"reg-{name}")},
                    "failover": {"node": name},
                    "alerts": alerts,
                    "web": {"enabled": False},
                }
                procs[name] = bridge(work / f"{name}.toml", cfg, work / f"{name}.err", os.environ.copy())
            # Every bridge subscribed before the sentinel boots: the first to receipt an event takes it
            # off the board's outbox, and a bridge still starting would never hear it.
            logs = [work / "ctl.err", *(work / f"{name}.err" for name in nodes)]
            wait("every bridge connected", lambda: all("connected to broker" in f.read_text() for f in logs), 120)
            rig.start_emulator()
            journal = rig.dir / "journal.db"
            wait("the sentinel's boot journaled", lambda: journal.exists() and events(journal, "boot"), 60)
            # Jobs: a two-node job across the border (and one more each side of it), singles elsewhere.
            pairs = [(half, half + 1)] + ([(half - 1, half + 2)] if n >= 4 else [])
            paired = {i for p in pairs for i in p}
            jobs: dict[str, list[str]] = {}
            for k, p in enumerate(pairs):
                names = [f"n{i}" for i in p]
                export = f"ALL,MASTER_ADDR={nodes[names[0]]},MASTER_PORT={29500 + k},GLOO_SOCKET_IFNAME=eth0"
                task = TASK.format(dir=sig, work=work, run=PAIR)
                job = lab.run(
                    "sbatch", "--parsable", "-N2", "-w", ",".join(names), "-o", "/dev/null", "--export", export,
                    "--wrap", task,
                )  # fmt: skip
                jobs[job.strip()] = names
            for i in range(1, n + 1):
                if i not in paired:
                    task = TASK.format(dir=sig, work=work, run=SINGLE)
                    job = lab.run("sbatch", "--parsable", "-N1", "-w", f"n{i}", "-o", "/dev/null", "--wrap", task)
                    jobs[job.strip()] = [f"n{i}"]
            wait(
                "every job running",
                lambda: lab.run("squeue", "-h", "-t", "RUNNING", "-o", "%i").split().__len__() == len(jobs),
                60,
            )
            assert all(p.poll() is None for p in procs.values()), "a bridge exited"
            # Every rank registered with its node's bridge (torch's import takes seconds a rank here).
            regs = [work / f"reg-{node}" / ("train.json" if r == 0 else f"train.rank{r}.json")
                    for ns in jobs.values() for r, node in enumerate(ns)]  # fmt: skip
            wait("every rank registered", lambda: all(r.exists() for r in regs), 180)
            time.sleep(3.0)  # the node bridges' first states out; the jobs' traps set
            counter = Counter(rig.broker.host, rig.broker.port)
            on_a = {(j, node) for j, ns in jobs.items() if set(ns) & set(a_nodes) for node in ns}
            out["jobs"], out["jobs_on_cut"] = len(jobs), len({j for j, _n in on_a})
            cut_jobs = {j for j, _n in on_a}
            out["saved"], out["not_suspended"], out["not_resumed"] = [], 0, 0
            cpu0 = {k: sum(psutil.Process(p.pid).cpu_times()[:2]) for k, p in procs.items()}
            t_cuts = time.time()
            for _ in range(cuts):
                for f in sig.glob("sig-*"):
                    f.unlink()
                drained0, resumed0, saved0, alerts0 = (
                    len(events(journal, "slurm_drained")),
                    len(events(journal, "slurm_resumed")),
                    len(events(journal, "slurm_job_saved")),
                    len(receiver.got),
                )
                t0 = time.time()
                rig.control.send(mains=False)

                out["told"].append(wait("every task on rackA told", lambda t0=t0: told(sig, on_a, t0), 60))
                wait("slurm_drained", lambda d=drained0: len(events(journal, "slurm_drained")) > d, 30)
                drained = events(journal, "slurm_drained")[-1]
                out["drained"].append(drained.rx_ts - t0)
                out["heard"].append(events(journal, "mains_lost")[-1].rx_ts - t0)  # the debounce, then the wire
                first = calls(log, t0, time.time())
                out["first_call"].append(float(first[0].split()[0]) - t0 if first else float("nan"))
                out["jobs_told"] = drained.data["jobs_told"]

                new = wait("every job on rackA saved and suspended", lambda s0=saved0: saved(journal, s0, cut_jobs), 60)
                out["saved"].append(max(e.rx_ts for e in new) - t0)
                out["not_suspended"] += sum(e.data["then"] != "suspended" for e in new)
                t1 = time.time()
                rig.control.send(mains=True)
                wait("slurm_resumed", lambda r=resumed0: len(events(journal, "slurm_resumed")) > r, 30)
                back = events(journal, "slurm_resumed")[-1]
                out["resumed"].append(back.rx_ts - t1)
                out["not_resumed"] += len(cut_jobs - set(back.data.get("jobs") or []))
                running_again(lab, jobs)
                wait("nothing drained", lambda: all("drain" not in s for s, _ in lab.states().values()), 30)
                time.sleep(1.0)  # the last messages of the cut
                quiet_since, seen = time.monotonic(), len(receiver.got)
                while time.monotonic() - quiet_since < 2.0:  # alerts still leaving (apprise loads at the first)
                    time.sleep(0.2)
                    if len(receiver.got) != seen:
                        quiet_since, seen = time.monotonic(), len(receiver.got)
                t2 = time.time()
                out["commands"].append(calls(log, t0, t2))
                out["messages"].append(counter.between(t0, t2))
                titles = [str(m.get("title") or m.get("message"))[:80] for m in receiver.got[alerts0:]]
                out["alerts"].append(len(titles))
                out["twice"].append(len(titles) - len(set(titles)))  # one site: nothing said by two bridges
                out.setdefault("first_titles", titles)
                time.sleep(1.0)
            span = time.time() - t_cuts
            out["both"] = both(rig, quiet, lab, jobs, sig, journal, log)
            out["retained"] = retained(rig.broker.host, rig.broker.port)
            rss = {k: psutil.Process(p.pid).memory_info().rss for k, p in procs.items()}
            cpu = {k: (sum(psutil.Process(p.pid).cpu_times()[:2]) - cpu0[k]) / span for k, p in procs.items()}
            out["rss_ctl_mb"] = rss["controller"] / 1e6
            out["rss_node_mb"] = max(v for k, v in rss.items() if k != "controller") / 1e6
            out["cpu_ctl"] = cpu["controller"]
            out["cpu_node"] = statistics.median(v for k, v in cpu.items() if k != "controller")
            out["lab_up_s"] = up_s
            out["requeue"] = requeue_cut(rig, procs, env, work, cut_jobs, journal, lab)
        except BaseException:
            for name in ("ctl", *list(nodes)[:1]):  # what the bridges said, so a failure names its cause
                err = work / f"{name}.err"
                if err.exists():
                    print(f"--- {name}'s bridge:\n" + err.read_text(errors="replace")[-1500:], file=sys.stderr)
            with contextlib.suppress(Exception):  # and what the controller's bridge did, in Slurm's terms
                for kind in ("slurm_drained", "slurm_job_saved", "slurm_job_unsaved", "slurm_failed", "slurm_resumed"):
                    for e in events(rig.dir / "journal.db", kind)[-40:]:
                        print(f"--- {kind} at {e.rx_ts:.2f}: {json.dumps(e.data)[:400]}", file=sys.stderr)
                print("--- squeue:\n" + lab.run("squeue", "-h", "-o", "%i %T %N %j"), file=sys.stderr)
            raise
        finally:
            if counter:
                counter.close()
            for p in procs.values():
                p.terminate()
            for p in procs.values():
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            rig.close()
            receiver.stop()
    return out


def both(rig: Rig, quiet: dict[str, str], lab: SlurmLab, jobs: dict[str, list[str]], sig: Path, journal: Path,
         log: Path) -> dict[str, Any]:  # fmt: skip
    """Both circuits cut at once, and back at once: every job told once, saved, suspended and resumed.
    rackB's board has no debounce here: its cut reaches the bridges 0.3 s before the emulated one's."""
    board = Board(quiet["id"], quiet["key"], rig.broker.host, rig.broker.port)
    try:
        for f in sig.glob("sig-*"):
            f.unlink()
        everywhere = {(j, node) for j, ns in jobs.items() for node in ns}
        saved0, resumed0 = len(events(journal, "slurm_job_saved")), len(events(journal, "slurm_resumed"))
        t0 = time.time()
        rig.control.send(mains=False)
        board.send(protocol.MAINS_LOST)

        got: dict[str, Any] = {"told": wait("every task of both circuits told", lambda: told(sig, everywhere, t0), 60)}
        new = wait("every job saved and suspended", lambda: saved(journal, saved0, set(jobs)), 60)
        got["saved"] = max(e.rx_ts for e in new) - t0
        got["saved_events"], got["suspended"] = len(new), sum(e.data["then"] == "suspended" for e in new)
        cmds = calls(log, t0, time.time())
        signalled = [j for c in cmds if " scancel " in f" {c} " for j in c.split()[3:]]
        got["signalled"], got["told_twice"] = len(signalled), len(signalled) - len(set(signalled))
        t1 = time.time()
        rig.control.send(mains=True)
        board.send(protocol.MAINS_RESTORED)
        both_back = wait("both circuits resumed", lambda: len(events(journal, "slurm_resumed")) >= resumed0 + 2, 30)
        back = events(journal, "slurm_resumed")[resumed0:]
        got["resumed"] = max(e.rx_ts for e in back) - t1 if both_back else float("nan")
        got["not_resumed"] = len(set(jobs) - {j for e in back for j in e.data.get("jobs") or []})
        got["commands"] = len(calls(log, t0, time.time()))
        running_again(lab, jobs)
        return got
    finally:
        board.close()


def requeue_cut(
    rig: Rig,
    procs: dict[str, subprocess.Popen[bytes]],
    env: dict[str, str],
    work: Path,
    cut_jobs: set[str],
    journal: Path,
    lab: SlurmLab,
) -> dict[str, Any]:
    """One last cut, the controller's bridge restarted with [slurm] then = "requeue" (a requeued job
    does not run again for a next cut): until every job on rackA is saved at one step and requeued,
    and until Slurm lists them pending."""
    procs["controller"].terminate()
    procs["controller"].wait(15)
    rig.bridge_extra["slurm"]["then"] = "requeue"
    err = work / "ctl-requeue.err"
    procs["controller"] = bridge(rig.dir / "holdover.toml", rig.bridge_config(), err, env)
    wait("the controller's bridge back", lambda: "connected to broker" in err.read_text(), 60)
    time.sleep(1.0)  # its subscriptions: the nodes' retained states, which it follows the jobs by
    saved0, resumed0 = len(events(journal, "slurm_job_saved")), len(events(journal, "slurm_resumed"))
    t0 = time.time()
    rig.control.send(mains=False)

    new = wait("every job on rackA saved and requeued", lambda: saved(journal, saved0, cut_jobs), 60)
    got: dict[str, Any] = {"saved": max(e.rx_ts for e in new) - t0}
    got["not_requeued"] = sum(e.data["then"] != "requeued" for e in new)

    def pending() -> bool:
        out = lab.run("squeue", "-h", "-t", "PENDING", "-o", "%i").split()
        return set(out) >= cut_jobs

    wait("every requeued job pending", pending, 30)
    got["pending"] = time.time() - t0
    rig.control.send(mains=True)
    wait("slurm_resumed", lambda: len(events(journal, "slurm_resumed")) > resumed0, 30)
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="2,8,16,32", help="site sizes, nodes")
    ap.add_argument("--cuts", type=int, default=5)
    args = parse(ap, sizes="2", cuts=1)
    sizes = [int(x) for x in args.sizes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="holdover-site-scale-", dir="/var/tmp") as tmp:
        for n in sizes:
            got = site(n, Path(tmp) / f"site{n}", args.cuts)
            rows.append(got)
            per_cut = [len(c) for c in got["commands"]]
            b, r = got["both"], got["retained"]
            kinds = sorted({" ".join(c.split()[1:3]) for cs in got["commands"] for c in cs})
            print(
                f"{n:3d} nodes, {got['jobs']} jobs ({got['jobs_on_cut']} with a step on the cut circuit), "
                f"lab up in {got['lab_up_s']:.1f} s:\n"
                f"    cut -> the controller's bridge journaled mains_lost p50 {percentile(got['heard'], 50):.2f} s "
                f"(the sentinel's debounce is 0.30 s), "
                f"its first Slurm command p50 {percentile(got['first_call'], 50):.2f} s\n"
                f"    cut -> drained p50 {percentile(got['drained'], 50):.2f} s p95 {percentile(got['drained'], 95):.2f} s; "  # noqa: E501
                f"-> every task told p50 {percentile(got['told'], 50):.2f} s p95 {percentile(got['told'], 95):.2f} s; "
                f"-> every job saved at one step everywhere and suspended p50 {percentile(got['saved'], 50):.2f} s "
                f"p95 {percentile(got['saved'], 95):.2f} s ({got['not_suspended']} not suspended); "
                f"power back -> nodes and jobs resumed p50 {percentile(got['resumed'], 50):.2f} s "
                f"({got['not_resumed']} job(s) not resumed)\n"
                f"    a cut: {statistics.median(per_cut):.0f} Slurm commands ({', '.join(kinds)}), "
                f"{statistics.median(got['messages']):.0f} MQTT messages, "
                f"{got['alerts'][0]} alert(s) at the first ({'; '.join(got['first_titles'])}), "
                f"{sum(got['alerts'][1:])} over the {len(got['alerts']) - 1} after it (a storm is merged), "
                f"{sum(got['twice'])} said twice\n"
                f"    both circuits cut at once: every task told {b['told']:.2f} s, every job saved and suspended "
                f"{b['saved']:.2f} s ({b['saved_events']} saved, {b['suspended']} suspended, {b['signalled']} signals, "
                f"{b['told_twice']} twice), both back -> resumed {b['resumed']:.2f} s ({b['not_resumed']} not), "
                f"{b['commands']} Slurm commands\n"
                f"    retained on the broker: {sum(len(v) for v in r.values())} messages, "
                f"{sum(sum(v) for v in r.values()) / 1024:.1f} KiB ("
                + ", ".join(f"{k} {len(v)} x {statistics.mean(v):.0f} B" for k, v in sorted(r.items()))
                + ")\n"
                f'    then = "requeue" (a last cut): every job saved and requeued {got["requeue"]["saved"]:.2f} s, '
                f"all pending in Slurm {got['requeue']['pending']:.2f} s ({got['requeue']['not_requeued']} not)\n"
                f"    bridges: controller {got['rss_ctl_mb']:.0f} MB, {got['cpu_ctl'] * 100:.1f} % CPU; "
                f"a node's at most {got['rss_node_mb']:.0f} MB, median {got['cpu_node'] * 100:.1f} % CPU",
                flush=True,
            )
    small, large = rows[0], rows[-1]
    grew = percentile(large["told"], 50) - percentile(small["told"], 50)
    cmds = [statistics.median(len(c) for c in r["commands"]) for r in rows]
    alerts = ", ".join(str(r["alerts"][0]) for r in rows)
    twice = sum(sum(r["twice"]) for r in rows)
    told = ", ".join(str(r["jobs_on_cut"]) for r in rows)
    saved = ", ".join(f"{percentile(r['saved'], 50):.2f}" for r in rows)
    verdict = [
        f"cut -> last task told grew {grew:+.2f} s from {small['nodes']} to {large['nodes']} nodes (goal < 1 s)",
        f"Slurm commands a cut: {', '.join(f'{c:.0f}' for c in cmds)} for {told} jobs told (goal: flat)",
        f"alerts at a site's first cut: {alerts}, said twice by two bridges: {twice} (goal: once for the site)",
        f"a node's bridge at most {max(r['rss_node_mb'] for r in rows):.0f} MB resident (goal < 80 MB)",
        "then = requeue, a last cut: saved and requeued "
        + ", ".join(f"{r['requeue']['saved']:.2f}" for r in rows)
        + " s; "
        f"cut -> every job saved at one step and suspended p50 {saved} s; "
        f"not suspended {sum(r['not_suspended'] for r in rows)}, not resumed {sum(r['not_resumed'] for r in rows)}",
    ]
    print("\nverdict: " + "; ".join(verdict))
    print(json.dumps([{k: v for k, v in r.items() if k != "commands"} for r in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
