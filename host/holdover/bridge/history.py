"""What the dashboard plots, kept in the journal: each sentinel's own battery and its probes' best
RTT and loss (from its states), and the host UPS's runtime and charge (from the bridge's reads),
at most one point per SAMPLE_EVERY_S each, kept SAMPLES_KEEP_S. The bridge records them; the API's
/api/sentinels/{sid}/history and /api/ups/history read them back in buckets a chart can draw."""

from __future__ import annotations

import time
from typing import Any

from holdover.journal import Ledger

SAMPLE_EVERY_S = 10.0  # a chatty sentinel's states still make at most one point per this
SAMPLES_KEEP_S = 7 * 86400
# 7 days at one point per 10 s is 60,480 points a series: a chart gets at most this many buckets
# (each the mean of its points; the loss the worst), which is about one per pixel of a laptop's chart.
BUCKETS = 720


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


class _Series(Ledger):
    """A ledger of timed points in one table, keyed by who they are about, read back in buckets."""

    TABLE = ""
    KEY = ""
    every_s = SAMPLE_EVERY_S

    def _add(self, who: str, point: dict[str, float | None]) -> None:
        now = time.time()
        (last,) = self.db.execute(f"SELECT MAX(ts) FROM {self.TABLE} WHERE {self.KEY}=?", (who,)).fetchone()
        if all(v is None for v in point.values()) or (last is not None and now - last < self.every_s):
            return
        names = ", ".join(point)
        self.db.execute(
            f"INSERT INTO {self.TABLE} ({self.KEY}, ts, {names}) VALUES (?, ?{', ?' * len(point)})",
            (who, now, *point.values()),
        )
        self.db.execute(f"DELETE FROM {self.TABLE} WHERE {self.KEY}=? AND ts<?", (who, now - SAMPLES_KEEP_S))

    def _buckets(self, who: str, hours: float, aggregate: dict[str, str]) -> dict[str, Any]:
        """{"bucket_s", "t": [bucket start, ...], <series>: [value or None, ...]}: at most BUCKETS
        buckets over the last `hours`, a None row where no point fell for over 3 buckets (a
        bridge or sentinel that was down), so a chart breaks its line there rather than bridge it."""
        bucket = max(self.every_s, hours * 3600 / BUCKETS)
        out: dict[str, Any] = {"bucket_s": bucket, "t": [], **{name: [] for name in aggregate}}
        if not self.present:
            return out
        # A reader of a journal from before schema 3 (never migrated: it holds no write lock)
        # finds the older columns only; the others read as empty.
        have = {r[1] for r in self.db.execute(f"PRAGMA table_info({self.TABLE})")}
        cols = ", ".join(f"{fn}({name})" if name in have else "NULL" for name, fn in aggregate.items())
        rows = self.db.execute(
            f"SELECT CAST(ts / ? AS INTEGER) AS b, {cols} FROM {self.TABLE} WHERE {self.KEY}=? AND ts>=? "
            "GROUP BY b ORDER BY b",
            (bucket, who, time.time() - hours * 3600),
        )
        last = None
        for b, *values in rows:
            if last is not None and b - last > 3:
                out["t"].append((last + 1) * bucket)
                for name in aggregate:
                    out[name].append(None)
            out["t"].append(b * bucket)
            for name, v in zip(aggregate, values, strict=True):
                out[name].append(None if v is None else round(v, 3))
            last = b
        return out


class History(_Series):
    """Each sentinel's own cell and its probes, from its states."""

    DDL = """
    CREATE TABLE IF NOT EXISTS samples (
        sid TEXT NOT NULL,
        ts REAL NOT NULL,
        battery_v REAL,
        rtt_ms REAL,
        battery_pct REAL,
        loss_pct REAL
    );
    CREATE INDEX IF NOT EXISTS samples_by_time ON samples (sid, ts);
    """
    # A journal before schema 3 has `samples` with battery_v and rtt_ms only.
    ADDED = (("samples", "battery_pct", "REAL"), ("samples", "loss_pct", "REAL"))
    TABLE, KEY = "samples", "sid"

    def record(self, sid: str, data: dict[str, Any]) -> None:
        """A point from a sentinel's state: its own cell, and its probes through the best target
        (the uplink is as good as its best path: a dead target among live ones is not loss)."""
        targets = [t for t in data.get("targets") or [] if isinstance(t, dict)]
        rtt = min((r for t in targets if (r := _number(t.get("rtt_ms"))) is not None), default=None)
        loss = min((x for t in targets if (x := _number(t.get("loss_pct"))) is not None), default=None)
        battery = {"battery_pct": _number(data.get("battery_pct")), "battery_v": _number(data.get("battery_v"))}
        self._add(sid, {**battery, "rtt_ms": rtt, "loss_pct": loss})

    def series(self, sid: str, hours: float) -> dict[str, Any]:
        """A sentinel's series over the last hours, columns for a chart; the loss the worst of a bucket."""
        return self._buckets(sid, hours, {"battery_pct": "AVG", "battery_v": "AVG", "rtt_ms": "AVG", "loss_pct": "MAX"})


class UpsHistory(_Series):
    """The host UPS's runtime and charge, from the bridge's reads of it (every poll_s)."""

    DDL = """
    CREATE TABLE IF NOT EXISTS ups_samples (
        ups TEXT NOT NULL,
        ts REAL NOT NULL,
        runtime_s REAL,
        charge_pct REAL,
        on_battery INTEGER
    );
    CREATE INDEX IF NOT EXISTS ups_samples_by_time ON ups_samples (ups, ts);
    """
    TABLE, KEY = "ups_samples", "ups"

    def record(self, ups: str, runtime_s: float | None, charge: float | None, on_battery: bool) -> None:
        if runtime_s is not None or charge is not None:
            self._add(ups, {"runtime_s": runtime_s, "charge_pct": charge, "on_battery": float(on_battery)})

    def series(self, ups: str, hours: float) -> dict[str, Any]:
        # The least runtime in a bucket: what a person planning around it must assume.
        return self._buckets(ups, hours, {"runtime_s": "MIN", "charge_pct": "AVG", "on_battery": "MAX"})
