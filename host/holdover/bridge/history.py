"""Each sentinel's history in the journal: a point of battery volts and best probe RTT from its
states, at most one per SAMPLE_EVERY_S, kept SAMPLES_KEEP_S. The bridge records it; the API's
/api/sentinels/{sid}/history and the dashboard's sparklines read it."""

from __future__ import annotations

import time
from typing import Any

from holdover.journal import Ledger

SAMPLE_EVERY_S = 10.0  # a chatty sentinel's states still make at most one point per this
SAMPLES_KEEP_S = 7 * 86400


class History(Ledger):
    DDL = """
    CREATE TABLE IF NOT EXISTS samples (
        sid TEXT NOT NULL,
        ts REAL NOT NULL,
        battery_v REAL,
        rtt_ms REAL
    );
    CREATE INDEX IF NOT EXISTS samples_by_time ON samples (sid, ts);
    """
    every_s = SAMPLE_EVERY_S

    def record(self, sid: str, data: dict[str, Any]) -> None:
        """One point of the history the dashboard plots: battery volts, best probe RTT."""
        rtts = [t.get("rtt_ms") for t in data.get("targets") or [] if isinstance(t, dict)]
        rtt = min((r for r in rtts if isinstance(r, int | float)), default=None)
        volts = data.get("battery_v") if isinstance(data.get("battery_v"), int | float) else None
        if volts is None and rtt is None:
            return
        now = time.time()
        (last,) = self.db.execute("SELECT MAX(ts) FROM samples WHERE sid=?", (sid,)).fetchone()
        if last is not None and now - last < self.every_s:
            return
        self.db.execute("INSERT INTO samples (sid, ts, battery_v, rtt_ms) VALUES (?,?,?,?)", (sid, now, volts, rtt))
        self.db.execute("DELETE FROM samples WHERE sid=? AND ts<?", (sid, now - SAMPLES_KEEP_S))

    def points(self, sid: str, since: float) -> list[tuple[float, float | None, float | None]]:
        if not self.present:
            return []
        rows = self.db.execute(
            "SELECT ts, battery_v, rtt_ms FROM samples WHERE sid=? AND ts>=? ORDER BY ts", (sid, since)
        )
        return [tuple(r) for r in rows]
