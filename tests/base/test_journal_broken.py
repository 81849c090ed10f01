"""The bridge on a journal it cannot write: a full disk mid-outage, a journal it cannot open at start.

Acting on a verified mains loss matters more than journaling it: the bridge stays up, runs the
hooks and the rescue, says so to people without needing the journal, receipts nothing it could
not journal (so the board keeps it), and journals what it held once the disk takes writes again.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from pathlib import Path

import httpx
import tomli_w

from holdover.journal import HOST_BOOT, Journal
from holdover.lab.broker import free_port
from support import HOLDOVER, KEY, Ntfy, small_tmpfs, wait_for


def _fill(mnt: Path) -> Path:
    """Fill the filesystem to the last byte, as a checkpoint or a log would."""
    filler = mnt / "filler"
    with filler.open("wb", buffering=0) as f:
        for chunk in (65536, 4096, 1):  # to the last byte
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError:
                pass
    return filler


def _kinds(path: Path, boot: str | None = None) -> list[str]:
    with Journal(path, readonly=True) as j:
        return [e.kind for e in reversed(j.events(limit=500)) if boot is None or e.boot == boot]


def test_a_full_disk_mid_outage_still_runs_the_hooks_and_the_rescue_and_loses_nothing(
    rig_factory, tmp_path: Path, caplog
) -> None:
    ran = tmp_path / "ran"
    ntfy = Ntfy().start()
    caplog.set_level(logging.INFO, logger="holdover")
    with small_tmpfs(tmp_path / "small", "size=2m") as mnt:
        journal = mnt / "journal.db"
        rig = rig_factory(
            hooks=[{"events": ["mains_lost"], "run": f"echo $HOLDOVER_EVENT >> {ran}"}],
            protect={"registry": str(tmp_path / "registry"), "grace": 0},
            bridge_extra={
                "journal": {"path": str(journal)},
                "alerts": {"channels": [{"name": "phone", "url": ntfy.url("phone"), "min_severity": "warning"}]},
            },
        )
        try:
            rig.wait("boot", 15)
            filler = _fill(mnt)
            bridge = rig.bridge.bridge
            rig.control.send(mains=False)
            wait_for(lambda: ran.exists(), 15, "the mains_lost hook, on a full disk")
            wait_for(lambda: "emergency checkpoint of every run" in caplog.text, 10, "the rescue")
            assert bridge.journal.broken and str(journal) in bridge.journal.broken
            assert "database or disk is full" in bridge.journal.broken
            titles = lambda: [m["title"] for m in ntfy.got]  # noqa: E731
            wait_for(lambda: len(titles()) >= 2, 15, "the alerts, sent without the journal")
            assert "Mains power lost at demo" in titles()
            assert any(t.startswith("The bridge's journal cannot be written: journal ") for t in titles())
            # No receipt for what was not journaled: the board keeps sending it, and each copy is a
            # duplicate of the held one, not a second hook run.
            wait_for(lambda: bridge.view(rig.sid).duplicates >= 1, 20, "the board sending it again")
            assert rig.bridge.thread.is_alive()
            assert "bridge is down" not in bridge.summary() and "JOURNAL BROKEN" in bridge.summary()

            filler.unlink()  # space again: the held events are journaled, the board gets its receipt
            wait_for(lambda: bridge.journal.broken is None, 10, "the journal to recover")
            kinds = _kinds(journal)
            assert kinds.count("mains_lost") == 1
            host = _kinds(journal, HOST_BOOT)
            assert host.index("journal_broken") < host.index("journal_restored")
            wait_for(lambda: any("writable again" in t for t in titles()), 10, "the all-clear")
        finally:
            rig.close()
            ntfy.stop()
    assert ran.read_text().split() == ["mains_lost"]  # once, for all the copies the board sent
    assert "Traceback" not in caplog.text


def test_a_journal_it_cannot_open_at_start_is_503_named_and_retried(tmp_path: Path) -> None:
    journal = tmp_path / "journal.db"
    journal.mkdir()  # where the file should be, a directory: it cannot be opened
    port = free_port()
    cfg = tmp_path / "holdover.toml"
    cfg.write_text(
        tomli_w.dumps(
            {
                "mqtt": {"port": free_port()},
                "journal": {"path": str(journal)},
                "web": {"port": port},
                "sentinels": [{"id": "rack1", "key": KEY}],
            },
        )
    )
    log = (tmp_path / "bridge.log").open("w")
    p = subprocess.Popen([HOLDOVER, "bridge", "-c", str(cfg)], stdout=log, stderr=log)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as c:

            def health() -> httpx.Response | None:
                try:
                    return c.get("/healthz")
                except httpx.TransportError:
                    return None

            wait_for(lambda: health() is not None, 15, "the bridge's API, up without its journal")
            r = health()
            assert r is not None
            assert r.status_code == 503
            said = r.json()["journal"]
            assert said.startswith(f"error: journal {journal} is a directory, not a journal file")
            assert "(Is a directory (EISDIR))" in said or "unable to open" in said, said
            text = (tmp_path / "bridge.log").read_text()
            assert f"CRITICAL holdover.journal: journal {journal} is a directory" in text
            assert p.poll() is None  # up: it still acts on what it hears

            journal.rmdir()  # fixed: the bridge makes its journal by itself within a few seconds
            wait_for(lambda: (h := health()) is not None and h.status_code == 200, 10, "the journal opened")
        assert "journal_broken" in _kinds(journal, HOST_BOOT)
        assert "journal_restored" in _kinds(journal, HOST_BOOT)
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(10)
    assert "Traceback" not in (tmp_path / "bridge.log").read_text()
    assert os.path.isfile(journal)
