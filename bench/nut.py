#!/usr/bin/env python3
"""A power cut, told to NUT's clients and turned into a rescue deadline: holdover's path beside
NUT's own fastest one, in one run on this machine.

1. To a `upsmon` secondary (NUT's own, POLLFREQ 1, its fastest) as ONBATT:
   - holdover: a cut on the emulated sentinel (real MicroPython, 300 ms debounce) -> signed MQTT
     -> the bridge -> the served dummy-ups file (`[nut_server]`) -> NUT's upsd -> upsmon;
   - NUT alone: a script writes OB into a dummy-ups file (pollinterval 1) -> upsd -> upsmon. The
     floor of any NUT setup: a real driver (usbhid-ups) adds its own poll (2 s by default) and
     the UPS's own time to call the cut, neither of which is here.
2. To the rescue's deadline being set (the bridge's rescue starts, grace 0):
   - from the sentinel's cut;
   - from the host UPS's OB through NUT at its fastest (dummy-ups pollinterval 1, `[ups] poll_s`
     0.2), measured from the write of OB.

Times are this machine's wall clock: the bench's own before the cut or the write, upsmon's
NOTIFYCMD's $EPOCHREALTIME, the rescue ledger's start.
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

from common import parse, wait

from holdover.bridge import nut_config
from holdover.journal import Journal
from holdover.lab import nut
from holdover.lab.broker import free_port
from holdover.lab.rig import Rig
from holdover.lab.stats import percentile
from holdover.node.rescue_ledger import RescueLedger
from holdover.settings import NutServerSettings

ONLINE = {"ups.status": "OL", "battery.charge": "100", "battery.runtime": "900", "ups.load": "30"}


def notified(mon: nut.Upsmon, kind: str, after: float) -> float | None:
    return next((t for t, k in mon.said() if k == kind and t >= after), None)


def rescue_started(journal: Path, count: int) -> float | None:
    with Journal(journal, readonly=True) as j:
        found = RescueLedger(j).rescues()
    return found[-1]["started"] if len(found) >= count else None


def summary(name: str, xs: list[float]) -> str:
    p50, p95 = percentile(xs, 50), percentile(xs, 95)
    return f"  {name:<46} p50 {p50:7.0f} ms  p95 {p95:7.0f} ms  min {min(xs):6.0f}  max {max(xs):6.0f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cuts", type=int, default=12, help="cuts of each kind")
    args = parse(ap, cuts=1)
    rng = random.Random(11)
    with tempfile.TemporaryDirectory(prefix="holdover-bench-nut-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)  # upsd runs as nut, as packaged, and reads the served files below it
        serve_port = free_port()
        with nut.NutServer(work / "host-nut", {"hostups": ONLINE}) as host_ups:
            served = {
                "serve": True,
                "dir": str(work / "served"),
                "listen": "127.0.0.1",
                "port": serve_port,
                "clients": ["gpu2", "nas"],
            }
            rig = Rig(
                work / "rig",
                protect={"registry": str(work / "reg"), "grace": 0},
                bridge_extra={
                    "ups": {"nut": f"hostups@127.0.0.1:{host_ups.port}", "poll_s": 0.2},
                    "nut_server": served,
                },
            )
            rig.start()
            try:
                rig.wait("boot", 20)
                wait("the served file", (work / "served" / "holdover-demo.dev").exists)
                written = nut_config.write(NutServerSettings.model_validate(served), ["demo"], work / "nut-conf")
                gpu2, nas = (written.passwords[c] for c in ("gpu2", "nas"))
                with (
                    nut.NutServer(
                        work / "served-nut", {"holdover-demo": {}}, port=serve_port, confdir=work / "nut-conf"
                    ),
                    nut.Upsmon(
                        work / "mon-sentinel", f"MONITOR holdover-demo@127.0.0.1:{serve_port} 1 gpu2 {gpu2} secondary"
                    ) as mon_sentinel,
                    nut.Upsmon(
                        work / "mon-ups", f"MONITOR hostups@127.0.0.1:{host_ups.port} 1 nas {nas} secondary"
                    ) as mon_ups,
                ):
                    results = run(args.cuts, rng, rig, host_ups, mon_sentinel, mon_ups)
            finally:
                rig.close()
    s_onbatt, n_onbatt, s_rescue, n_rescue = results
    print(f"a power cut through NUT, {args.cuts} cuts each way, this machine ({time.strftime('%Y-%m-%d')})")
    print("to a upsmon secondary's ONBATT (POLLFREQ 1):")
    print(summary("holdover: sentinel cut -> served UPS -> upsmon", s_onbatt))
    print(summary("NUT alone: OB written to dummy-ups -> upsmon", n_onbatt))
    ratio = statistics.median(s_onbatt) / statistics.median(n_onbatt)
    print(f"  ratio of medians, holdover / NUT's floor: {ratio:.2f}")
    print("to the rescue's deadline being set (grace 0):")
    print(summary("from the sentinel's cut", s_rescue))
    print(summary("from the host UPS's OB through NUT (floor)", n_rescue))
    ratio = statistics.median(n_rescue) / statistics.median(s_rescue)
    print(f"  ratio of medians, NUT / sentinel: {ratio:.2f} (a real UPS driver adds its own poll and detection)")
    return 0


def run(cuts: int, rng: random.Random, rig: Rig, host_ups: nut.NutServer, mon_s: nut.Upsmon, mon_u: nut.Upsmon):
    journal = rig.dir / "journal.db"
    time.sleep(2.5)  # each upsmon's first polls see OL: nothing to say
    s_onbatt, n_onbatt, s_rescue, n_rescue = [], [], [], []
    rescues = 0
    for _ in range(cuts):
        # The sentinel's cut: both the served UPS's ONBATT and the rescue, from one cut.
        time.sleep(rng.uniform(0.2, 1.2))  # a random phase against every poll on the way
        t = time.time()
        rig.control.send(mains=False)
        rescues += 1
        s_rescue.append((wait("rescue (sentinel)", lambda n=rescues: rescue_started(journal, n)) - t) * 1000)
        s_onbatt.append((wait("ONBATT (sentinel)", lambda t=t: notified(mon_s, "ONBATT", t)) - t) * 1000)
        back = time.time()
        rig.control.send(mains=True)
        wait("ONLINE (sentinel)", lambda b=back: notified(mon_s, "ONLINE", b))
        # The host UPS's own OB, written as a driver would, the sentinel saying nothing.
        time.sleep(rng.uniform(0.2, 1.2))
        t = time.time()
        host_ups.set("hostups", **{**{k.replace(".", "_"): v for k, v in ONLINE.items()}, "ups_status": "OB DISCHRG"})
        rescues += 1
        n_rescue.append((wait("rescue (UPS)", lambda n=rescues: rescue_started(journal, n)) - t) * 1000)
        n_onbatt.append((wait("ONBATT (UPS)", lambda t=t: notified(mon_u, "ONBATT", t)) - t) * 1000)
        back = time.time()
        host_ups.set("hostups", **{k.replace(".", "_"): v for k, v in ONLINE.items()})
        wait("ONLINE (UPS)", lambda b=back: notified(mon_u, "ONLINE", b))
    return s_onbatt, n_onbatt, s_rescue, n_rescue


if __name__ == "__main__":
    sys.exit(main())
