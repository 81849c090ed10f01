"""A toy PyTorch run protected by holdover (the demo and the tests use it; it is also the smallest example).

    python -m holdover.train.toy --ckpt DIR --steps 200 [--name toy] [--step-sleep 0.05]

Prints one JSON line per step ({"step", "loss"}). Dropout draws from the global RNG, so an exact
resume needs the RNG state too, not only the weights. ``--hang`` registers the run and then stops
calling step_end (a wedged data loader, a deadlock): the bridge must fall back to gcore. The string
given with ``--marker`` is kept in memory, so a test can find it in the core.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from holdover.train import AdaptiveInterval, protect


def build(width: int, depth: int) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Dropout(0.1)]
    layers.append(torch.nn.Linear(width, 1))
    return torch.nn.Sequential(*layers)


def batch(step: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    # The data position is the step: batch k is the same whenever it is drawn.
    g = torch.Generator().manual_seed(10_000 + step)
    x = torch.randn(32, width, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m holdover.train.toy", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--name", default=os.environ.get("HOLDOVER_RUN_NAME", "toy"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    ap.add_argument("--every", type=int, default=0, help="periodic checkpoint interval (0: adaptive off)")
    ap.add_argument("--shard-bytes", type=int, default=20_000)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--hang", action="store_true")
    ap.add_argument("--marker", default="")
    ap.add_argument("--registry", default=None)
    args = ap.parse_args(argv)

    model = build(args.width, args.depth)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=50, gamma=0.5)
    interval = (
        AdaptiveInterval(initial=args.every, min_steps=max(1, args.every // 4), max_steps=args.every * 8)
        if args.every
        else None
    )
    guard = protect(
        args.ckpt,
        args.name,
        model=model,
        optimizer=opt,
        scheduler=sched,
        interval=interval,
        shard_bytes=args.shard_bytes,
        warmup_steps=args.warmup,
        registry_dir=args.registry,
    )
    marker = bytearray(args.marker.encode())  # kept referenced: the core must contain it
    if args.hang:
        print(json.dumps({"hang": True, "pid": guard.reg.pid}), flush=True)
        while True:
            time.sleep(0.2)
            _ = marker
    start = guard.resume()
    print(json.dumps({"resumed": start}), flush=True)
    loss_fn = torch.nn.MSELoss()
    for step in range(start + 1, args.steps + 1):
        x, y = batch(step, args.width)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        opt.step()
        sched.step()
        print(json.dumps({"step": step, "loss": loss.item()}), flush=True)
        if guard.step_end(step, loss=loss.item(), extra={"data_pos": step}, grad_norm=float(norm)):
            print(json.dumps({"stopped_after_save": step}), flush=True)
            break
        if args.step_sleep:
            time.sleep(args.step_sleep)
    for w in guard.warnings:
        print(json.dumps({"warning": w}), flush=True)
    guard.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
