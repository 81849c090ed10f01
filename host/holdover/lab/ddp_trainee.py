"""A data-parallel torch job (gloo, CPU) protected by a Guard, one rank a process: for the cluster
tests, where Slurm starts one rank per node. The ranks agree on the step they save at (the
Guard's all_reduce), which is what makes a multi-node checkpoint one checkpoint.

    srun python -m holdover.lab.ddp_trainee --ckpt DIR --registry DIR [--name train] [--step-sleep 0.05]

Rank and world from Slurm (SLURM_PROCID, SLURM_NTASKS) or torchrun (RANK, WORLD_SIZE); the
rendezvous at MASTER_ADDR:MASTER_PORT (under torchrun, its agent's store). Resumes from the
newest checkpoint every rank has (a requeued job starts again this way) and says so:
{"rank", "resumed": STEP, "digest"}; then one JSON line per step ({"rank", "step", "loss",
"digest"}), the digest a hash of the model's and optimizer's state, so a resumed run can be
compared bit for bit with the run it continues.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from datetime import timedelta


def main(argv: list[str] | None = None) -> int:
    import torch
    import torch.distributed as dist

    from holdover.train import protect

    ap = argparse.ArgumentParser(prog="python -m holdover.lab.ddp_trainee", description=__doc__)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--registry", default=None)
    ap.add_argument("--name", default="train")
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--step-sleep", type=float, default=0.05)
    ap.add_argument(
        "--save-at",
        default="",
        help="steps to ask a save at, as a bridge would: 3,6 on every rank; 3@0 on rank 0 only; 3:exit to stop after",
    )
    ap.add_argument("--join-window", type=float, default=2.0, help="the Guard's join_window_s")
    ap.add_argument("--stall-save", type=float, default=None, help="the Guard's stall_save_s (0: off)")
    ap.add_argument("--save-every", type=int, default=0, help="a periodic save every N steps")
    ap.add_argument(
        "--late-ask",
        action="store_true",
        help="when a request stops the run, ask this rank to save and exit once more before close() "
        "(its node's bridge heard the cut after the ranks had saved for another's)",
    )
    ap.add_argument("--pg-timeout", type=float, default=60.0, help="the process group's collective timeout, s")
    ap.add_argument("--width", type=int, default=64, help="the model's width (its state: 12 x width^2 bytes)")
    args = ap.parse_args(argv)
    if "OMP_NUM_THREADS" not in os.environ:
        # The lab's nodes are one machine's cores, and the model is 64 wide: torch's default of an
        # OpenMP thread a core left the spare one spinning after every op (1.8 CPU-s in 10 s of
        # training against 0.5 s), on cores the other node's rank needs. torchrun sets the same
        # itself when it starts more than one process a node.
        torch.set_num_threads(1)
    rank = int(os.environ.get("SLURM_PROCID", os.environ.get("RANK", "0")))
    save_at = _asks(args.save_at, rank)
    world = int(os.environ.get("SLURM_NTASKS", os.environ.get("WORLD_SIZE", "1")))
    if "TORCHELASTIC_RUN_ID" in os.environ:
        init = "env://"  # torchrun's agent on the master node already serves the store on that port
    else:
        init = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    dist.init_process_group(
        "gloo", init_method=init, rank=rank, world_size=world, timeout=timedelta(seconds=args.pg_timeout)
    )
    torch.manual_seed(0)
    model = torch.nn.Linear(args.width, args.width)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(rank)
    guard = protect(
        args.ckpt,
        args.name,
        model=model,
        optimizer=opt,
        registry_dir=args.registry,
        stall_save_s=args.stall_save,
        interval=args.save_every or None,
        join_window_s=args.join_window,
    )
    first = guard.resume() + 1
    print(json.dumps({"rank": rank, "resumed": first - 1, "digest": _digest(model, opt)}), flush=True)
    try:
        for step in range(first, args.steps + 1):
            loss = model(torch.randn(16, args.width, generator=data)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():
                assert p.grad is not None
                dist.all_reduce(p.grad)
                p.grad /= world
            opt.step()
            line = {"rank": rank, "step": step, "loss": round(loss.item(), 5), "digest": _digest(model, opt)}
            print(json.dumps(line), flush=True)
            if step in save_at:
                guard.request("manual", after=save_at[step])
            if guard.step_end(step, loss=loss.item()):
                if args.late_ask:
                    guard.request("manual", after="exit")
                break
            time.sleep(args.step_sleep)
    finally:
        guard.close()
        asked = [{k: r.get(k) for k in ("state", "step", "after", "joined")} for r in guard.requests().values()]
        print(json.dumps({"rank": rank, "requests": asked}), flush=True)
        # Seen once in a suite run: a rank that tore its process group down while the other was
        # still in its last collective died of SIGABRT in gloo; leave together.
        with contextlib.suppress(RuntimeError):
            dist.barrier()
        dist.destroy_process_group()
    return 0


def resumed(text: str) -> dict[int, int]:
    """From a job's output (every rank's lines): each rank's step resumed from, as its last start
    said. A rank killed by a requeue may leave its last line unended, with srun's own words
    ("srun: error: n1: task 0: Terminated") after it: the object alone is read."""
    got: dict[int, int] = {}
    for line in text.splitlines():
        if line.startswith('{"rank"'):
            with contextlib.suppress(ValueError):
                x = json.JSONDecoder().raw_decode(line)[0]
                if "resumed" in x:
                    got[x["rank"]] = x["resumed"]
    return got


def _asks(spec: str, rank: int) -> dict[int, str]:
    """--save-at for this rank: {step: what the run does after the save}."""
    out = {}
    for item in filter(None, spec.split(",")):
        at, _, after = item.partition(":")
        step, _, only = at.partition("@")
        if not only or int(only) == rank:
            out[int(step)] = after or "continue"
    return out


def _digest(model, opt) -> str:
    """The model's and optimizer's state, hashed: equal digests, bit-identical state."""
    import hashlib

    import torch

    h = hashlib.sha256()
    tensors = list(model.state_dict().values())
    for st in opt.state_dict()["state"].values():
        tensors += [v for v in st.values() if isinstance(v, torch.Tensor)]
    for t in tensors:
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


if __name__ == "__main__":
    sys.exit(main())
