"""A stand-in training run for the demo: no torch, a few MB of float32 weights in plain arrays,
protected by holdover.train exactly as a real run is (control socket, signal, registration,
hashed atomic checkpoints through `Guard(capture=...)`). The demo shows an emergency checkpoint
with it without installing a GB of PyTorch; the toy run (holdover.train.toy) is the real thing.

    python -m holdover.lab.trainee --ckpt DIR [--name demo-run] [--mb 16] [--step-sleep 0.05]

Prints one JSON line per step ({"step", "loss"}).
"""

from __future__ import annotations

import argparse
import array
import json
import random
import sys
import time
from typing import Any

from holdover.train import ckpt, protect

LAYERS = 4


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m holdover.lab.trainee", description=__doc__)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--name", default="demo-run")
    ap.add_argument("--mb", type=int, default=16)
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--step-sleep", type=float, default=0.05)
    ap.add_argument("--registry", default=None)
    args = ap.parse_args(argv)

    rng = random.Random(0)
    per_layer = args.mb * 1024 * 1024 // 4 // LAYERS
    weights = {f"layer{i}.weight": array.array("f", [rng.random() for _ in range(1024)]) * (per_layer // 1024)
               for i in range(LAYERS)}  # fmt: skip

    def capture(step: int, extra: dict[str, Any] | None) -> tuple[list[ckpt.Shard], dict[str, Any]]:
        shards = [
            ckpt.Shard(f"shard_{i:03d}.safetensors", [ckpt.Tensor.from_buffer(name, "F32", [len(w)], memoryview(w))])
            for i, (name, w) in enumerate(weights.items())
        ]
        return shards, {"step": step, "extra": extra or {}, "rng": repr(rng.getstate()[1][:4])}

    guard = protect(args.ckpt, args.name, capture=capture, registry_dir=args.registry)
    try:
        for step in range(1, args.steps + 1):
            w = weights[f"layer{step % LAYERS}.weight"]
            for _ in range(64):  # a "gradient step": a few weights move
                w[rng.randrange(len(w))] -= 0.01
            loss = 1.0 / (1 + step * 0.01)
            print(json.dumps({"step": step, "loss": round(loss, 5)}), flush=True)
            if guard.step_end(step, loss=loss):
                break
            time.sleep(args.step_sleep)
    finally:
        guard.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
