#!/usr/bin/env python3
"""Power-cut alert latency through the whole chain.

N power cuts on the emulated sentinel (real MicroPython, an ESP32's heap, pulse-train mains
input), real Mosquitto, the bridge. Each latency is from the control command that cuts
mains to the hook process's first instruction (bash's $EPOCHREALTIME, written by the hook
itself), both on this machine's wall clock. Cuts land at a random phase of the 50 Hz
pulse train and the sampling loop.

Goal: p99 <= debounce + 50 ms. For scale, NUT's upsmon polls the UPS every 5 s by default
(POLLFREQ), so a poll-based monitor adds 0-5 s before it even knows.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "host"))

from holdover.board.emulator import DEFAULT_HEAP
from holdover.lab.rig import Rig
from holdover.lab.stats import percentile


def wait_lines(path: Path, n: int, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            lines = path.read_text().splitlines()
            if len(lines) >= n:
                return lines
        time.sleep(0.002)
    raise TimeoutError(f"hook did not run ({n} expected)")


def run_case(args: argparse.Namespace, ghost_hz: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="holdover-bench-") as tmp:
        stamps = Path(tmp) / "stamps.txt"
        hook = f"exec bash -c 'echo $EPOCHREALTIME $HOLDOVER_EVENT >> {stamps}'"
        rig = Rig(
            Path(tmp) / "rig",
            debounce_ms=args.debounce_ms,
            mode=args.mode,
            heap=args.heap,
            hooks=[{"events": ["mains_lost", "mains_restored"], "run": hook, "timeout": 10.0}],
        )
        rig.start()
        try:
            rig.wait("boot", timeout=20)
            if ghost_hz:
                rig.control.send(ghost_hz=ghost_hz)
            latencies: list[float] = []
            rng = random.Random(7)
            for i in range(args.cuts):
                time.sleep(rng.uniform(0.05, 0.15))  # random phase against pulses and sampling
                t = time.time()
                rig.control.send(mains=False)
                line = wait_lines(stamps, 2 * i + 1, 10)[2 * i]
                stamp, kind = line.split()
                assert kind == "mains_lost", line
                latencies.append((float(stamp) - t) * 1000)
                rig.control.send(mains=True)
                wait_lines(stamps, 2 * i + 2, 10)
            mem = rig.control.send(get="mem")["mem"]
            state = rig.control.send(get="state")["state"]
        finally:
            rig.close()
    return {"latencies": latencies, "mem": mem, "state": state}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cuts", type=int, default=50)
    ap.add_argument("--debounce-ms", type=int, default=300)
    ap.add_argument("--mode", choices=["pulse", "level"], default="pulse")
    ap.add_argument("--heap", default=DEFAULT_HEAP, help="the 64-bit port's equivalent of an ESP32's heap")
    ap.add_argument(
        "--ghost-hz",
        default="0,5",
        help="comma-separated ghost edge rates to run, one case each (5 Hz: GPIO36/39 with WiFi on)",
    )
    args = ap.parse_args()
    goal = args.debounce_ms + 50
    ok = True
    for ghost_hz in (float(x) for x in args.ghost_hz.split(",")):
        r = run_case(args, ghost_hz)
        latencies, mem, state = r["latencies"], r["mem"], r["state"]
        p50, p95, p99 = (percentile(latencies, p) for p in (50, 95, 99))
        total = mem["free"] + mem["alloc"]
        ok &= p99 <= goal
        print(f"alert latency, {args.cuts} power cuts, mains input '{args.mode}', ghost edges {ghost_hz:g} Hz")
        print(f"  debounce (configured)   {args.debounce_ms} ms")
        print(f"  p50                     {p50:.1f} ms")
        print(f"  p95                     {p95:.1f} ms")
        print(f"  p99                     {p99:.1f} ms   (goal <= {goal} ms: {'met' if p99 <= goal else 'MISSED'})")
        print(f"  min / max               {min(latencies):.1f} / {max(latencies):.1f} ms")
        print(f"  over the debounce, p99  {p99 - args.debounce_ms:.1f} ms")
        print(f"  mean                    {statistics.fmean(latencies):.1f} ms")
        # The unix port is a 64-bit build (8-byte words, 32-byte GC blocks against 4 and 16 on the
        # ESP32): these heap figures show trends between runs here, they do not predict the chip.
        print(f"  GC heap high-water      {mem['hwm']} of {total} bytes (64-bit unix port: not the chip's figure)")
        print(f"  sub-debounce glitches   {state['glitches']}")
        # Times this machine held the interpreter up past the 25 ms gap; the watch then reports a
        # cut late rather than count the stall as evidence of one. Zero on a quiet machine.
        print(f"  loop stalls (host)      {state['loop_stalls']}, {state['loop_stalled_ms']} ms in all")
    print("  for scale: NUT upsmon POLLFREQ default 5000 ms (mean 2500 ms added before detection)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
