#!/usr/bin/env python3
"""What a dashboard chart costs the bridge: a week of one sentinel's history (a point every 10 s,
as the bridge keeps it: 60,480 rows) read back for 6 h, 24 h and 7 d, in buckets (ours: at most
720, the mean of each, the loss the worst) beside reading every row as a plain SELECT would (the
baseline a chart library fed raw points would need), on a journal file on this machine's disk:
the time to read, and the JSON the page would download.
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

from common import parse

from holdover.bridge.history import SAMPLE_EVERY_S, History
from holdover.journal import Journal

RUNS = 7


def timed(fn) -> tuple[float, object]:
    times, out = [], None
    for _ in range(RUNS):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main() -> int:
    parse(argparse.ArgumentParser(description=__doc__))  # 3 s in whole: its smoke is the run itself
    with tempfile.TemporaryDirectory(prefix="holdover-bench-history-") as tmp, Journal(Path(tmp) / "j.db") as j:
        h = History(j)
        now = time.time()
        rows = [("rack1", now - i, 90.0, 4.0, 12.0 + i % 7, float(i % 600 == 0)) for i in range(0, 7 * 86400, 10)]
        with j.db:
            j.db.executemany(
                "INSERT INTO samples (sid, ts, battery_pct, battery_v, rtt_ms, loss_pct) VALUES (?,?,?,?,?,?)", rows
            )
        every = f"one per {SAMPLE_EVERY_S:.0f} s"
        print(f"a week of one sentinel's history: {len(rows)} points ({every}), {RUNS} reads each")
        for hours in (6, 24, 168):
            ours, s = timed(lambda hours=hours: h.series("rack1", hours))
            raw, r = timed(
                lambda hours=hours: j.db.execute(
                    "SELECT ts, battery_pct, battery_v, rtt_ms, loss_pct FROM samples"
                    " WHERE sid=? AND ts>=? ORDER BY ts",
                    ("rack1", now - hours * 3600),
                ).fetchall()
            )
            assert isinstance(s, dict) and isinstance(r, list)
            # What the page downloads: the API's JSON of each.
            kb_ours, kb_raw = len(json.dumps(s)) / 1024, len(json.dumps(r)) / 1024
            print(
                f"  {hours:>3} h: buckets {ours * 1000:6.1f} ms, {len(s['t'])} points, {kb_ours:5.0f} KB;"
                f" every row {raw * 1000:6.1f} ms, {len(r)} points, {kb_raw:5.0f} KB;"
                f" time ratio {ours / raw:.2f}, size ratio {kb_ours / kb_raw:.3f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
