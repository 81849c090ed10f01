"""What a journal file holds, and how an older one is brought up to it: the base tables, the
schema's version (`PRAGMA user_version`) and the migrations, each run once, at open. A wing's own
tables are its Ledger's (ledger.py), and so are their later columns."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    rx_ts REAL NOT NULL,
    source TEXT NOT NULL,
    sid TEXT NOT NULL,
    boot TEXT NOT NULL,
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL,
    ms INTEGER NOT NULL,
    ts INTEGER,
    data TEXT NOT NULL,
    UNIQUE (sid, boot, seq)
);
CREATE TABLE IF NOT EXISTS rejections (
    id INTEGER PRIMARY KEY,
    rx_ts REAL NOT NULL,
    source TEXT NOT NULL,
    topic TEXT,
    reason TEXT NOT NULL,
    detail TEXT NOT NULL,
    payload BLOB
);
CREATE TABLE IF NOT EXISTS hook_runs (
    id INTEGER PRIMARY KEY,
    event_id INTEGER REFERENCES events(id),
    hook TEXT NOT NULL,
    started REAL NOT NULL,
    ended REAL NOT NULL,
    outcome TEXT NOT NULL,
    returncode INTEGER,
    output TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS pruned (
    sid TEXT NOT NULL,
    boot TEXT NOT NULL,
    below_seq INTEGER NOT NULL,
    PRIMARY KEY (sid, boot)
);
CREATE TABLE IF NOT EXISTS sentinels (
    sid TEXT PRIMARY KEY,
    status TEXT,
    status_ts REAL,
    boot TEXT,
    seq INTEGER,
    state_ts INTEGER,
    state TEXT,
    seen_ts REAL
);
"""
VERSION = 3
# Kept only for [journal] keep_routine_days (events.ROUTINE names them for people; the journal
# cannot import events, which imports it).
ROUTINE_KINDS = ("heartbeat",)


def _add_seen_ts(db: sqlite3.Connection) -> None:
    if not any(r[1] == "seen_ts" for r in db.execute("PRAGMA table_info(sentinels)")):
        db.execute("ALTER TABLE sentinels ADD COLUMN seen_ts REAL")


# (the version it brings a journal to, what it does). Version 1: the first numbered schema, the
# journals of b674fac and before (user_version 0) plus the column some of them still lack.
# Version 2: the `pruned` table (SCHEMA creates it; nothing else changes). Version 3: the
# history's samples gain the sentinel's battery percent and its probes' loss (its Ledger's ADDED
# adds them, bridge/history.py: the base names no wing's table).
MIGRATIONS: list[tuple[int, Callable[[sqlite3.Connection], None]]] = [
    (1, _add_seen_ts),
    (2, lambda _db: None),
    (3, lambda _db: None),
]


def statements(script: str) -> list[str]:
    # executescript() commits any open transaction first, which a migration must not do.
    return [s.strip() for s in script.split(";") if s.strip()]


@dataclass(frozen=True)
class Event:
    id: int
    rx_ts: float
    source: str
    sid: str
    boot: str
    seq: int
    kind: str
    ms: int
    ts: int | None
    data: dict[str, Any]

    @property
    def body(self) -> dict[str, Any]:
        return {
            "sid": self.sid,
            "boot": self.boot,
            "seq": self.seq,
            "kind": self.kind,
            "ms": self.ms,
            "ts": self.ts,
            "data": self.data,
        }


def event(event_id: int, rx_ts: float, source: str, body: dict[str, Any]) -> Event:
    return Event(event_id, rx_ts, source, *(body[k] for k in ("sid", "boot", "seq", "kind", "ms", "ts", "data")))
