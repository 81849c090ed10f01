#!/usr/bin/env python3
"""A power cut and a Slurm cluster: how soon every rank of a running two-node job is told to
checkpoint, and how soon the job is saved on both nodes and requeued, beside Slurm's own way of
warning a job (`sbatch --signal=USR2@T`), in one run on this machine.

Debian's slurmctld, slurmd and munge in network namespaces (holdover.lab.slurm), a real Mosquitto,
the emulated sentinel (real MicroPython, 300 ms debounce) and the bridge beside slurmctld, grace 0.

1. Cut -> every rank signalled: a two-node job whose tasks trap USR2 and write the wall time they
   got it; --cuts cuts, the power back (and the nodes resumed) between them. Measured from the
   moment the bench cut the emulated mains to the later of the two tasks' times.
2. Cut -> saved and requeued: a two-rank torch job (gloo, a Guard on each rank, a bridge on each
   node reporting its runs) under `then = "requeue"`: from the cut to slurm_job_saved, each
   needing a fresh job (torch's start on two cores dominates a cycle), --saves of them.
3. Slurm's own: the same trapping job submitted with `--signal=USR2@60` and a 10-minute limit,
   cut as in 1 for --own-cuts cuts with no bridge running (Slurm alone): how many of its ranks
   were told. Slurm sends that signal only 60 s before the time limit, whatever the power does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "host"))

from common import parse, wait

from holdover.bridge.service import Bridge, BridgeThread
from holdover.journal import Journal
from holdover.lab.rig import Rig
from holdover.lab.slurm import NODES, SlurmLab
from holdover.lab.stats import percentile
from holdover.settings import Settings, load

TRAP = """srun bash -c 'trap "date +%s.%N > {dir}/sig-$SLURMD_NODENAME" USR2; while :; do sleep 0.05; done'"""


def events(rig: Rig, kind: str) -> list[dict]:
    with Journal(rig.dir / "journal.db", readonly=True) as j:
        return [e.data for e in reversed(j.events(kinds=[kind]))]


def running(lab: SlurmLab, job: str) -> bool:
    return "RUNNING" in lab.run("squeue", "-h", "-j", job, "-o", "%T")


def cut_and_restore(rig: Rig, lab: SlurmLab, job: str, sig_dir: Path) -> float | None:
    """One cut: seconds until both of the job's tasks had the signal (None: not within 10 s)."""
    for p in sig_dir.glob("sig-*"):
        p.unlink()
    resumed = len(events(rig, "slurm_resumed"))
    t0 = time.time()
    rig.control.send(mains=False)

    def told() -> list[float] | None:
        # A trap's file can be there before its time is in it.
        times = [p.read_text().strip() for p in sig_dir.glob("sig-*")]
        return [float(x) for x in times] if len(times) == 2 and all(times) else None

    try:
        got: float | None = max(wait("both ranks told", told, 10)) - t0
    except TimeoutError:
        got = None
    rig.control.send(mains=True)
    if events(rig, "slurm_drained"):
        wait("the nodes resumed", lambda: len(events(rig, "slurm_resumed")) > resumed, 15)
    wait("idle or allocated", lambda: all("drain" not in s for s, _ in lab.states().values()), 15)
    return got


def summary(name: str, xs: list[float]) -> str:
    if not xs:
        return f"  {name}: none"
    return (
        f"  {name}: p50 {percentile(xs, 50) * 1000:.0f} ms, p95 {percentile(xs, 95) * 1000:.0f} ms,"
        f" max {max(xs) * 1000:.0f} ms (n={len(xs)})"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cuts", type=int, default=20)
    ap.add_argument("--saves", type=int, default=3)
    ap.add_argument("--own-cuts", type=int, default=3)
    args = parse(ap, cuts=1, saves=1, own_cuts=1)
    told: list[float] = []
    missed = 0
    saved: list[float] = []
    own_told = 0
    with tempfile.TemporaryDirectory(prefix="holdover-bench-slurm-") as tmp, SlurmLab() as lab:
        work = Path(tmp)
        slurm = {
            "circuits": [{"name": "rack1", "sentinel": "demo", "nodes": "n[1-2]"}],
            "grace": 0,
            "resume_after_s": 0,
            "then": "requeue",
            "save_timeout_s": 60,
            "conf": str(lab.conf),
            "netns": lab.netns,
        }
        rig = Rig(work / "rig", bridge_extra={"slurm": slurm})
        rig.start(bridge=False)
        nodes = []
        try:
            # 3. Slurm's own warning, Slurm alone: the sentinel cuts, nobody tells Slurm.
            own = work / "own"
            own.mkdir()
            job = lab.run(
                "sbatch", "--parsable", "-N2", "-t", "10", "--signal=USR2@60", "--wrap", TRAP.format(dir=own)
            ).strip()  # fmt: skip
            wait("the job with --signal running", lambda: running(lab, job), 30)
            time.sleep(0.5)
            for _ in range(args.own_cuts):
                rig.control.send(mains=False)
                time.sleep(3.0)
                own_told += len(list(own.glob("sig-*")))
                rig.control.send(mains=True)
                time.sleep(1.0)
            lab.run("scancel", job)
            wait("the job with --signal gone", lambda: not lab.run("squeue", "-h", "-j", job, "-o", "%T").strip(), 30)

            rig.start_bridge(load(rig.dir / "holdover.toml"))
            time.sleep(2.0)  # connected and subscribed
            # The sentinel's outbox sends the cuts of part 3 again (no bridge receipted them), up to a
            # minute apart: once they are in, and what they drained is resumed, part 1 starts clean.
            # Before this wait a late resend drained and signalled part 1's job before its cut.
            wait("part 3's cuts journaled", lambda: len(events(rig, "mains_restored")) >= args.own_cuts, 90)
            wait(
                "what they drained resumed",
                lambda: len(events(rig, "slurm_resumed")) >= len(events(rig, "slurm_drained")),
                30,
            )
            wait("no node drained", lambda: all("drain" not in s for s, _ in lab.states().values()), 30)
            print(f"part 3's cuts, sent again: {len(events(rig, 'slurm_drained'))} drain(s), then resumed", flush=True)
            # 1. Cut -> every rank told.
            sig = work / "sig"
            sig.mkdir()
            job = lab.run("sbatch", "--parsable", "-N2", "--wrap", TRAP.format(dir=sig)).strip()
            try:
                wait("the trapping job running", lambda: running(lab, job), 30)
            except TimeoutError:
                print(lab.states(), lab.run("squeue", "-h", "-o", "%i %T %r"), flush=True)
                raise
            time.sleep(0.5)
            for _ in range(args.cuts):
                got = cut_and_restore(rig, lab, job, sig)
                if got is None:
                    missed += 1
                else:
                    told.append(got)
            lab.run("scancel", job)
            wait("the trapping job gone", lambda: not lab.run("squeue", "-h", "-j", job, "-o", "%T").strip(), 30)

            # 2. Cut -> saved on both nodes and requeued (a bridge on each node reporting its runs).
            for n in NODES:
                cfg = Settings.model_validate(
                    {
                        "mqtt": {"host": rig.broker.host, "port": rig.broker.port, "client_id": f"holdover-{n}"},
                        "journal": {"path": str(work / f"journal-{n}.db")},
                        "protect": {"registry": str(work / f"reg-{n}")},
                        "failover": {"node": n},
                        "web": {"enabled": False},
                    }
                )
                nodes.append(BridgeThread(Bridge(cfg)).start())
            for i in range(args.saves):
                ck = work / f"ckpt{i}"
                run = (
                    f"{sys.executable} -m holdover.lab.ddp_trainee --ckpt {ck}-$SLURMD_NODENAME"
                    f" --registry {work}/reg-$SLURMD_NODENAME --name train{i} --step-sleep 0.05"
                )
                job = lab.run(
                    "sbatch", "--parsable", "-N2",
                    "--export", f"ALL,MASTER_ADDR={NODES['n1']},MASTER_PORT={29500 + i},GLOO_SOCKET_IFNAME=eth0",
                    "--wrap", f"srun bash -c '{run}'",
                ).strip()  # fmt: skip
                regs = [work / "reg-n1" / f"train{i}.json", work / "reg-n2" / f"train{i}.rank1.json"]
                wait("both ranks registered", lambda regs=regs: all(r.exists() for r in regs), 120)
                time.sleep(1.0)
                before = len(events(rig, "slurm_job_saved"))
                t0 = time.monotonic()
                rig.control.send(mains=False)
                wait("saved on both nodes", lambda b=before: len(events(rig, "slurm_job_saved")) > b, 60)
                saved.append(time.monotonic() - t0)
                last = events(rig, "slurm_job_saved")[-1]
                assert last["job"] == job and last["then"] == "requeued", last
                lab.run("scancel", job)
                resumed = len(events(rig, "slurm_resumed"))
                rig.control.send(mains=True)
                wait("the nodes resumed", lambda r=resumed: len(events(rig, "slurm_resumed")) > r, 15)
        finally:
            for b in nodes:
                b.stop()
            rig.close()
    print(f"a power cut and a two-node Slurm job, this machine ({time.strftime('%Y-%m-%d')}), grace 0")
    print("cut (emulated mains, 300 ms debounce) -> both ranks of the job have the signal:")
    print(summary("holdover: drain + scancel --signal=USR2", told) + f"; missed {missed} of {args.cuts}")
    print(f"  Slurm's own --signal=USR2@60 (10-minute limit): {own_told} rank(s) told over {args.own_cuts} cuts"
          + (" (never, for a power cut)" if own_told == 0 else ""))  # fmt: skip
    print("cut -> saved at one step on both nodes (verified, reported by each node's bridge) and requeued:")
    print(summary("holdover, a two-rank torch job", saved))
    if saved:
        print(f"  median {statistics.median(saved):.2f} s")
    print(json.dumps({"told_s": told, "missed": missed, "own_told": own_told, "saved_s": saved}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
