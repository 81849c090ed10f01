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
            assert "the disk is full (SQLITE_FULL)" in bridge.journal.broken, bridge.journal.broken
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


class Started:
    """`holdover bridge` on a config with `journal`, its API's health, and its log."""

    def __init__(self, tmp_path: Path, journal: Path) -> None:
        self.port = free_port()
        cfg = tmp_path / "holdover.toml"
        cfg.write_text(
            tomli_w.dumps(
                {
                    "mqtt": {"port": free_port()},
                    "journal": {"path": str(journal)},
                    "web": {"port": self.port},
                    "sentinels": [{"id": "rack1", "key": KEY}],
                },
            )
        )
        self.log = tmp_path / "bridge.log"
        with self.log.open("w") as out:
            self.p = subprocess.Popen([HOLDOVER, "bridge", "-c", str(cfg)], stdout=out, stderr=out)
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=5)

    def health(self) -> httpx.Response | None:
        try:
            return self.client.get("/healthz")
        except httpx.TransportError:
            return None

    def broken(self) -> str:
        """What /healthz says of the journal, once the API is up without it (503)."""
        wait_for(lambda: self.health() is not None, 15, "the bridge's API, up without its journal")
        r = self.health()
        assert r is not None and r.status_code == 503, r
        assert self.p.poll() is None  # up: it still acts on what it hears
        return r.json()["journal"]

    def healed(self) -> None:
        wait_for(lambda: (h := self.health()) is not None and h.status_code == 200, 10, "the journal opened")

    def stop(self) -> str:
        self.client.close()
        self.p.send_signal(signal.SIGTERM)
        self.p.wait(10)
        text = self.log.read_text()
        assert "Traceback" not in text
        return text


def test_a_journal_it_cannot_open_at_start_is_503_named_and_retried(tmp_path: Path) -> None:
    journal = tmp_path / "journal.db"
    journal.mkdir()  # where the file should be, a directory: it cannot be opened
    bridge = Started(tmp_path, journal)
    try:
        said = bridge.broken()
        assert said.startswith(f"error: journal {journal} is a directory, not a journal file"), said
        text = bridge.log.read_text()
        assert f"CRITICAL holdover.journal: journal {journal} is a directory" in text
        journal.rmdir()  # fixed: the bridge makes its journal by itself within a few seconds
        bridge.healed()
        assert "journal_broken" in _kinds(journal, HOST_BOOT)
        assert "journal_restored" in _kinds(journal, HOST_BOOT)
    finally:
        bridge.stop()
    assert os.path.isfile(journal)


def test_a_read_only_file_system_is_named_in_words_and_the_journal_opens_once_it_is_writable(
    tmp_path: Path,
) -> None:
    # SQLite says "unable to open database file (SQLITE_CANTOPEN)" for every reason; the bridge said
    # "does not exist (has the bridge run with this config?)" on a read-only file system.
    with small_tmpfs(tmp_path / "ro", "size=4m") as mnt:
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        journal = mnt / "holdover" / "journal.db"
        bridge = Started(tmp_path, journal)
        try:
            said = bridge.broken()
            assert said == (
                f"error: journal {journal} cannot be written: the file system is read-only (EROFS); "
                "fix that or [journal] path in the config"
            ), said
            subprocess.run(["mount", "-o", "remount,rw", str(mnt)], check=True)
            bridge.healed()
            assert _kinds(journal, HOST_BOOT)[:2] == ["journal_broken", "journal_restored"]
        finally:
            text = bridge.stop()
        assert "the file system is read-only (EROFS)" in text and "SQLITE_CANTOPEN" not in text, text
        assert "writable again" in text


def test_the_oses_reasons_a_journal_cannot_be_written_are_said_in_words(tmp_path: Path) -> None:
    import errno

    from holdover.journal.unwritable import in_words, why_not_writable

    said = {n: in_words(OSError(n, os.strerror(n))) for n in (errno.EROFS, errno.EACCES, errno.ENOSPC, errno.ENOENT)}
    assert said == {
        errno.EROFS: "the file system is read-only (EROFS)",
        errno.EACCES: "permission denied (EACCES)",
        errno.ENOSPC: "the disk is full (ENOSPC)",
        errno.ENOENT: "no such directory (ENOENT)",
    }
    # The probe does what SQLite would and leaves nothing: an empty file would read as "no journal yet".
    assert why_not_writable(tmp_path / "new" / "journal.db") is None
    assert list((tmp_path / "new").iterdir()) == []
    (tmp_path / "file").write_text("")
    e = why_not_writable(tmp_path / "file" / "journal.db")
    assert isinstance(e, OSError)
