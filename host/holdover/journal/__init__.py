"""The bridge's SQLite journal: what every wing shares (accepted and rejected messages, hook
runs, each sentinel's status and last state), and the room for a wing's own tables.

The unique (sentinel, boot, seq) index on accepted events is also the replay guard, so
a restarted bridge still refuses an event it accepted before it stopped.

A wing keeps its own tables in a `Ledger` beside the code that writes them (the rescues in
node/rescue_ledger.py, the alert outbox in bridge/alert_outbox.py, data usage in node/datacap.py,
the state history in bridge/history.py); only this module and the ledgers speak SQL. The schema's
version is `PRAGMA user_version`; `MIGRATIONS` bring an older journal up to it once, at open.

A journal that cannot write (a full disk, a read-only mount, a file the bridge cannot open at
start) must never stop the bridge acting: acting on a verified mains loss matters more than
journaling it. So the bridge's journal is opened with `standin=True` (an unopenable file gives an
in-memory stand-in with the same schema, and the file is tried again), `take()` holds an event it
cannot write in memory (bounded: HELD_MAX, oldest dropped first; no receipt goes to the sentinel
for a held event, so its own outbox keeps it and sends it again), `host_event()` and `guard()`
never raise for a write that failed, and `recover()` journals what was held once the file takes
writes again. `broken` names the file and the cause meanwhile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import re
import sqlite3
import time
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

from holdover.errors import USAGE, HoldoverError
from holdover.journal.ledger import Ledger
from holdover.journal.schema import MIGRATIONS, ROUTINE_KINDS, SCHEMA, VERSION, Event, event, statements
from holdover.journal.unwritable import HELD_MAX, Held, cause, unusable

__all__ = [
    "HELD_MAX",
    "HOST_BOOT",
    "HOST_SOURCE",
    "MIGRATIONS",
    "ROUTINE_KINDS",
    "SCHEMA",
    "VERSION",
    "Event",
    "Journal",
    "JournalError",
    "Ledger",
]

log = logging.getLogger("holdover.journal")


class JournalError(HoldoverError):
    """A journal this holdover cannot use; the message names the file."""

    exit_code = USAGE


class NoJournalYet(JournalError):
    """The file is there but holds no journal (0 bytes, or none of holdover's tables): the bridge
    has not written it yet, or is making it this moment."""


HOST_BOOT = "host"  # the boot of events the bridge raises itself (sentinel_offline, ...)
HOST_SOURCE = "bridge"
PAYLOAD_KEEP = 1024  # bytes of a rejected payload kept as evidence


class Journal:
    """The journal; also usable as a context manager that closes the connection."""

    def __init__(self, path: Path | str, readonly: bool = False, standin: bool = False) -> None:
        self.path = Path(path)
        self.readonly = readonly
        self._ensured: dict[str, bool] = {}  # a ledger's DDL -> its tables are there
        self.broken: str | None = None  # what is wrong, naming the file, while it cannot write
        self.durable = True  # False while the connection is an in-memory stand-in for the file
        self.held = Held()  # events acted on but not journaled, while it cannot write
        try:
            self._open(str(path))
        except (sqlite3.Error, OSError) as e:
            with contextlib.suppress(Exception):
                self.db.close()
            if not standin:
                raise JournalError(unusable(self.path, e)) from None
            self.db = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
            self.db.executescript(SCHEMA)
            self.durable = False
            self._broke(unusable(self.path, e, writing=True))

    def _open(self, path: str) -> None:
        if self.readonly:
            # A reader (tests, status commands) never takes the write lock the bridge needs.
            self.db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, isolation_level=None)
        else:
            if path != ":memory:":
                self.path.parent.mkdir(parents=True, exist_ok=True)
            # Used by one thread at a time (the bridge loop), but not always the one that opened it.
            self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA busy_timeout=5000")
        # sqlite opens lazily: read the schema now, so a file that is not a journal is found here.
        self.db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        # Before anything is changed (the switch to WAL rewrites the file's header), and for
        # readers too: a newer schema is refused by name, never misread or half taken over.
        self._refuse_newer()
        if self.readonly:
            if not self._has_table("events"):  # an empty file, or one a bridge is making this moment
                raise NoJournalYet(
                    f"{self.path} holds no journal yet (an empty file or database): "
                    "has the bridge run with this config?"
                )
            return
        self.db.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode survives a process crash; a power cut may lose the last few
        # commits, which the sentinel would re-send anyway (its queue waits for PUBACK).
        self.db.execute("PRAGMA synchronous=NORMAL")
        self._migrate()

    @property
    def version(self) -> int:
        return self.db.execute("PRAGMA user_version").fetchone()[0]

    def _refuse_newer(self) -> None:
        have = self.version
        if have > VERSION:
            raise JournalError(
                f"{self.path} is a journal of schema version {have}, newer than this holdover's ({VERSION}): "
                "upgrade holdover, or point [journal] path at another file"
            )

    def _migrate(self) -> None:
        """Bring the journal up to VERSION once: a bridge upgrade keeps the history it had."""
        have = self.version
        if have == VERSION:
            return
        with self.db:  # all or nothing: a journal is never left half migrated
            self.db.execute("BEGIN IMMEDIATE")
            for statement in statements(SCHEMA):
                self.db.execute(statement)
            for version, step in MIGRATIONS:
                if have < version:
                    step(self.db)
            self.db.execute(f"PRAGMA user_version={VERSION}")

    def _has_table(self, name: str) -> bool:
        return (
            self.db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (name,)).fetchone() is not None
        )

    def _has_seen_ts(self) -> bool:
        return any(r[1] == "seen_ts" for r in self.db.execute("PRAGMA table_info(sentinels)"))

    def ensure(self, ddl: str, added: tuple[tuple[str, str, str], ...] = ()) -> bool:
        """A wing's own tables, made if missing (CREATE ... IF NOT EXISTS), with the columns
        `added` since (table, column, type). On a read-only journal nothing is made; False then
        says they are not there (a bridge that never used them)."""
        # Once per journal: a ledger made for each API request must not run its DDL each time.
        if ddl not in self._ensured:
            if not self.readonly:
                for statement in statements(ddl):
                    self.db.execute(statement)
                for table, column, kind in added:
                    if column not in {r[1] for r in self.db.execute(f"PRAGMA table_info({table})")}:
                        self.db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
                self._ensured[ddl] = True
            else:
                tables = re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", ddl)
                self._ensured[ddl] = all(self._has_table(t) for t in tables)
        return self._ensured[ddl]

    def ping(self) -> None:
        """Raises sqlite3.Error if the journal cannot answer (the health check)."""
        self.db.execute("SELECT 1").fetchone()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.db.close()

    def accept(self, source: str, body: dict[str, Any]) -> Event | None:
        """Record an accepted event; None if (sid, boot, seq) was already journaled, or is a
        heartbeat at or below what prune_routine() removed (its replay guard is the watermark)."""
        rx = time.time()
        e = event(0, rx, source, body)
        if e.kind in ROUTINE_KINDS:
            row = self.db.execute("SELECT below_seq FROM pruned WHERE sid=? AND boot=?", (e.sid, e.boot)).fetchone()
            if row is not None and e.seq <= row[0]:
                return None
        try:
            cur = self.db.execute(
                "INSERT INTO events (rx_ts, source, sid, boot, seq, kind, ms, ts, data) VALUES (?,?,?,?,?,?,?,?,?)",
                (rx, source, e.sid, e.boot, e.seq, e.kind, e.ms, e.ts, json.dumps(e.data)),
            )
        except sqlite3.IntegrityError:
            return None
        return dataclasses.replace(e, id=cur.lastrowid or 0)

    def prune_routine(self, before: float) -> tuple[int, int]:
        """Heartbeats and refused messages received before `before` (epoch s) deleted: (events,
        rejections). A heartbeat's row was its replay guard, so the highest seq removed per
        (sentinel, boot) is kept, and accept() refuses a heartbeat at or below it. Nothing else is
        pruned: outages, rescues and their steps are what the journal is for, and are few."""
        marks = ",".join("?" * len(ROUTINE_KINDS))
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            self.db.execute(
                "INSERT INTO pruned (sid, boot, below_seq) "
                f"SELECT sid, boot, MAX(seq) FROM events WHERE kind IN ({marks}) AND rx_ts < ? GROUP BY sid, boot "
                "ON CONFLICT (sid, boot) DO UPDATE SET below_seq = MAX(below_seq, excluded.below_seq)",
                (*ROUTINE_KINDS, before),
            )
            self.db.execute(
                "DELETE FROM hook_runs WHERE event_id IN "
                f"(SELECT id FROM events WHERE kind IN ({marks}) AND rx_ts < ?)",
                (*ROUTINE_KINDS, before),
            )
            events = self.db.execute(
                f"DELETE FROM events WHERE kind IN ({marks}) AND rx_ts < ?", (*ROUTINE_KINDS, before)
            ).rowcount
            rejections = self.db.execute("DELETE FROM rejections WHERE rx_ts < ?", (before,)).rowcount
        return events, rejections

    def host_event(self, sid: str, kind: str, data: dict[str, Any]) -> Event:
        """Journal an event the bridge itself raises about a sentinel (its own numbering, boot HOST_BOOT).
        When the journal cannot write, the event is held and returned all the same: it is acted on."""
        body = {"sid": sid, "boot": HOST_BOOT, "seq": 0, "kind": kind, "ms": 0, "ts": int(time.time()), "data": data}
        if self.durable and self.broken is None:
            try:
                return self._host_insert(body)
            except (sqlite3.Error, OSError) as e:
                self.failed(f"journaling {kind}", e)
        body["seq"] = self.held.next_host_seq()
        return self.held.hold(HOST_SOURCE, body)

    def _host_insert(self, body: dict[str, Any]) -> Event:
        (last,) = self.db.execute(
            "SELECT COALESCE(MAX(seq), 0) FROM events WHERE sid=? AND boot=?", (body["sid"], HOST_BOOT)
        ).fetchone()
        event = self.accept(HOST_SOURCE, {**body, "seq": last + 1})
        assert event is not None  # one writer per journal: the next number is free
        return event

    # --- a journal that cannot write ------------------------------------------------------------

    def take(self, source: str, body: dict[str, Any], hold: bool = True) -> tuple[Event | None, bool]:
        """`accept`, or hold the event in memory when the journal cannot write: (the event, or None
        if it was had before; whether it is journaled). A held event is acted on but not receipted.
        `hold=False` (telemetry nobody sends again): not kept while the journal cannot write."""
        if (body["sid"], body["boot"], body["seq"]) in self.held:
            return None, False
        if self.durable and self.broken is None:
            try:
                return self.accept(source, body), True
            except (sqlite3.Error, OSError) as e:
                self.failed(f"journaling {body['kind']} from {body['sid']}", e)
        return (self.held.hold(source, body) if hold else self.held.unjournaled(source, body)), False

    @property
    def dropped(self) -> int:
        """Held events dropped to stay within HELD_MAX (their sentinels still have them)."""
        return self.held.dropped

    def failed(self, doing: str, e: BaseException) -> None:
        """A write that did not happen: the journal is broken until `recover()` succeeds."""
        self._broke(f"journal {self.path}: {doing} failed: {cause(e)}")

    def _broke(self, why: str) -> None:
        if self.broken is None:
            log.critical("%s; holding events in memory, acting on them, retrying", why)
        self.broken = why

    @contextlib.contextmanager
    def guard(self, doing: str) -> Iterator[None]:
        """Around a write that must not stop the caller (a status, a hook's record): a failure is
        noted in `broken` and the caller goes on."""
        try:
            yield
        except (sqlite3.Error, OSError) as e:
            if isinstance(e, sqlite3.IntegrityError):
                raise
            self.failed(doing, e)

    def recover(self) -> int | None:
        """Try the file again and journal what was held, in order, in one transaction: how many were
        journaled, or None while it still cannot write (`broken` says why)."""
        if self.broken is None:
            return 0
        if not self.durable:
            standin = self.db
            try:
                self._open(str(self.path))
            except (sqlite3.Error, OSError) as e:
                if self.db is not standin:
                    with contextlib.suppress(Exception):
                        self.db.close()
                self.db = standin
                self.broken = unusable(self.path, e, writing=True)
                return None
            standin.close()
            self.durable = True
            self._ensured.clear()  # the ledgers' tables, made again in the file on their next use
        try:
            with self.db:
                self.db.execute("BEGIN IMMEDIATE")
                for source, body in self.held.bodies():
                    if body["boot"] == HOST_BOOT:
                        self._host_insert(body)
                    else:
                        self.accept(source, body)
        except (sqlite3.Error, OSError) as e:
            self.broken = f"journal {self.path}: still cannot write: {cause(e)}"
            return None
        n = self.held.journaled()
        self.broken = None
        log.warning("journal %s writable again: %d held event(s) journaled", self.path, n)
        return n

    def later(self, sid: str, boot: str, seq: int, kinds: Collection[str]) -> int | None:
        """The newest seq of an event of `kinds` the sentinel raised after `seq` in the same boot
        that is journaled (or held) already, or None."""
        marks = ",".join("?" * len(kinds))
        row = self.db.execute(
            f"SELECT MAX(seq) FROM events WHERE sid=? AND boot=? AND seq>? AND kind IN ({marks})",
            (sid, boot, seq, *kinds),
        ).fetchone()
        return max((x for x in (row[0], *self.held.later(sid, boot, seq, kinds)) if x is not None), default=None)

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

    def set_state(self, body: dict[str, Any]) -> None:
        self.db.execute(
            "INSERT INTO sentinels (sid, boot, seq, state_ts, state, seen_ts) VALUES (?,?,?,?,?,?) "
            "ON CONFLICT(sid) DO UPDATE SET boot=excluded.boot, seq=excluded.seq, "
            "state_ts=excluded.state_ts, state=excluded.state, seen_ts=excluded.seen_ts",
            (body["sid"], body["boot"], body["seq"], body["ts"], json.dumps(body["data"]), time.time()),
        )

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

    def sentinel_ids(self) -> list[str]:
        """Every sentinel the journal has a status or a state of."""
        return [r[0] for r in self.db.execute("SELECT sid FROM sentinels ORDER BY sid")]

    def event_counts(self) -> list[tuple[str, str, int]]:
        """(sentinel, kind, how many) over the whole journal."""
        return [tuple(r) for r in self.db.execute("SELECT sid, kind, COUNT(*) FROM events GROUP BY sid, kind")]

    def rejection_counts(self) -> dict[str, int]:
        return dict(self.db.execute("SELECT reason, COUNT(*) FROM rejections GROUP BY reason").fetchall())

    def events(
        self,
        sid: str | None = None,
        kind: str | None = None,
        limit: int = 100,
        before: int | None = None,
        after: int | None = None,
        exclude: Collection[str] = (),
        kinds: Collection[str] = (),
        since: float | None = None,
    ) -> list[Event]:
        """Newest first; `before`/`after` page by id; `exclude`: kinds left out; `kinds`: only
        these; `since`: only those received at or after it (epoch s)."""
        q, args = "SELECT id, rx_ts, source, sid, boot, seq, kind, ms, ts, data FROM events WHERE 1=1", []
        if sid:
            q, args = q + " AND sid=?", [*args, sid]
        if kind:
            q, args = q + " AND kind=?", [*args, kind]
        if exclude:
            q, args = q + f" AND kind NOT IN ({','.join('?' * len(exclude))})", [*args, *exclude]
        if kinds:
            q, args = q + f" AND kind IN ({','.join('?' * len(kinds))})", [*args, *kinds]
        if since is not None:
            q, args = q + " AND rx_ts >= ?", [*args, since]
        if before is not None:
            q, args = q + " AND id<?", [*args, before]
        if after is not None:
            q, args = q + " AND id>?", [*args, after]
        rows = self.db.execute(q + " ORDER BY id DESC LIMIT ?", (*args, limit)).fetchall()
        return [Event(*r[:9], json.loads(r[9])) for r in rows]

    def count(self, kinds: Collection[str], sid: str | None = None, from_id: int = 0, to_id: int | None = None) -> int:
        """How many events of these kinds there are with ids in [from_id, to_id)."""
        q = f"SELECT COUNT(*) FROM events WHERE kind IN ({','.join('?' * len(kinds))}) AND id >= ?"
        args: list[Any] = [*kinds, from_id]
        if to_id is not None:
            q, args = q + " AND id < ?", [*args, to_id]
        if sid:
            q, args = q + " AND sid=?", [*args, sid]
        return int(self.db.execute(q, args).fetchone()[0])

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
