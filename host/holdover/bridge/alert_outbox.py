"""The alert outbox, durable in the journal: an alert stays here until its channel took it, so
one the receiver missed is sent after a bridge restart. bridge/alerts.py fills and drains it."""

from __future__ import annotations

import time
from typing import Any

from holdover.journal import Ledger

COLS = ("id", "ts", "channel", "severity", "kind", "sid", "title", "body", "attempts", "next_try", "error")


class AlertOutbox(Ledger):
    DDL = """
    CREATE TABLE IF NOT EXISTS alert_outbox (
        id INTEGER PRIMARY KEY,
        ts REAL NOT NULL,
        channel TEXT NOT NULL,
        severity TEXT NOT NULL,
        kind TEXT NOT NULL,
        sid TEXT NOT NULL,
        title TEXT NOT NULL,
        body TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        next_try REAL NOT NULL,
        error TEXT,
        sent REAL,
        sent_as INTEGER
    );
    CREATE INDEX IF NOT EXISTS alert_outbox_due ON alert_outbox (sent, next_try);
    """

    def queue(self, channel: str, severity: str, kind: str, sid: str, title: str, body: str) -> int:
        now = time.time()
        cur = self.db.execute(
            "INSERT INTO alert_outbox (ts, channel, severity, kind, sid, title, body, next_try) "
            "VALUES (?,?,?,?,?,?,?,?)",
            (now, channel, severity, kind, sid, title, body, now),
        )
        return cur.lastrowid or 0

    def due(self, now: float) -> list[dict[str, Any]]:
        rows = self.db.execute(
            f"SELECT {', '.join(COLS)} FROM alert_outbox WHERE sent IS NULL AND next_try <= ? ORDER BY id",
            (now,),
        )
        return [dict(zip(COLS, r, strict=True)) for r in rows]

    def sent(self, ids: list[int], ts: float, sent_as: int) -> None:
        """Mark alerts delivered; several merged into one message share `sent_as` (the first's id)."""
        self.db.executemany(
            "UPDATE alert_outbox SET sent=?, sent_as=?, error=NULL WHERE id=?", [(ts, sent_as, i) for i in ids]
        )

    def retry(self, ids: list[int], next_try: float, error: str) -> None:
        self.db.executemany(
            "UPDATE alert_outbox SET attempts=attempts+1, next_try=?, error=? WHERE id=?",
            [(next_try, error, i) for i in ids],
        )

    def messages_since(self, channel: str, since: float) -> list[float]:
        """When each message went out on `channel` since `since` (merged alerts count once)."""
        rows = self.db.execute(
            "SELECT MIN(sent) FROM alert_outbox WHERE channel=? AND sent>=? GROUP BY sent_as ORDER BY 1",
            (channel, since),
        )
        return [r[0] for r in rows]

    def unsent(self) -> dict[str, int]:
        """Alerts still waiting, by channel."""
        if not self.present:
            return {}
        q = "SELECT channel, COUNT(*) FROM alert_outbox WHERE sent IS NULL GROUP BY 1"
        return dict(self.db.execute(q).fetchall())

    def alerts(self, channel: str | None = None) -> list[dict[str, Any]]:
        if not self.present:
            return []
        q, args = f"SELECT {', '.join(COLS)}, sent, sent_as FROM alert_outbox", ()
        if channel:
            q, args = q + " WHERE channel=?", (channel,)
        rows = self.db.execute(q + " ORDER BY id", args)
        return [dict(zip((*COLS, "sent", "sent_as"), r, strict=True)) for r in rows]
