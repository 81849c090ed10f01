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

Not here: a UPS that reports its own runtime (the model stands in for NUT's dummy-ups; no watts are
measured, a run's draw is the figure given) and a cut on the emulated sentinel; the rescue is driven
from its journaled event, as tests/node/test_rescue.py drives it.

    .venv/bin/python bench/rescue_plan.py [--mb 600,400,250,150] [--rounds 3] [--over 1.7] [--age 8]
        [--base-w 200] [--rank-w 300] [--smoke]
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
from pathlib import Path
from typing import Any

from common import parse, wait

from holdover.firmware import protocol
from holdover.journal import Journal
from holdover.node import plan
from holdover.node.rescue import Rescuer
from holdover.node.rescue_ledger import RescueLedger
from holdover.node.ups import Runtime
from holdover.settings import ProtectSettings
from holdover.train import ckpt, registry

MARGIN_S = 0.0  # the deadline is the budget itself: the bench sets the runtime to it


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


class LoadUps:
    """A UPS whose runtime follows its load: energy left over the load of the moment."""

    def __init__(self, runtime_s: float, base_w: float, rank_w: float, pids: list[int]) -> None:
        self.base_w, self.rank_w, self.pids = base_w, rank_w, pids
        self.load0 = self.load()
        self.energy = runtime_s * self.load0  # J
        self.died_at: float | None = None
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


def cut(where: Path, mode: str, budget: float, oracle: dict[str, float], ceiling: float, load: Load) -> dict[str, Any]:
    """One cut through the bridge's Rescuer; what it kept by the deadline (the UPS's end with shedding)."""
    if mode == "oracle":
        for name, took in oracle.items():  # every save's true time known in advance: the plan reads these
            reg = reg_of(where, name)
            assert reg.last_save is not None
            reg.last_save.seconds = took - reg.last_save.nbytes / (plan.VERIFY_MB_S * 1e6)
            registry.write_registration(where / "reg", reg)
    s = ProtectSettings.model_validate(
        {
            "registry": where / "reg",
            "rescue_dir": where / "rescue",
            "grace": 0,
            "margin": MARGIN_S,
            "hang_after": 600,
            "gcore": False,
            "plan": mode != "all at once",
            "disk_mb_s": ceiling / 1e6,  # as measured below, as a user would set it from fio
            "shed": mode == "plan + shed",
            "rank_watts": load[1],
        }
    )
    runtime = Runtime(budget, f"a UPS of {budget:.1f} s (the bench's)", False, True)
    forecast = None
    if mode == "plan + shed":
        regs = [reg_of(where, n) for n in oracle]
        p = plan.plan(plan.costs(regs), budget, "the model", False, MARGIN_S, 0.0, ceiling)
        p.load_w, p.rank_w, p.shed = load[0] + load[1] * len(load[2]), load[1], True
        forecast = p.shed_runtime_s
    ages = {n: time.time() - reg_of(where, n).last_save.at for n in oracle}  # type: ignore[union-attr]
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
    verified = {x["target"].split(":")[0] for x in steps if x["action"] == "verified" and x["ts"] <= deadline}
    asked = {x["target"].split(":")[0] for x in steps if x["action"] == "requested"}
    db.unlink()
    return {
        "verified": len(verified),
        "kept_s": sum(ages[n] for n in verified),  # one rank each: compute = age
        "torn": len(asked - verified),
        "which": sorted(verified),
        **out,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", default="600,400,250,150", help="the runs' state sizes, MB")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--over", type=float, default=1.7, help="the states' save time, all at once, over the budget")
    ap.add_argument("--age", type=float, default=8.0, help="seconds the runs train between their save and the cut")
    ap.add_argument("--dir", default=None, help="where the runs write (default: a temp dir on /var/tmp)")
    ap.add_argument("--base-w", type=float, default=200.0, help="the box's own draw, W (plan + shed's UPS)")
    ap.add_argument("--rank-w", type=float, default=300.0, help="a run's draw while it trains, W")
    args = parse(ap, mb="24,16,8", rounds=1, age=0.0)
    logging.getLogger("holdover").setLevel(logging.ERROR)  # the rescue's own lines: the rows say it
    sizes = [int(x) for x in args.mb.split(",")]
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
        for label, over in (("do not fit", args.over), ("fit", 0.5)):
            budget = together / over
            budget_of[label] = budget
            print(f"\n{label}: the states take {together:.2f} s at once; {budget:.2f} s to save in")
            for rnd in range(args.rounds):
                for mode in ("all at once", "plan", "oracle", "plan + shed"):
                    settle(where, names)
                    for n in names:  # every run about equally old at the cut, its measured save fresh
                        asyncio.run(save_alone(where, n))
                    time.sleep(args.age)
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
        verdict = []
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
