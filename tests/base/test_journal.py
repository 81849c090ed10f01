"""The journal's schema version and migrations: a journal written before schema versions (kept as
a SQL dump in tests/fixtures) opens, is brought up to VERSION once, and every row it held reads
back through the journal and the wings' ledgers; and a journal that cannot write holds what it
takes, then journals it when it can."""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path

import pytest

from holdover.bridge.alert_outbox import AlertOutbox
from holdover.bridge.history import History, UpsHistory
from holdover.journal import VERSION, Journal, JournalError
from holdover.node.datacap import DataUsage
from holdover.node.rescue_ledger import RescueLedger
from support import HOLDOVER, KEY

FIXTURE = Path(__file__).parents[1] / "fixtures" / "journal-b674fac.sql"


def _old_journal(path: Path, drop_seen_ts: bool = False) -> Path:
    db = sqlite3.connect(path)
    db.executescript(FIXTURE.read_text())
    if drop_seen_ts:  # the journals older still, before the column existed
        db.executescript("ALTER TABLE sentinels DROP COLUMN seen_ts;")
    assert db.execute("PRAGMA user_version").fetchone()[0] == 0
    db.close()
    return path


def _history(s: dict) -> list[tuple]:
    return list(zip(s["battery_v"], s["rtt_ms"], s["battery_pct"], s["loss_pct"], strict=True))


def _every_row(j: Journal) -> dict[str, object]:
    return {
        "events": [(e.sid, e.boot, e.seq, e.kind, e.source, e.data) for e in reversed(j.events())],
        "rejections": [(r["source"], r["topic"], r["reason"]) for r in j.rejections()],
        "hook_runs": [(h["hook"], h["outcome"], h["returncode"], h["output"]) for h in j.hook_runs()],
        "sentinels": j.sentinel_ids(),
        "rack1": {k: v for k, v in (j.sentinel("rack1") or {}).items() if k not in ("status_ts", "seen_ts")},
        "rescues": [(r["sid"], r["reason"], r["state"], r["finished"]) for r in RescueLedger(j).rescues()],
        "steps": [(s["target"], s["pid"], s["action"], s["detail"]) for s in RescueLedger(j).steps()],
        "alerts": [(a["channel"], a["kind"], a["sent"], a["attempts"], a["error"]) for a in AlertOutbox(j).alerts()],
        "usage": (DataUsage(j).alerted("2026-12", "wwan0"),),
        "history": _history(History(j).series("rack1", hours=20 * 365 * 24)),
    }


WANT = {
    "events": [
        ("rack1", "b1", 1, "mains_lost", "mqtt", {"runtime_s": 600}),
        ("rack1", "b1", 2, "mains_back", "serial", {"lost_ms": 7800}),
        ("node", "host", 1, "failover", "bridge", {"uplink": "lte", "uplinks": ["wan", "lte"]}),
    ],
    "rejections": [("mqtt", "holdover/rack1/event", "bad_signature"), ("serial", None, "garbled")],
    "hook_runs": [("on_mains_lost", "ok", 0, "hook said hi")],
    "sentinels": ["rack1"],
    "rack1": {
        "sid": "rack1",
        "status": "online",
        "boot": "b1",
        "seq": 3,
        "state_ts": 1764800010,
        "state": {
            "mains": False,
            "battery_v": 3.9,
            "battery_pct": 80,
            "targets": [{"rtt_ms": 12.5}, {"rtt_ms": 9.0}],
        },
    },
    "rescues": [("rack1", "mains_lost", "finished", 1764800020.0)],
    "steps": [
        ("*", None, "targets", {"names": ["run1"], "problems": []}),
        ("run1", 4242, "verified", {"dir": "/ck/step_000000010", "bytes": 1000, "seconds": 0.5, "step": 10}),
    ],
    "alerts": [("phone", "mains_lost", 1764800001.0, 0, None), ("phone", "mains_back", None, 1, "HTTP 503")],
    "usage": (0.8,),
    "history": [(3.9, 9.0, None, None)],
}


def test_a_journal_from_before_schema_versions_reads_every_row_read_only(tmp_path: Path) -> None:
    path = _old_journal(tmp_path / "old.db")
    with Journal(path, readonly=True) as j:
        assert j.version == 0  # a reader never migrates (it holds no write lock)
        assert _every_row(j) == WANT


@pytest.mark.parametrize("drop_seen_ts", [False, True], ids=["b674fac", "before-seen_ts"])
def test_a_journal_from_before_schema_versions_is_migrated_once_and_keeps_every_row(
    tmp_path: Path, drop_seen_ts: bool
) -> None:
    path = _old_journal(tmp_path / "old.db", drop_seen_ts)
    with Journal(path) as j:
        assert j.version == VERSION
        assert _every_row(j) == WANT
        # and it goes on being written: the replay guard still holds across the migration
        assert (
            j.accept("mqtt", {"sid": "rack1", "boot": "b1", "seq": 2, "kind": "x", "ms": 0, "ts": 0, "data": {}})
            is None
        )
    with Journal(path) as j:  # a second open finds nothing to do
        assert j.version == VERSION
        assert len(j.events()) == 3


def test_a_journal_from_a_newer_holdover_is_refused_by_name_and_left_as_it_was(tmp_path: Path) -> None:
    """By the bridge and by every command that reads it (docs/operations.md: "refused by name rather
    than misread"), before anything touches the file: a rollback-mode journal stays one."""
    path = tmp_path / "new.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, kind TEXT)")
    db.execute("INSERT INTO events (kind) VALUES ('from the future')")
    db.execute(f"PRAGMA user_version={VERSION + 1}")
    db.commit()
    db.close()
    before = path.read_bytes()
    for readonly in (False, True):
        with pytest.raises(JournalError, match=f"{path}.*newer than this holdover"):
            Journal(path, readonly=readonly)
    assert path.read_bytes() == before and not path.with_name("new.db-wal").exists()

    cfg = tmp_path / "h.toml"
    cfg.write_text(f'[journal]\npath = "{path}"\n[[sentinels]]\nid = "rack1"\nkey = "{KEY}"\n')
    for argv in (["events", "--json"], ["outages"], ["status"], ["get", "rack1"]):
        r = subprocess.run([HOLDOVER, *argv, "-c", str(cfg)], capture_output=True, text=True, timeout=30)
        assert r.returncode != 0 and "newer than this holdover" in r.stderr, (argv, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr
    assert path.read_bytes() == before


def test_a_ledger_on_a_read_only_journal_without_its_tables_reads_as_empty(tmp_path: Path) -> None:
    Journal(tmp_path / "j.db").close()  # the base tables only: no wing ever used it
    with Journal(tmp_path / "j.db", readonly=True) as j:
        assert RescueLedger(j).steps() == [] and RescueLedger(j).rescues() == []
        assert AlertOutbox(j).alerts() == [] and AlertOutbox(j).unsent() == {}
        assert History(j).series("x", 6)["t"] == [] and UpsHistory(j).series("ups", 6)["t"] == []
        assert DataUsage(j).alerted("2026-12", "wwan0") == 0.0


def test_a_journal_that_cannot_write_holds_events_acts_once_and_journals_them_when_it_can(tmp_path: Path) -> None:
    def body(seq: int, kind: str = "mains_lost") -> dict:
        return {"sid": "rack1", "boot": "b1", "seq": seq, "kind": kind, "ms": seq, "ts": None, "data": {}}

    with Journal(tmp_path / "j.db") as j:
        j.db.execute("PRAGMA query_only=1")  # every write now fails, as on a read-only mount
        event, journaled = j.take("mqtt", body(1))
        assert event is not None and event.id < 0 and not journaled
        assert j.broken is not None and "read-only (SQLITE_READONLY)" in j.broken
        assert str(tmp_path / "j.db") in j.broken
        assert j.take("serial", body(1)) == (None, False)  # the same event again: had, not acted on twice
        beat, _ = j.take("mqtt", body(2, "heartbeat"), hold=False)
        assert beat is not None and len(j.held) == 1  # telemetry is not kept
        host = j.host_event("node", "journal_broken", {"detail": j.broken})
        assert host.id < 0 and len(j.held) == 2
        with j.guard("a status"):
            j.set_status("rack1", "online")  # noted, not raised
        assert j.recover() is None and j.broken is not None  # still cannot write

        j.db.execute("PRAGMA query_only=0")
        assert j.recover() == 2 and j.broken is None and not j.held
        assert [(e.kind, e.seq) for e in reversed(j.events())] == [("mains_lost", 1), ("journal_broken", 1)]
        assert j.accept("mqtt", body(1)) is None  # the board's resend is now a duplicate: receipted


def _hb(j: Journal, seq: int, kind: str = "heartbeat", boot: str = "b1", at: float | None = None):
    ev = j.accept("mqtt", {"sid": "rack1", "boot": boot, "seq": seq, "kind": kind, "ms": 0, "ts": None, "data": {}})
    if ev is not None and at is not None:
        j.db.execute("UPDATE events SET rx_ts=? WHERE id=?", (at, ev.id))
    return ev


def test_retention_deletes_old_heartbeats_and_refusals_keeps_outages_and_still_refuses_their_replay(
    tmp_path: Path,
) -> None:
    import time

    from holdover.bridge.service import Bridge
    from holdover.settings import Settings

    old, new = time.time() - 10 * 86400, time.time()
    with Journal(tmp_path / "j.db") as j:
        assert _hb(j, 1, at=old) and _hb(j, 2, "mains_lost", at=old) and _hb(j, 3, at=old) and _hb(j, 4, at=new)
        _hb(j, 1, boot="b0", at=old)  # an earlier boot's
        j.reject("mqtt", "holdover/rack1/event", "bad_signature", "seq 9", b"x")
        j.db.execute("UPDATE rejections SET rx_ts=?", (old,))
        j.reject("mqtt", "holdover/rack1/event", "bad_signature", "seq 10", b"y")
    cfg = Settings.model_validate({"journal": {"path": str(tmp_path / "j.db"), "keep_routine_days": 7}})
    bridge = Bridge(cfg)
    bridge.prune()  # what the running bridge does every hour
    j = bridge.journal
    kept = [(e.boot, e.seq, e.kind) for e in reversed(j.events())]
    assert kept == [("b1", 2, "mains_lost"), ("b1", 4, "heartbeat")]  # the outage stays
    assert [r["detail"] for r in j.rejections()] == ["seq 10"]
    # A pruned heartbeat's row was its replay guard: the watermark still refuses it.
    assert _hb(j, 3) is None and _hb(j, 1) is None and _hb(j, 1, boot="b0") is None
    assert _hb(j, 5) is not None  # the next one is taken
    # An event that is not routine, never seen, below the watermark (a late resend): taken.
    assert _hb(j, 0, "mains_restored") is not None
    assert j.prune_routine(time.time() - 7 * 86400) == (0, 0)  # idempotent
    j.close()
    with Journal(tmp_path / "j.db") as again:  # the watermark is in the file, for the next bridge
        assert _hb(again, 3) is None and again.version == VERSION
