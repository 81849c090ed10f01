"""A cut under several runs whose states together take longer to write than the UPS lasts: today's
all-at-once rescue against the plan (node/plan.py) and an oracle, in one run, on this machine's disk.

Stand-in runs (holdover.lab.trainee: real Guards, real files, real fsyncs, states of different
sizes) each save once on their own first (the periodic save whose measured time the plan reads).
Each saves again on its own, timed from the request to the checkpoint verified, as the bridge
times it: what an oracle knows in advance. Then, in rounds that take the modes in turn, every run
is saved once more and left to train `--age` seconds (so each cut finds them about equally old:
compute kept is then close to runs saved), and a cut is driven through the
bridge's own Rescuer (a `mains_lost` accepted into a real journal) with the UPS's runtime set so
that the states, all saved at once (the fastest this disk writes them all), take `--over` times the
time to save in; the plan is given the disk's ceiling as that run measured it:

  all at once  [protect] plan = false: every run asked at once, sharing the disk (before the plan)
  plan         the measured saves admitted under the disk's ceiling, most compute kept per second
               first; none started that cannot end before the deadline
  oracle       the plan, given each run's true time from request to verified
  plan + shed  the plan with [protect] shed: each run stopped (SIGSTOP) once verified, on a UPS whose
               runtime follows its load (below), read again before each turn; what the plan left
               out is tried last, if the stretched UPS says it can finish

The UPS of "plan + shed" is a load model, integrated every 20 ms: its energy is the budget times its
load at the cut (--base-w for the box, --rank-w for each run while it trains), spent at the load of
the moment, a run's watts gone while its process is stopped (as the kernel says: state T); its
runtime is the energy left over the load. Its lifetime is compared with what the plan predicted
before the cut (Plan.shed_runtime_s from the same figures): the gain shedding bought as the rescue
achieved it against the model's forecast.

Reported per mode (medians over the rounds): runs verified before the deadline, compute kept (the
runs' age at the cut times their ranks, of those verified in time), torn saves (asked and not
verified by the deadline: a power loss then leaves them half written). The same with a runtime
that fits everything (`--over` below 1): there the plan must save what all-at-once saves.

Those cuts are driven from a journaled event, as tests/node/test_rescue.py drives them, and the
UPS's runtime is handed to the Rescuer to the millisecond. `--chain` cuts through the whole chain
instead: the emulated sentinel (the firmware on MicroPython) has its mains pin cut, and the same
load model is the UPS that NUT serves: dummy-ups reads the file the model writes (battery.runtime in
whole seconds, as UPSes report it, and ups.load in percent of --ups-w), upsd serves it, and a bridge
as `holdover bridge` runs it (MQTT from the sentinel through Mosquitto, [ups] nut read every 0.2 s,
this mode's [protect]) hears both and rescues. Its states are larger (a runtime of a few seconds,
which whole seconds can say), one cut a mode, and a run counts as kept when verified before the
model's UPS ran out. It also says how long after the cut the rescue opened and on whose word, and
how far its deadline was from the UPS's real end (what [protect] margin must cover). No watts are
measured anywhere: a run's draw is the figure given.

    .venv/bin/python bench/rescue_plan.py [--mb 600,400,250,150] [--rounds 3] [--over 1.7] [--age 8]
        [--base-w 200] [--rank-w 300] [--smoke]
    .venv/bin/python bench/rescue_plan.py --chain [--mb 3000,2000,1400,800] [--rounds 2] [--ups-w 2000] [--margin 1]
        [--chain-modes "all at once,plan,oracle,plan + shed"]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import parse, wait

from holdover import events
from holdover.firmware import protocol
from holdover.journal import Journal
from holdover.node import plan
from holdover.node.rescue import Rescuer
from holdover.node.rescue_ledger import RescueLedger
from holdover.node.ups import Runtime
from holdover.settings import ProtectSettings
from holdover.train import ckpt, registry

MARGIN_S = 0.0  # the deadline is the budget itself: the bench sets the runtime to it
MODES = ("all at once", "plan", "oracle", "plan + shed")
IN_PROCESS_MB = "600,400,250,150"
# Through NUT the runtime is whole seconds: states large enough for a runtime of about 8 s on this
# disk (about 550 MB/s together; 13 GB of memory while they save).
CHAIN_MB = "3000,2000,1400,800"


def start_runs(where: Path, sizes: list[int]) -> list[tuple[str, subprocess.Popen[str]]]:
    runs = []
    env = dict(os.environ, HOLDOVER_REGISTRY=str(where / "reg"))
    for i, mb in enumerate(sizes):
        name = f"run{i}-{mb}mb"
        argv = [sys.executable, "-m", "holdover.lab.trainee", "--ckpt", str(where / name), "--name", name]
        argv += ["--mb", str(mb), "--step-sleep", "0.02"]
        p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        runs.append((name, p))
    for name, _p in runs:
        wait(f"{name} registered", lambda n=name: registry.registration_path(where / "reg", n).exists(), 120)
    return runs


def reg_of(where: Path, name: str) -> registry.Registration:
    return registry.Registration.from_json(registry.registration_path(where / "reg", name).read_text())


async def save_alone(where: Path, name: str) -> float:
    """One save of one run, request to verified, as the bridge asks and checks it."""
    reg = reg_of(where, name)
    t0 = time.monotonic()
    async with await registry.SaveChannel.open(reg.socket) as chan:
        await chan.send("save", id=os.urandom(6).hex(), reason="periodic", deadline=time.time() + 600)
        while True:
            msg = await chan.next(timeout=600)
            if msg and msg.get("state") in ("done", "failed"):
                break
    assert msg["state"] == "done", msg
    await asyncio.to_thread(ckpt.verify, Path(msg["dir"]))
    return time.monotonic() - t0


async def save_all(where: Path, names: list[str]) -> float:
    """Every run saved at once, request to the last verified: the fastest the disk writes them all."""
    t0 = time.monotonic()
    await asyncio.gather(*(save_alone(where, n) for n in names))
    return time.monotonic() - t0


Publish = Callable[[str, float, float], None]  # status, runtime left (s), load (W): what a UPS reports


class LoadUps:
    """A UPS whose runtime follows its load: energy left over the load of the moment. On battery
    from the moment it is made; `publish`, when given, hears each change as a UPS would report it."""

    def __init__(
        self, runtime_s: float, base_w: float, rank_w: float, pids: list[int], publish: Publish | None = None
    ) -> None:
        self.base_w, self.rank_w, self.pids = base_w, rank_w, pids
        self.load0 = self.load()
        self.energy = runtime_s * self.load0  # J
        self.died_at: float | None = None
        self.publish = publish or (lambda _status, _left, _load: None)
        self.publish("OB DISCHRG", runtime_s, self.load0)
        self._stop = threading.Event()
        self._last = time.time()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def load(self) -> float:
        return self.base_w + self.rank_w * sum(1 for p in self.pids if not _stopped(p))

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            now = time.time()
            load = self.load()
            self.energy -= load * (now - self._last)
            self._last = now
            if self.energy <= 0 and self.died_at is None:
                self.died_at = now + self.energy / load  # the moment it ran out within the tick
            self.publish("OB DISCHRG LB" if self.energy <= 0 else "OB DISCHRG", max(self.energy, 0.0) / load, load)

    def runtime(self, _default: float) -> Runtime:
        left = max(self.energy, 0.0) / self.load()
        return Runtime(left, f"a UPS of {left:.1f} s at {self.load():.0f} W (the bench's load model)", False, True)

    def lifetime(self, since: float) -> float:
        """From `since` to when it ran out (or will, at the load it has now)."""
        self._stop.set()
        self._thread.join()
        end = self.died_at if self.died_at is not None else self._last + self.energy / self.load()
        return end - since


def _stopped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def settle(where: Path, names: list[str]) -> None:
    """Every run idle again (a save abandoned at the deadline still finishes writing), and only its
    newest checkpoint kept: emergency saves are pinned, and dozens of them filled the disk."""

    def idle() -> bool:
        for n in names:
            reg = reg_of(where, n)
            with contextlib.suppress(OSError, ConnectionError):
                st = asyncio.run(_status(reg.socket))
                if any(r.get("state") not in registry.STATES_FINAL for r in st.get("requests", {}).values()):
                    return False
        return True

    wait("every run idle", idle, 120)
    for n in names:
        for old in ckpt.candidates(where / n)[1:]:
            shutil.rmtree(old, ignore_errors=True)


async def _status(sock: str) -> dict[str, Any]:
    async with await registry.SaveChannel.open(sock) as chan:
        await chan.send("status")
        return await chan.next(timeout=10) or {}


Load = tuple[float, float, list[int]]  # the box's watts, a run's, the runs' pids


def protect(where: Path, mode: str, ceiling: float, rank_w: float, margin: float) -> dict[str, Any]:
    """[protect] for a mode, as a user would write it."""
    return {
        "registry": str(where / "reg"),
        "rescue_dir": str(where / "rescue"),
        "grace": 0,
        "margin": margin,
        "hang_after": 600,
        "gcore": False,
        "plan": mode != "all at once",
        "disk_mb_s": ceiling / 1e6,  # as measured below, as a user would set it from fio
        "shed": mode == "plan + shed",
        "rank_watts": rank_w,
    }


def aged(where: Path, names: list[str], age: float) -> None:
    """Before a cut: every run idle, saved once alone (the measured save the plan reads, fresh), then
    trained `age` seconds, so each cut finds them about equally old."""
    settle(where, names)
    for n in names:
        asyncio.run(save_alone(where, n))
    time.sleep(age)


def prepare(
    where: Path, mode: str, budget: float, oracle: dict[str, float], ceiling: float, load: Load, margin: float
) -> tuple[float | None, dict[str, float]]:
    """Before a cut: the oracle's registrations, the model's forecast with shedding, each run's age."""
    if mode == "oracle":
        for name, took in oracle.items():  # every save's true time known in advance: the plan reads these
            reg = reg_of(where, name)
            assert reg.last_save is not None
            reg.last_save.seconds = took - reg.last_save.nbytes / (plan.VERIFY_MB_S * 1e6)
            registry.write_registration(where / "reg", reg)
    forecast = None
    if mode == "plan + shed":
        regs = [reg_of(where, n) for n in oracle]
        p = plan.plan(plan.costs(regs), budget, "the model", False, margin, 0.0, ceiling)
        p.load_w, p.rank_w, p.shed = load[0] + load[1] * len(load[2]), load[1], True
        forecast = p.shed_runtime_s
    ages = {n: time.time() - reg_of(where, n).last_save.at for n in oracle}  # type: ignore[union-attr]
    return forecast, ages


def outcome(steps: list[dict[str, Any]], ages: dict[str, float], until: float) -> dict[str, Any]:
    """What a cut kept: the runs verified by `until` (the deadline, or the UPS's end)."""
    verified = {x["target"].split(":")[0] for x in steps if x["action"] == "verified" and x["ts"] <= until}
    asked = {x["target"].split(":")[0] for x in steps if x["action"] == "requested"}
    return {
        "verified": len(verified),
        "kept_s": sum(ages[n] for n in verified),  # one rank each: compute = age
        "torn": len(asked - verified),
        "which": sorted(verified),
    }


def cut(where: Path, mode: str, budget: float, oracle: dict[str, float], ceiling: float, load: Load) -> dict[str, Any]:
    """One cut through the bridge's Rescuer; what it kept by the deadline (the UPS's end with shedding)."""
    forecast, ages = prepare(where, mode, budget, oracle, ceiling, load, MARGIN_S)
    s = ProtectSettings.model_validate(protect(where, mode, ceiling, load[1], MARGIN_S))
    runtime = Runtime(budget, f"a UPS of {budget:.1f} s (the bench's)", False, True)
    db = where / f"journal-{time.monotonic_ns()}.db"
    with Journal(db) as j:
        body = {"sid": "s1", "boot": "b00t", "seq": 1, "kind": protocol.MAINS_LOST, "ms": 0, "ts": None, "data": {}}
        event = j.accept("mqtt", body)
        assert event is not None

        ups = LoadUps(budget, *load) if mode == "plan + shed" else None
        cut_at = time.time()

        async def go() -> None:
            r = Rescuer(s, j, runtime=ups.runtime if ups else lambda _default: runtime)
            r.on_event(event)
            await asyncio.wait_for(r.wait_idle(), budget * 4 + 120)
            if ups:
                lived = ups.lifetime(cut_at)
                back = dict(body, seq=2, kind=protocol.MAINS_RESTORED)
                restored = j.accept("mqtt", back)
                assert restored is not None
                r.on_event(restored)  # the runs stopped go on: the next round finds them training
                out["lived"], out["forecast"] = lived, forecast

        out: dict[str, Any] = {}
        asyncio.run(go())
        [rescue] = RescueLedger(j).rescues()
        steps = RescueLedger(j).steps()
    deadline = rescue["deadline"] if ups is None else cut_at + out["lived"]
    db.unlink()
    return {**outcome(steps, ages, deadline), **out}


def nut_publisher(server: Any, name: str, watts: float) -> Publish:
    """What the model says, written as NUT's dummy-ups serves a UPS: whole seconds (as UPSes report
    battery.runtime), the load in percent of the rated watts; a file written only when it changes."""
    last: dict[str, str] = {}

    def publish(status: str, left: float, load_w: float) -> None:
        found = {"ups.status": status, "battery.runtime": str(int(left)), "ups.load": str(round(100 * load_w / watts))}
        if found != last:
            last.update(found)
            server.set(name, **found)

    return publish


def chain_cut(
    rig: Any,
    server: Any,
    where: Path,
    mode: str,
    budget: float,
    oracle: dict[str, float],
    ceiling: float,
    args: Any,
    pids: list[int],
) -> dict[str, Any]:
    """One cut on the emulated sentinel's mains pin, with the model's UPS served by NUT: a bridge as
    `holdover bridge` runs it, with this mode's [protect], hears both and rescues."""
    from holdover import settings as settings_mod

    load: Load = (args.base_w, args.rank_w, pids)
    forecast, ages = prepare(where, mode, budget, oracle, ceiling, load, args.margin)
    rig.protect = protect(where, mode, ceiling, args.rank_w, args.margin)
    if rig.bridge is not None:
        rig.bridge.stop()
    _fw, cfg = rig.write_configs()
    rig.start_bridge(settings_mod.load(cfg))
    bridge = rig.bridge.bridge
    wait(
        "the bridge connected and reading the UPS",
        lambda: bridge.link and bridge.link.connected.is_set() and bridge.ups.latest,
        30,
    )
    time.sleep(0.5)  # its subscriptions answered: the sentinel's retained state heard
    journal = rig.dir / "journal.db"

    def online() -> bool:
        with Journal(journal, readonly=True) as j:
            return j.status(rig.sid) == protocol.ONLINE

    wait("the sentinel online", online, 60)
    with Journal(journal, readonly=True) as j:
        before = len(RescueLedger(j).rescues())
    ups = LoadUps(budget, *load, publish=nut_publisher(server, "hostups", args.ups_w))
    cut_at = time.time()
    rig.control.send(mains=False)

    def finished() -> dict[str, Any] | None:
        with Journal(journal, readonly=True) as j:
            done = RescueLedger(j).rescues()[before:]
            return done[0] if done and done[0]["state"] == "finished" else None

    rescue = wait("the rescue finished", finished, budget * 4 + 120)
    lived = ups.lifetime(cut_at)
    rig.control.send(mains=True)
    server.set("hostups", **{"ups.status": "OL", "battery.runtime": str(int(budget)), "ups.load": "0"})
    wait("every run training again", lambda: not any(_stopped(p) for p in load[2]), 60)
    with Journal(journal, readonly=True) as j:
        steps = RescueLedger(j).steps(rescue["id"])
        heard = {
            e.kind: e.rx_ts - cut_at for e in j.events(kinds=(protocol.MAINS_LOST, events.UPS_ON_BATTERY), since=cut_at)
        }
    got = outcome(steps, ages, cut_at + lived)
    return {
        **got,
        "lived": lived,
        "forecast": forecast,
        "opened_s": rescue["started"] - cut_at,  # the cut heard: the sentinel's debounce, or NUT's poll
        "by": rescue["reason"],
        "sentinel_s": heard.get(protocol.MAINS_LOST),
        "nut_s": heard.get(events.UPS_ON_BATTERY),
        "over_s": rescue["deadline"] - (cut_at + lived),  # the deadline past the UPS's end: what margin is for
    }


def _s(x: float | None) -> str:
    return "not by the rescue's end" if x is None else f"{x:.2f} s"


def chain(
    args: Any, where: Path, runs: list[tuple[str, Any]], oracle: dict[str, float], together: float, ceiling: float
) -> list[str]:
    """The four modes through the whole chain, the UPS's runtime long enough for whole seconds."""
    from holdover.lab import nut
    from holdover.lab.rig import Rig

    # NUT's whole seconds: under 3 s a runtime would be mostly its rounding (the smoke's sizes).
    budget = max(together / args.over, 3.0)
    pids = [p.pid for _n, p in runs]
    full = args.base_w + args.rank_w * len(pids)
    online = {"ups.status": "OL", "battery.runtime": str(int(budget)), "ups.load": str(round(100 * full / args.ups_w))}
    print(
        f"\nthrough the chain: the emulated sentinel's mains pin cut, NUT's dummy-ups serving the model "
        f"({int(budget)} s at {full:.0f} W of a {args.ups_w:.0f} W UPS, whole seconds), margin {args.margin:g} s"
    )
    verdict: list[str] = []
    rows: dict[str, list[dict[str, Any]]] = {}
    with nut.NutServer(where / "nut", {"hostups": online}) as server:
        ups_cfg = {"nut": f"hostups@127.0.0.1:{server.port}", "poll_s": 0.2, "watts": args.ups_w}
        rig = Rig(where / "rig", protect={}, bridge_extra={"ups": ups_cfg})
        try:
            rig.start(bridge=False)  # each mode starts its own (chain_cut)
            for rnd, mode in ((r, m) for r in range(args.rounds) for m in args.chain_modes.split(",")):
                aged(where, [n for n, _p in runs], args.age)
                got = chain_cut(rig, server, where, mode, budget, oracle, ceiling, args, pids)
                rows.setdefault(mode, []).append(got)
                lived = f" (model forecast {got['forecast']:.2f} s)" if got.get("forecast") is not None else ""
                print(
                    f"  round {rnd + 1} {mode:12s} rescue {got['opened_s']:.2f} s after the cut ({got['by']}; "
                    f"the sentinel {_s(got['sentinel_s'])}, NUT {_s(got['nut_s'])}), deadline "
                    f"{got['over_s']:+.2f} s from the UPS's end; verified {got['verified']} {got['which']}, "
                    f"torn {got['torn']}, kept {got['kept_s']:.1f} s; the UPS lasted {got['lived']:.2f} s{lived}"
                )
        finally:
            rig.close()
    med = {
        m: {k: statistics.median(r[k] for r in rs) for k in ("verified", "kept_s", "torn")} for m, rs in rows.items()
    }
    for m, v in med.items():
        print(f"  median {m:12s} verified {v['verified']:.0f}, kept {v['kept_s']:.1f} s, torn {v['torn']:.0f}")
    if {"plan", "oracle", "all at once"} <= set(med):
        p, o, a = med["plan"], med["oracle"], med["all at once"]
        verdict.append(
            f"through the chain: plan/oracle {p['kept_s'] / o['kept_s'] if o['kept_s'] else float('nan'):.2f}, "
            f"plan/all-at-once {p['kept_s'] / a['kept_s'] if a['kept_s'] else float('inf'):.2f}, "
            f"torn: plan {p['torn']:.0f}, all at once {a['torn']:.0f}"
        )
    return verdict


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", default=None, help=f"the runs' state sizes, MB ({IN_PROCESS_MB}; with --chain {CHAIN_MB})")
    ap.add_argument("--rounds", type=int, default=None, help="rounds of the modes (3; with --chain 2)")
    ap.add_argument("--over", type=float, default=1.7, help="the states' save time, all at once, over the budget")
    ap.add_argument("--age", type=float, default=8.0, help="seconds the runs train between their save and the cut")
    ap.add_argument("--dir", default=None, help="where the runs write (default: a temp dir on /var/tmp)")
    ap.add_argument("--base-w", type=float, default=200.0, help="the box's own draw, W (plan + shed's UPS)")
    ap.add_argument("--rank-w", type=float, default=300.0, help="a run's draw while it trains, W")
    ap.add_argument("--chain", action="store_true", help="cut through the sentinel, NUT and a bridge (below)")
    ap.add_argument("--chain-modes", default=",".join(MODES), help="the modes --chain runs, in order")
    ap.add_argument("--ups-w", type=float, default=2000.0, help="--chain: the UPS's rated watts ([ups] watts)")
    ap.add_argument("--margin", type=float, default=1.0, help="--chain: [protect] margin, s")
    args = parse(ap, mb="24,16,8", rounds=1, age=0.0, chain_modes="plan + shed")
    logging.getLogger("holdover").setLevel(logging.ERROR)  # the rescue's own lines: the rows say it
    sizes = [int(x) for x in (args.mb or (CHAIN_MB if args.chain else IN_PROCESS_MB)).split(",")]
    args.rounds = args.rounds or (2 if args.chain else 3)
    where = Path(args.dir or tempfile.mkdtemp(prefix="holdover-rescue-plan-", dir="/var/tmp"))
    runs = start_runs(where, sizes)
    names = [n for n, _p in runs]
    pids = [p.pid for _n, p in runs]
    try:
        for n in names:  # the periodic save the plan reads, and the oracle's timing
            asyncio.run(save_alone(where, n))
        oracle = {n: statistics.median(asyncio.run(save_alone(where, n)) for _ in range(2)) for n in names}
        together = statistics.median(asyncio.run(save_all(where, names)) for _ in range(2))
        nbytes = sum(reg_of(where, n).last_save.nbytes for n in names)  # type: ignore[union-attr]
        ceiling = nbytes / together  # what the disk took with every save at once, verify included
        print(
            f"states {sizes} MB; each alone, request to verified: "
            + ", ".join(f"{n} {t:.2f} s" for n, t in oracle.items())
            + f"; all at once {together:.2f} s ({ceiling / 1e6:.0f} MB/s together, the ceiling the plan is given)"
        )
        results: dict[str, dict[str, list[Any]]] = {}
        budget_of: dict[str, float] = {}
        verdict = []
        for label, over in (("do not fit", args.over), ("fit", 0.5)) if not args.chain or args.smoke else ():
            budget = together / over
            budget_of[label] = budget
            print(f"\n{label}: the states take {together:.2f} s at once; {budget:.2f} s to save in")
            for rnd in range(args.rounds):
                for mode in MODES:
                    aged(where, names, args.age)
                    got = cut(where, mode, budget, oracle, ceiling, (args.base_w, args.rank_w, pids))
                    row = results.setdefault(label, {}).setdefault(mode, [])
                    row.append(got)
                    lived = (
                        f", the UPS lasted {got['lived']:.2f} s (model forecast {got['forecast']:.2f} s)"
                        if got.get("forecast") is not None
                        else ""
                    )
                    print(
                        f"  round {rnd + 1} {mode:12s} verified {got['verified']} {got['which']}, "
                        f"torn {got['torn']}, kept {got['kept_s']:.1f} s{lived}"
                    )
        if results:
            print("\nmedians:")
        for label, modes in results.items():
            med = {
                m: {k: statistics.median(r[k] for r in rows) for k in ("verified", "kept_s", "torn")}
                for m, rows in modes.items()
            }
            for m, v in med.items():
                print(
                    f"  {label:10s} {m:12s} verified {v['verified']:.0f}, kept {v['kept_s']:.1f} s, "
                    f"torn {v['torn']:.0f}"
                )
            plan, oracle_m, alls, shed = med["plan"], med["oracle"], med["all at once"], med["plan + shed"]
            lived = [(r["lived"], r["forecast"]) for r in modes["plan + shed"] if r.get("forecast")]
            if lived:
                got_s = statistics.median(a for a, _f in lived)
                model_s = statistics.median(f for _a, f in lived)
                verdict.append(
                    f"{label}: shedding kept {shed['kept_s']:.1f} s against the plan's {plan['kept_s']:.1f} s, "
                    f"torn {shed['torn']:.0f}; the UPS lasted {got_s:.2f} s of a {budget_of[label]:.2f} s runtime "
                    f"(the model forecast {model_s:.2f} s: {got_s / model_s:.2f} of it)"
                )
            if label == "do not fit":
                vs_oracle = plan["kept_s"] / oracle_m["kept_s"] if oracle_m["kept_s"] else float("nan")
                vs_all = plan["kept_s"] / alls["kept_s"] if alls["kept_s"] else float("inf")
                verdict.append(f"plan/oracle {vs_oracle:.2f} (goal >= 0.9)")
                verdict.append(f"plan/all-at-once {vs_all:.2f} (goal >= 1.5)")
                verdict.append(f"torn saves: plan {plan['torn']:.0f}, all at once {alls['torn']:.0f} (goal: plan 0)")
            else:
                verdict.append(
                    f"when they fit: plan verified {plan['verified']:.0f}, "
                    f"all at once {alls['verified']:.0f} (goal: equal)"
                )
        if args.chain or args.smoke:
            verdict += chain(args, where, runs, oracle, together, ceiling)
        print("\nverdict: " + "; ".join(verdict))
    finally:
        for _n, p in runs:
            p.send_signal(signal.SIGCONT)  # never left stopped, even by a round cut short
            p.kill()
            p.wait()
        if args.dir is None:
            shutil.rmtree(where, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
