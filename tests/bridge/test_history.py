"""What the dashboard plots: points from sentinel states and UPS reads, kept a week, read back in
at most BUCKETS buckets with the line broken where nothing was recorded."""

from __future__ import annotations

import time
from pathlib import Path

from holdover.bridge.history import BUCKETS, SAMPLES_KEEP_S, History, UpsHistory
from holdover.journal import Journal


def _put(h: History | UpsHistory, who: str, ts: float, **values: float | None) -> None:
    names = ", ".join(values)
    h.db.execute(
        f"INSERT INTO {h.TABLE} ({h.KEY}, ts, {names}) VALUES (?, ?{', ?' * len(values)})", (who, ts, *values.values())
    )


def test_a_state_makes_one_point_through_its_best_target_and_a_chatty_one_no_more(tmp_path: Path) -> None:
    with Journal(tmp_path / "j.db") as j:
        h = History(j)
        targets = [{"rtt_ms": 40.0, "loss_pct": 0}, {"rtt_ms": 12.5, "loss_pct": 20}, {"rtt_ms": None, "loss_pct": 100}]
        h.record("rack1", {"battery_pct": 81, "battery_v": 3.93, "targets": targets})
        h.record("rack1", {"battery_pct": 10, "battery_v": 3.3, "targets": []})  # within every_s: not kept
        h.record("rack2", {"mains": True})  # nothing to plot: no point
        s = h.series("rack1", 1)
        assert (s["battery_pct"], s["battery_v"], s["rtt_ms"], s["loss_pct"]) == ([81], [3.93], [12.5], [0])
        assert h.series("rack2", 1)["t"] == []


def test_a_week_reads_back_in_at_most_BUCKETS_buckets_each_the_worst_case_of_its_points(tmp_path: Path) -> None:
    now = time.time()
    with Journal(tmp_path / "j.db") as j:
        h, u = History(j), UpsHistory(j)
        for i in range(0, 7 * 86400, 60):  # a point a minute for a week: 10,080 of each
            _put(h, "rack1", now - i, battery_pct=50.0, rtt_ms=10.0 + i % 120, loss_pct=float(i % 300 == 0) * 40)
            _put(u, "ups", now - i, runtime_s=600.0 - i % 600, charge_pct=99.0, on_battery=0.0)
        s = h.series("rack1", 168)
        assert 700 <= len(s["t"]) <= BUCKETS + 1 and s["bucket_s"] == 840
        assert s["t"] == sorted(s["t"]) and all(t % 840 == 0 for t in s["t"])
        # Every full 14-minute bucket holds a lossy minute (one in 5): the max shows it. The first
        # and last bucket may be cut short by the week's edges.
        assert set(s["loss_pct"][1:-1]) == {40.0}
        assert set(s["battery_pct"]) == {50.0}
        r = u.series("ups", 168)
        # Runtime runs 600 s down to 60 s each 10 minutes: every full bucket says the least, 60 s.
        assert r["runtime_s"].count(60.0) >= len(r["t"]) - 2, r["runtime_s"]
        assert len(h.series("rack1", 6)["t"]) <= BUCKETS + 1 and h.series("rack1", 6)["bucket_s"] == 30


def test_a_silence_breaks_the_line_and_nothing_older_than_a_week_is_kept(tmp_path: Path) -> None:
    now = time.time()
    with Journal(tmp_path / "j.db") as j:
        h = History(j)
        _put(h, "rack1", now - SAMPLES_KEEP_S - 60, battery_pct=99.0)  # older than a week
        for ts in (now - 3 * 3600, now - 3 * 3600 + 30, now - 600, now - 570):  # down for 2 h 50 min between
            _put(h, "rack1", ts, battery_pct=70.0)
        s = h.series("rack1", 6)
        assert s["battery_pct"].count(None) == 1 and s["battery_pct"][0] == 70.0, s
        gap = s["battery_pct"].index(None)
        assert s["t"][gap - 1] < s["t"][gap] < s["t"][gap + 1]
        h.record("rack1", {"battery_pct": 69})  # a write prunes what is older than SAMPLES_KEEP_S
        (n,) = j.db.execute("SELECT COUNT(*) FROM samples WHERE ts < ?", (now - SAMPLES_KEEP_S,)).fetchone()
        assert n == 0


def test_a_ups_read_with_nothing_to_plot_makes_no_point(tmp_path: Path) -> None:
    with Journal(tmp_path / "j.db") as j:
        u = UpsHistory(j)
        u.record("ups", None, None, False)
        u.record("other", 450.0, 91.0, True)
        assert u.series("ups", 1)["t"] == []
        s = u.series("other", 1)
        assert (s["runtime_s"], s["charge_pct"], s["on_battery"]) == ([450.0], [91.0], [1.0])
