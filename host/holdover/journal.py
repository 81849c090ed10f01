"""The bridge's SQLite journal: every accepted and rejected message, and every hook run.

The unique (sentinel, boot, seq) index on accepted events is also the replay guard, so
a restarted bridge still refuses an event it accepted before it stopped.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
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
CREATE TABLE IF NOT EXISTS data_usage (
    month TEXT,
    dev TEXT,
    bytes INTEGER NOT NULL DEFAULT 0,
    counter INTEGER,
    alerted REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (month, dev)
);
CREATE TABLE IF NOT EXISTS sentinels (
    sid TEXT PRIMARY KEY,
    status TEXT,
    status_ts REAL,
    boot TEXT,
    seq INTEGER,
    state_ts INTEGER,
    state TEXT
);
CREATE TABLE IF NOT EXISTS rescues (
    id INTEGER PRIMARY KEY,
    event_id INTEGER UNIQUE REFERENCES events(id),
    sid TEXT NOT NULL,
    reason TEXT NOT NULL,
    started REAL NOT NULL,
    deadline REAL NOT NULL,
    critical INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL,
    finished REAL
);
CREATE TABLE IF NOT EXISTS rescue_steps (
    id INTEGER PRIMARY KEY,
    rescue_id INTEGER NOT NULL REFERENCES rescues(id),
    ts REAL NOT NULL,
    target TEXT NOT NULL,
    pid INTEGER,
    action TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS samples (
    sid TEXT NOT NULL,
    ts REAL NOT NULL,
    battery_v REAL,
    rtt_ms REAL
);
CREATE INDEX IF NOT EXISTS samples_by_time ON samples (sid, ts);
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
HOST_BOOT = "host"  # the boot of events the bridge raises itself (sentinel_offline, ...)
HOST_SOURCE = "bridge"
PAYLOAD_KEEP = 1024  # bytes of a rejected payload kept as evidence


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


class Journal:
    """The journal; also usable as a context manager that closes the connection."""

    def __init__(self, path: Path | str, readonly: bool = False) -> None:
        self.path = Path(path)
        if readonly:
            # A reader (tests, status commands) never takes the write lock the bridge needs.
            self.db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, isolation_level=None)
        else:
            if str(path) != ":memory:":
                self.path.parent.mkdir(parents=True, exist_ok=True)
            # Used by one thread at a time (the bridge loop), but not always the one that opened it.
            self.db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA busy_timeout=5000")
        if readonly:
            return
        self.db.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode survives a process crash; a power cut may lose the last few
        # commits, which the sentinel would re-send anyway (its queue waits for PUBACK).
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)
        self._migrate()

    def _has_seen_ts(self) -> bool:
        return any(r[1] == "seen_ts" for r in self.db.execute("PRAGMA table_info(sentinels)"))

    def _migrate(self) -> None:
        """Columns added since a journal was made: a bridge upgrade keeps the history it had."""
        have = {r[1] for r in self.db.execute("PRAGMA table_info(sentinels)")}
        if "seen_ts" not in have:
            self.db.execute("ALTER TABLE sentinels ADD COLUMN seen_ts REAL")

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.db.close()

    def accept(self, source: str, body: dict[str, Any]) -> Event | None:
        """Record an accepted event; None if (sid, boot, seq) was already journaled."""
        rx = time.time()
        try:
            cur = self.db.execute(
                "INSERT INTO events (rx_ts, source, sid, boot, seq, kind, ms, ts, data) VALUES (?,?,?,?,?,?,?,?,?)",
                (
                    rx,
                    source,
                    body["sid"],
                    body["boot"],
                    body["seq"],
                    body["kind"],
                    body["ms"],
                    body["ts"],
                    json.dumps(body["data"]),
                ),
            )
        except sqlite3.IntegrityError:
            return None
        return Event(
            cur.lastrowid or 0,
            rx,
            source,
            body["sid"],
            body["boot"],
            body["seq"],
            body["kind"],
            body["ms"],
            body["ts"],
            body["data"],
        )

    def host_event(self, sid: str, kind: str, data: dict[str, Any]) -> Event:
        """Journal an event the bridge itself raises about a sentinel (its own numbering, boot HOST_BOOT)."""
        (last,) = self.db.execute(
            "SELECT COALESCE(MAX(seq), 0) FROM events WHERE sid=? AND boot=?", (sid, HOST_BOOT)
        ).fetchone()
        body = {"sid": sid, "boot": HOST_BOOT, "seq": last + 1, "kind": kind, "ms": 0, "ts": int(time.time())}
        event = self.accept(HOST_SOURCE, {**body, "data": data})
        assert event is not None  # one writer per journal: the next number is free
        return event

    def event_source(self, sid: str, boot: str, seq: int) -> str | None:
        """The channel an already journaled event first came by, or None."""
        row = self.db.execute("SELECT source FROM events WHERE sid=? AND boot=? AND seq=?", (sid, boot, seq)).fetchone()
        return row[0] if row else None

    def reject(self, source: str, topic: str | None, reason: str, detail: str, payload: bytes | None) -> None:
        self.db.execute(
            "INSERT INTO rejections (rx_ts, source, topic, reason, detail, payload) VALUES (?,?,?,?,?,?)",
            (time.time(), source, topic, reason, detail, payload[:PAYLOAD_KEEP] if payload is not None else None),
        )

    def hook_run(
        self, event_id: int, hook: str, started: float, ended: float, outcome: str, rc: int | None, output: str
    ) -> None:
        self.db.execute(
            "INSERT INTO hook_runs (event_id, hook, started, ended, outcome, returncode, output) "
            "VALUES (?,?,?,?,?,?,?)",
            (event_id, hook, started, ended, outcome, rc, output),
        )

    def status(self, sid: str) -> str | None:
        row = self.db.execute("SELECT status FROM sentinels WHERE sid=?", (sid,)).fetchone()
        return row[0] if row else None

    def set_status(self, sid: str, status: str) -> None:
        self.db.execute(
            "INSERT INTO sentinels (sid, status, status_ts) VALUES (?,?,?) "
            "ON CONFLICT(sid) DO UPDATE SET status=excluded.status, status_ts=excluded.status_ts",
            (sid, status, time.time()),
        )

    SAMPLE_EVERY_S = 10.0  # a chatty sentinel's states still make at most one point per this
    SAMPLES_KEEP_S = 7 * 86400

    def _sample(self, sid: str, data: dict[str, Any]) -> None:
        """One point of the history the dashboard plots: battery volts, best probe RTT."""
        rtts = [t.get("rtt_ms") for t in data.get("targets") or [] if isinstance(t, dict)]
        rtt = min((r for r in rtts if isinstance(r, int | float)), default=None)
        volts = data.get("battery_v") if isinstance(data.get("battery_v"), int | float) else None
        if volts is None and rtt is None:
            return
        now = time.time()
        (last,) = self.db.execute("SELECT MAX(ts) FROM samples WHERE sid=?", (sid,)).fetchone()
        if last is not None and now - last < self.SAMPLE_EVERY_S:
            return
        self.db.execute("INSERT INTO samples (sid, ts, battery_v, rtt_ms) VALUES (?,?,?,?)", (sid, now, volts, rtt))
        self.db.execute("DELETE FROM samples WHERE sid=? AND ts<?", (sid, now - self.SAMPLES_KEEP_S))

    def usage_add(self, month: str, dev: str, counter: int) -> int:
        """The month's bytes through `dev` after the kernel's counter read `counter` now. A counter
        below the last one was reset (a reboot, the device re-plugged): all of it is new."""
        row = self.db.execute("SELECT bytes, counter FROM data_usage WHERE month=? AND dev=?", (month, dev)).fetchone()
        if row is None:
            # The first look of the month: earlier bytes belong to last month (or to before the watch).
            last = self.db.execute(
                "SELECT counter FROM data_usage WHERE dev=? ORDER BY month DESC LIMIT 1", (dev,)
            ).fetchone()
            base = 0 if last is None or last[0] is None or counter < last[0] else counter - last[0]
            q = "INSERT INTO data_usage (month, dev, bytes, counter) VALUES (?,?,?,?)"
            self.db.execute(q, (month, dev, base, counter))
            return base
        total, before = row
        total += counter - before if before is not None and counter >= before else counter
        q = "UPDATE data_usage SET bytes=?, counter=? WHERE month=? AND dev=?"
        self.db.execute(q, (total, counter, month, dev))
        return total

    def usage_alerted(self, month: str, dev: str) -> float:
        row = self.db.execute("SELECT alerted FROM data_usage WHERE month=? AND dev=?", (month, dev)).fetchone()
        return row[0] if row else 0.0

    def usage_set_alerted(self, month: str, dev: str, level: float) -> None:
        self.db.execute("UPDATE data_usage SET alerted=? WHERE month=? AND dev=?", (level, month, dev))

    def samples(self, sid: str, since: float) -> list[tuple[float, float | None, float | None]]:
        rows = self.db.execute(
            "SELECT ts, battery_v, rtt_ms FROM samples WHERE sid=? AND ts>=? ORDER BY ts", (sid, since)
        )
        return [tuple(r) for r in rows]

    def set_state(self, body: dict[str, Any]) -> None:
        self.db.execute(
            "INSERT INTO sentinels (sid, boot, seq, state_ts, state, seen_ts) VALUES (?,?,?,?,?,?) "
            "ON CONFLICT(sid) DO UPDATE SET boot=excluded.boot, seq=excluded.seq, "
            "state_ts=excluded.state_ts, state=excluded.state, seen_ts=excluded.seen_ts",
            (body["sid"], body["boot"], body["seq"], body["ts"], json.dumps(body["data"]), time.time()),
        )
        self._sample(body["sid"], body["data"])

    def sentinel(self, sid: str) -> dict[str, Any] | None:
        # A journal from before seen_ts, opened read-only (so not migrated), reads it as NULL.
        seen = "seen_ts" if self._has_seen_ts() else "NULL"
        row = self.db.execute(
            f"SELECT status, status_ts, boot, seq, state_ts, state, {seen} FROM sentinels WHERE sid=?", (sid,)
        ).fetchone()
        if row is None:
            return None
        status, status_ts, boot, seq, state_ts, state, seen_ts = row
        return {
            "sid": sid,
            "status": status,
            "status_ts": status_ts,
            "boot": boot,
            "seq": seq,
            "state_ts": state_ts,
            "state": json.loads(state) if state else None,
            "seen_ts": seen_ts,  # when the bridge last received its state (the board's own ts may be null)
        }

    def events(
        self,
        sid: str | None = None,
        kind: str | None = None,
        limit: int = 100,
        before: int | None = None,
        after: int | None = None,
    ) -> list[Event]:
        """Newest first; `before`/`after` page by id."""
        q, args = "SELECT id, rx_ts, source, sid, boot, seq, kind, ms, ts, data FROM events WHERE 1=1", []
        if sid:
            q, args = q + " AND sid=?", [*args, sid]
        if kind:
            q, args = q + " AND kind=?", [*args, kind]
        if before is not None:
            q, args = q + " AND id<?", [*args, before]
        if after is not None:
            q, args = q + " AND id>?", [*args, after]
        rows = self.db.execute(q + " ORDER BY id DESC LIMIT ?", (*args, limit)).fetchall()
        return [Event(*r[:9], json.loads(r[9])) for r in rows]

    def rejections(self, reason: str | None = None) -> list[dict[str, Any]]:
        q, args = "SELECT rx_ts, source, topic, reason, detail FROM rejections", ()
        if reason:
            q, args = q + " WHERE reason=?", (reason,)
        cols = ("rx_ts", "source", "topic", "reason", "detail")
        return [dict(zip(cols, r, strict=True)) for r in self.db.execute(q + " ORDER BY id", args)]

    def hook_runs(self) -> list[dict[str, Any]]:
        cols = ("event_id", "hook", "started", "ended", "outcome", "returncode", "output")
        q = "SELECT event_id, hook, started, ended, outcome, returncode, output FROM hook_runs ORDER BY id"
        return [dict(zip(cols, r, strict=True)) for r in self.db.execute(q)]

    # --- emergency rescues (see rescue.py) ---------------------------------------------------------

    def rescue_open(self, event_id: int, sid: str, reason: str, deadline: float, critical: bool) -> int | None:
        """A new rescue for a triggering event; None if that event already started one."""
        try:
            cur = self.db.execute(
                "INSERT INTO rescues (event_id, sid, reason, started, deadline, critical, state) "
                "VALUES (?,?,?,?,?,?,'active')",
                (event_id, sid, reason, time.time(), deadline, int(critical)),
            )
        except sqlite3.IntegrityError:
            return None
        return cur.lastrowid

    def rescue_update(self, rescue_id: int, **fields: Any) -> None:
        allowed = {"deadline", "critical", "state", "finished", "reason"}
        cols = [k for k in fields if k in allowed]
        self.db.execute(
            f"UPDATE rescues SET {', '.join(f'{c}=?' for c in cols)} WHERE id=?",
            (*[fields[c] for c in cols], rescue_id),
        )

    def rescues(self, state: str | None = None) -> list[dict[str, Any]]:
        cols = ("id", "event_id", "sid", "reason", "started", "deadline", "critical", "state", "finished")
        q = f"SELECT {', '.join(cols)} FROM rescues"
        rows = self.db.execute(q + (" WHERE state=?" if state else "") + " ORDER BY id", (state,) if state else ())
        return [dict(zip(cols, r, strict=True)) for r in rows]

    def step(self, rescue_id: int, target: str, pid: int | None, action: str, **detail: Any) -> None:
        self.db.execute(
            "INSERT INTO rescue_steps (rescue_id, ts, target, pid, action, detail) VALUES (?,?,?,?,?,?)",
            (rescue_id, time.time(), target, pid, action, json.dumps(detail)),
        )

    def steps(self, rescue_id: int | None = None, target: str | None = None) -> list[dict[str, Any]]:
        q, args = "SELECT rescue_id, ts, target, pid, action, detail FROM rescue_steps WHERE 1=1", []
        if rescue_id is not None:
            q, args = q + " AND rescue_id=?", [*args, rescue_id]
        if target is not None:
            q, args = q + " AND target=?", [*args, target]
        cols = ("rescue_id", "ts", "target", "pid", "action", "detail")
        out = []
        for r in self.db.execute(q + " ORDER BY id", args):
            d = dict(zip(cols, r, strict=True))
            d["detail"] = json.loads(d["detail"])
            out.append(d)
        return out

    # --- the alert outbox: an alert stays here until its channel took it ---------------------------

    ALERT_COLS = ("id", "ts", "channel", "severity", "kind", "sid", "title", "body", "attempts", "next_try", "error")

    def alert_queue(self, channel: str, severity: str, kind: str, sid: str, title: str, body: str) -> int:
        now = time.time()
        cur = self.db.execute(
            "INSERT INTO alert_outbox (ts, channel, severity, kind, sid, title, body, next_try) "
            "VALUES (?,?,?,?,?,?,?,?)",
            (now, channel, severity, kind, sid, title, body, now),
        )
        return cur.lastrowid or 0

    def alerts_due(self, now: float) -> list[dict[str, Any]]:
        rows = self.db.execute(
            f"SELECT {', '.join(self.ALERT_COLS)} FROM alert_outbox WHERE sent IS NULL AND next_try <= ? ORDER BY id",
            (now,),
        )
        return [dict(zip(self.ALERT_COLS, r, strict=True)) for r in rows]

    def alerts_sent(self, ids: list[int], ts: float, sent_as: int) -> None:
        """Mark alerts delivered; several merged into one message share `sent_as` (the first's id)."""
        self.db.executemany(
            "UPDATE alert_outbox SET sent=?, sent_as=?, error=NULL WHERE id=?", [(ts, sent_as, i) for i in ids]
        )

    def alert_retry(self, ids: list[int], next_try: float, error: str) -> None:
        self.db.executemany(
            "UPDATE alert_outbox SET attempts=attempts+1, next_try=?, error=? WHERE id=?",
            [(next_try, error, i) for i in ids],
        )

    def alert_messages_since(self, channel: str, since: float) -> list[float]:
        """When each message went out on `channel` since `since` (merged alerts count once)."""
        rows = self.db.execute(
            "SELECT MIN(sent) FROM alert_outbox WHERE channel=? AND sent>=? GROUP BY sent_as ORDER BY 1",
            (channel, since),
        )
        return [r[0] for r in rows]

    def alerts(self, channel: str | None = None) -> list[dict[str, Any]]:
        q, args = f"SELECT {', '.join(self.ALERT_COLS)}, sent, sent_as FROM alert_outbox", ()
        if channel:
            q, args = q + " WHERE channel=?", (channel,)
        rows = self.db.execute(q + " ORDER BY id", args)
        return [dict(zip((*self.ALERT_COLS, "sent", "sent_as"), r, strict=True)) for r in rows]
