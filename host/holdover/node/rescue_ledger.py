"""The rescues' own tables in the journal: each emergency (one per triggering event) and every
step taken for each run in it. node/rescue.py writes them; the dashboard, `holdover status` and
the demo read them."""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

from holdover.journal import Ledger

RESCUE_COLS = ("id", "event_id", "sid", "reason", "started", "deadline", "critical", "state", "finished")
STEP_COLS = ("rescue_id", "ts", "target", "pid", "action", "detail")


class RescueLedger(Ledger):
    DDL = """
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
    """

    unjournaled = 0  # rescues opened while the journal could not write: ids -1, -2, ...

    def open(self, event_id: int, sid: str, reason: str, deadline: float, critical: bool) -> int | None:
        """A new rescue for a triggering event; None if that event already started one. A journal
        that cannot write gets the rescue a negative id: it runs all the same, its steps logged."""
        try:
            cur = self.db.execute(
                "INSERT INTO rescues (event_id, sid, reason, started, deadline, critical, state) "
                "VALUES (?,?,?,?,?,?,'active')",
                (event_id, sid, reason, time.time(), deadline, int(critical)),
            )
        except sqlite3.IntegrityError:
            return None
        except (sqlite3.Error, OSError) as e:
            self.journal.failed(f"opening the rescue for {reason}", e)
            RescueLedger.unjournaled += 1
            return -RescueLedger.unjournaled
        return cur.lastrowid

    def update(self, rescue_id: int, **fields: Any) -> None:
        allowed = {"deadline", "critical", "state", "finished", "reason"}
        cols = [k for k in fields if k in allowed]
        with self.journal.guard(f"rescue {rescue_id}"):
            self.db.execute(
                f"UPDATE rescues SET {', '.join(f'{c}=?' for c in cols)} WHERE id=?",
                (*[fields[c] for c in cols], rescue_id),
            )

    def rescues(self, state: str | None = None) -> list[dict[str, Any]]:
        if not self.present:
            return []
        q = f"SELECT {', '.join(RESCUE_COLS)} FROM rescues"
        rows = self.db.execute(q + (" WHERE state=?" if state else "") + " ORDER BY id", (state,) if state else ())
        return [dict(zip(RESCUE_COLS, r, strict=True)) for r in rows]

    def step(self, rescue_id: int, target: str, pid: int | None, action: str, **detail: Any) -> None:
        with self.journal.guard(f"rescue {rescue_id}: {action} of {target}"):
            self.db.execute(
                "INSERT INTO rescue_steps (rescue_id, ts, target, pid, action, detail) VALUES (?,?,?,?,?,?)",
                (rescue_id, time.time(), target, pid, action, json.dumps(detail)),
            )

    def steps(self, rescue_id: int | None = None, target: str | None = None) -> list[dict[str, Any]]:
        if not self.present:
            return []
        q, args = f"SELECT {', '.join(STEP_COLS)} FROM rescue_steps WHERE 1=1", []
        if rescue_id is not None:
            q, args = q + " AND rescue_id=?", [*args, rescue_id]
        if target is not None:
            q, args = q + " AND target=?", [*args, target]
        out = []
        for r in self.db.execute(q + " ORDER BY id", args):
            d = dict(zip(STEP_COLS, r, strict=True))
            d["detail"] = json.loads(d["detail"])
            out.append(d)
        return out
