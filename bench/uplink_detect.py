#!/usr/bin/env python3
"""Uplink loss detection: how fast, and how many false alarms, against mwan3's defaults.

Live, on the emulated sentinel (real MicroPython, real Mosquitto, the bridge), with three
DNS targets on loopback:
- N hard losses of every target (the responders go silent at a random phase of the probe
  round); each latency is from the moment they go silent to `uplink_lost` at the bridge;
- a soak of 20 % random probe loss on every target, on a second rig at the same time,
  counting `uplink_lost` events (false alarms).

Then both parameter sets through the firmware's own decision code (`UplinkWatch.judge` from
firmware/uplink.py, imported, not copied) on a virtual clock: ours (the shipped defaults)
and mwan3's (interval 5 s, timeout 4 s, down 5, up 5, reliability 1). The simulation of ours
is checked against the live figures, so the mwan3 row is what the same code would do live.

Goal: live p95 <= 3 s, 0 false alarms in 5 min of 20 % loss.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "host"))

from common import parse

from holdover.board.config_check import board_config  # the board's own rules, its siblings aliased
from holdover.firmware import netio

# The firmware imports its siblings by bare name, as MicroPython's flat path has them.
sys.modules.setdefault("netio", netio)
from holdover.firmware import uplink  # noqa: E402  (the decision code the board runs)
from holdover.lab.rig import Rig  # noqa: E402
from holdover.lab.stats import percentile  # noqa: E402
from holdover.lab.targets import UdpServer, dns_answer  # noqa: E402

MWAN3 = {"interval_ms": 5000, "timeout_ms": 4000, "down": 5, "up": 5, "reliability": 1}


def defaults() -> dict[str, Any]:
    raw = {
        "sentinel_id": "b",
        "key": "5e0b8d2f7a4c9e1b3f6a8d0c2e5b7f9a",
        "wlan": {"ssid": "x"},
        "mqtt": {"host": "10.0.0.1"},
        "mains": {"pin": 27},
    }
    errs, cfg = board_config.problems(raw)
    assert not errs, errs
    return cfg["uplink"]


def targets_cfg(servers: list[UdpServer]) -> list[dict[str, Any]]:
    return [{"kind": "dns", "host": "127.0.0.1", "port": u.port, "name": f"r{i}"} for i, u in enumerate(servers)]


# --- live --------------------------------------------------------------------------------------


def live_losses(n: int, heap: str) -> list[float]:
    servers = [UdpServer(dns_answer) for _ in range(3)]
    with tempfile.TemporaryDirectory(prefix="holdover-bench-") as tmp:
        rig = Rig(Path(tmp), heap=heap, firmware={"uplink": {"targets": targets_cfg(servers)}})
        rig.start()
        try:
            rig.wait("boot", 20)
            state = lambda: rig.board_state()["uplink"]  # noqa: E731
            out = []
            rng = random.Random(3)
            for i in range(n):
                deadline = time.monotonic() + 15
                while state() != "up" and time.monotonic() < deadline:
                    time.sleep(0.05)
                time.sleep(rng.uniform(0.5, 1.5))  # a random phase of the probe round
                t0 = time.monotonic()
                for u in servers:
                    u.alive = False
                lost = rig.wait("uplink_lost", 15, since=t0)
                out.append(lost.at - t0)
                print(f"  loss {i + 1:2d}/{n}: uplink_lost at the bridge after {out[-1]:.2f} s", flush=True)
                t1 = time.monotonic()
                for u in servers:
                    u.alive = True
                rig.wait("uplink_restored", 15, since=t1)
            return out
        finally:
            rig.close()
            for u in servers:
                u.close()


def live_soak(seconds: float, loss: float, heap: str, result: dict[str, Any]) -> None:
    servers = [UdpServer(dns_answer, drop=loss, seed=i) for i in range(3)]
    with tempfile.TemporaryDirectory(prefix="holdover-bench-") as tmp:
        rig = Rig(Path(tmp), sid="soak", heap=heap, firmware={"uplink": {"targets": targets_cfg(servers)}})
        rig.start()
        try:
            rig.wait("boot", 20)
            time.sleep(3)  # up first: the soak counts alarms from an uplink that is up
            t0 = time.monotonic()
            before = rig.count("uplink_lost")
            time.sleep(seconds)
            result["alarms"] = rig.count("uplink_lost") - before
            result["asked"] = sum(u.requests for u in servers)
            result["dropped"] = sum(u.dropped for u in servers)
            result["seconds"] = time.monotonic() - t0
        finally:
            rig.close()
            for u in servers:
                u.close()


# --- the same decision code on a virtual clock -------------------------------------------------


class VirtualBoard:
    def __init__(self) -> None:
        self.now = 0

    def ticks_ms(self) -> int:
        return self.now

    def ticks_diff(self, a: int, b: int) -> int:
        return a - b


def _watch(params: dict[str, Any], board: VirtualBoard, events: list) -> uplink.UplinkWatch:
    cfg = {**defaults(), **params, "targets": [{"kind": "dns", "host": "127.0.0.1", "port": 53}] * 3}
    return uplink.UplinkWatch(board, cfg, lambda up, ms: events.append((board.now, up)))


def _round(w: uplink.UplinkWatch, board: VirtualBoard, answered: list[bool], rtt: int = 2) -> None:
    # A round lasts until its slowest probe: the timeout if any was lost.
    board.now += rtt if all(answered) else w.cfg["timeout_ms"]
    w.judge([rtt if ok else None for ok in answered], board.now)


def sim_losses(params: dict[str, Any], n: int, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        board, events = VirtualBoard(), []
        w = _watch(params, board, events)
        while w.up is not True:
            t0 = board.now
            _round(w, board, [True] * 3)
            board.now = t0 + w.cfg["interval_ms"]
        # The loss lands at a random moment of a round.
        cut = board.now + rng.uniform(0, w.cfg["interval_ms"])
        while not (events and events[-1][1] is False):
            start = board.now
            _round(w, board, [start < cut] * 3)
            board.now = max(board.now, start + w.cfg["interval_ms"])
        out.append((events[-1][0] - cut) / 1000)
    return out


def sim_alarms(params: dict[str, Any], loss: float, seconds: float, seed: int = 2) -> int:
    rng = random.Random(seed)
    board, events = VirtualBoard(), []
    w = _watch(params, board, events)
    while board.now < seconds * 1000:
        start = board.now
        _round(w, board, [rng.random() >= loss for _ in range(3)])
        board.now = max(board.now, start + w.cfg["interval_ms"])
    return sum(1 for _t, up in events if up is False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--losses", type=int, default=30)
    ap.add_argument("--soak-s", type=float, default=300.0)
    ap.add_argument("--loss", type=float, default=0.2)
    ap.add_argument("--heap", default="168K")
    args = parse(ap, losses=2, soak_s=3.0)

    ours = {k: defaults()[k] for k in MWAN3}
    print(f"ours (shipped defaults): {ours}")
    print(f"mwan3 defaults:          {MWAN3}")
    print(f"live: {args.losses} hard losses, and {args.soak_s:.0f} s of {args.loss:.0%} loss on a second rig at once")
    soak: dict[str, Any] = {}
    t = threading.Thread(target=live_soak, args=(args.soak_s, args.loss, args.heap, soak))
    t.start()
    lat = live_losses(args.losses, args.heap)
    t.join()

    n_sim = 2000
    sim_ours, sim_mwan = sim_losses(ours, n_sim), sim_losses(MWAN3, n_sim)
    day = 86400.0
    rows = [
        ("ours, live", lat, soak["alarms"], soak["seconds"]),
        ("ours, same code simulated", sim_ours, sim_alarms(ours, args.loss, day), day),
        ("mwan3 defaults, same code simulated", sim_mwan, sim_alarms(MWAN3, args.loss, day), day),
    ]
    print()
    print(f"{'':38} {'p50 s':>7} {'p95 s':>7} {'max s':>7}   false alarms at {args.loss:.0%} loss")
    for name, xs, alarms, secs in rows:
        per = f"{alarms} in {secs / 60:.0f} min" if secs < 3600 else f"{alarms} in {secs / 3600:.0f} h"
        print(
            f"{name:38} {statistics.median(xs):7.2f} {percentile(xs, 95):7.2f} {max(xs):7.2f}   {per}",
        )
    print(f"live soak: {soak['dropped']} of {soak['asked']} probes dropped ({soak['dropped'] / soak['asked']:.1%})")
    ratio = statistics.median(sim_mwan) / statistics.median(lat)
    print(f"mwan3's defaults take {ratio:.1f}x ours (p50) to act on a hard loss")
    p95 = percentile(lat, 95)
    ok = p95 <= 3.0 and soak["alarms"] == 0
    print(f"goal p95 <= 3 s and 0 false alarms: {'met' if ok else 'NOT met'} (p95 {p95:.2f} s)")
    return 0 if ok or args.smoke else 1  # a smoke run checks the code path, not a verdict


if __name__ == "__main__":
    sys.exit(main())
