#!/usr/bin/env python3
"""A 2-node training job through power cuts and link losses: how soon both ranks hold a verified
checkpoint, beside what torchrun does on its own when the link dies, in one run.

Two node namespaces joined through a switch namespace (holdover.lab.cluster_net), one torchrun a
node with a static rendezvous, one gloo rank a node (holdover.lab.ddp_trainee, a Guard on each),
each node its own checkpoint directory. The link dies as an nftables drop in the switch: every
packet between the nodes lost, each node's own link up.

0. holdover, power cuts: --cuts cuts of the emulated sentinel's mains (debounce 300 ms), one
   bridge a node (holdover.lab.cluster_net.NodeBridges, grace --grace s); each timed from the
   cut to the moment both nodes' bridges have verified their rank's checkpoint (the ranks agree
   on the step over the link, which is up); power back, training goes on, the next cut.
1. holdover, link losses: --losses link losses of one job; each is timed from the drop to the moment both
   ranks' checkpoints verify (every byte hashed), and the step saved is compared with the last
   step each rank completed; then the link comes back and the job trains on (gloo's TCP recovers)
   until the next loss. The Guard's watchdog saves once no step has ended for --stall-save s.
2. torchrun alone: the same job with the watchdog off and a periodic save every --every steps (a
   training script's own checkpointing): from the drop to both torchrun agents exiting (the ranks'
   collective timing out after the process group's timeout, --pg-timeout; torch's default is 30
   min), and the newest step on disk it could restart from.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "host"))

from common import parse, wait

from holdover.lab.cluster_net import ClusterNet, NodeBridges, TorchrunJob
from holdover.lab.stats import percentile
from holdover.train import ckpt


def newest(job: TorchrunJob, node: int) -> tuple[int, Path] | None:
    """The newest verified checkpoint of the node's rank."""
    for d in ckpt.candidates(job.ckpt(node) / f"rank{node}"):
        try:
            return ckpt.verify(d).step, d
        except ckpt.CheckpointError:
            continue
    return None


def holdover_cuts(net: ClusterNet, tmp: Path, cuts: int, grace: float) -> list[tuple[float, int]]:
    """(seconds from the cut to both bridges' verified checkpoints, step saved or -1 if the ranks
    differ) a cut."""
    out = []
    with NodeBridges(tmp, grace=grace) as site:
        job = TorchrunJob(net, tmp, "--step-sleep", "0.02")
        try:
            regs = [tmp / "node0" / "reg" / "train.json", tmp / "node1" / "reg" / "train.rank1.json"]
            wait(
                "both ranks training", lambda: all(r.exists() for r in regs) and min(job.step(0), job.step(1)) >= 5, 120
            )
            for i in range(cuts):
                before = [len(site.verified(n)) for n in (0, 1)]
                t0 = time.monotonic()
                site.rig.control.send(mains=False)
                got = wait(
                    "both bridges verified",
                    lambda b=before: (
                        all(len(site.verified(n)) > b[n] for n in (0, 1)) and [site.verified(n)[-1] for n in (0, 1)]
                    ),
                    60,
                )
                took = time.monotonic() - t0
                steps = {ckpt.verify(Path(g["dir"])).step for g in got}
                out.append((took, min(steps) if len(steps) == 1 else -1))
                print(f"  cut {i + 1}: both bridges verified {took:.2f} s after the cut, step {sorted(steps)}")
                site.rig.control.send(mains=True)
                site.rig.wait("mains_restored", 5, t0)
                last = max(job.step(0), job.step(1))
                wait("training again", lambda n=last: min(job.step(0), job.step(1)) >= n + 5, 120)
        finally:
            job.kill()
    return out


def holdover_losses(net: ClusterNet, tmp: Path, losses: int, stall: float) -> list[tuple[float, int, int]]:
    """(seconds from the drop to both verified, step saved, last step completed) a loss."""
    job = TorchrunJob(net, tmp, "--step-sleep", "0.02", "--stall-save", str(stall))
    out = []
    try:
        wait("both ranks training", lambda: min(job.step(0), job.step(1)) >= 10, 120)
        for i in range(losses):
            before = [newest(job, n) for n in (0, 1)]
            net.partition()
            t0 = time.monotonic()
            got = wait(
                "both ranks saved",
                lambda b=before: (
                    all((x := newest(job, n)) and x != b[n] for n in (0, 1)) and [newest(job, n) for n in (0, 1)]
                ),
                stall + 60,
            )
            took = time.monotonic() - t0
            last = max(job.step(0), job.step(1))
            steps = {s for s, _d in got}
            out.append((took, min(steps) if len(steps) == 1 else -1, last))
            print(f"  loss {i + 1}: both verified {took:.2f} s after the drop, step {sorted(steps)}, last done {last}")
            net.partition(False)
            if i + 1 < losses:
                wait("training again", lambda n=last: min(job.step(0), job.step(1)) >= n + 5, 120)
    finally:
        job.kill()
        net.partition(False)
    return out


def torchrun_alone(net: ClusterNet, tmp: Path, every: int, pg_timeout: float) -> tuple[float, int, int]:
    """(seconds from the drop until both agents exited, newest step on disk, last step completed)."""
    args = ("--step-sleep", "0.02", "--stall-save", "0", "--save-every", str(every), "--pg-timeout", str(pg_timeout))
    job = TorchrunJob(net, tmp, *args)
    try:
        wait("both ranks training", lambda: min(job.step(0), job.step(1)) >= every + every // 2, 180)
        net.partition()
        t0 = time.monotonic()
        job.finish(timeout=pg_timeout * 3 + 120)
        took = time.monotonic() - t0
        on_disk = [newest(job, n) for n in (0, 1)]
        restart = min(x[0] for x in on_disk if x) if all(on_disk) else 0
        return took, restart, max(job.step(0), job.step(1))
    finally:
        job.kill()
        net.partition(False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cuts", type=int, default=10)
    ap.add_argument("--grace", type=float, default=0.5, help="the bridges' grace on battery before saving, s")
    ap.add_argument("--losses", type=int, default=10)
    ap.add_argument("--stall-save", type=float, default=3.0)
    ap.add_argument("--every", type=int, default=100, help="torchrun alone: a periodic save every N steps")
    ap.add_argument("--pg-timeout", type=float, default=60.0)
    args = parse(ap, cuts=1, losses=1, stall_save=1.0, every=10, pg_timeout=10.0)
    with tempfile.TemporaryDirectory() as tmp, ClusterNet(2) as net:
        print(f"holdover: {args.cuts} power cuts, sentinel debounce 0.3 s, bridges' grace {args.grace} s")
        cuts = holdover_cuts(net, Path(tmp) / "cuts", args.cuts, args.grace)
        print(f"holdover: {args.losses} link losses, watchdog after {args.stall_save} s without a step")
        ours = holdover_losses(net, Path(tmp) / "ours", args.losses, args.stall_save)
        print(f"torchrun alone: periodic save every {args.every} steps, process group timeout {args.pg_timeout} s")
        took, restart, last = torchrun_alone(net, Path(tmp) / "alone", args.every, args.pg_timeout)
    cs = [t for t, _s in cuts]
    print("\nresults")
    print(
        f"  holdover: power cut -> both nodes' bridges verified their rank's checkpoint: "
        f"p50 {percentile(cs, 50):.2f} s, "
        f"p95 {percentile(cs, 95):.2f} s (n={len(cs)}, of which 0.3 s is the sentinel's debounce and {args.grace} s "
        f"the bridges' grace); the same step on both ranks in {sum(s >= 0 for _t, s in cuts)} of {len(cuts)}"
    )
    xs = [t for t, _s, _l in ours]
    same = sum(s >= 0 for _t, s, _l in ours)
    lost = [last_done - s for _t, s, last_done in ours if s >= 0]
    print(
        f"  holdover: link loss -> both ranks' checkpoints verified: p50 {percentile(xs, 50):.2f} s, "
        f"p95 {percentile(xs, 95):.2f} s (n={len(xs)}, of which {args.stall_save} s is the watchdog's wait); "
        f"the same step on both ranks in {same} of {len(ours)}; steps lost: max {max(lost, default=0)}"
    )
    print(
        f"  torchrun alone: gave up {took:.1f} s after the loss (process group timeout {args.pg_timeout} s); "
        f"restartable from step {restart} of {last} done: {last - restart} steps lost"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
