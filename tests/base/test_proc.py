"""holdover.proc: children in their own session, killed as a group, output kept as a tail."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import psutil
import pytest

from holdover import proc
from holdover.bridge.hooks import HookRunner
from holdover.journal import Event, Journal
from holdover.settings import HookSettings
from support import wait_for

# A shell that leaves a grandchild deaf to SIGTERM behind it, then hangs itself. The grandchild lets
# go of the output pipe, so nothing but a kill of the whole group after the leader's death ends it.
STUBBORN = "sh -c 'trap \"\" TERM; echo $$ > {pid}; exec sleep 300' >/dev/null 2>&1 & sleep 300"


def _pid(path: Path) -> int:
    wait_for(lambda: path.exists() and path.read_text().strip(), 10, "the grandchild to write its pid")
    return int(path.read_text())


def _dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _gone(pid: int) -> bool:
    """Dead within a moment: SIGKILL is delivered when the target is next scheduled, not inside kill()."""
    deadline = time.monotonic() + 2
    while not _dead(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_hook_that_started_a_grandchild_leaves_nothing_after_its_timeout(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    journal = Journal(tmp_path / "journal.db")
    done: list[dict] = []
    runner = HookRunner(
        [HookSettings(events=["mains_lost"], run=STUBBORN.format(pid=pidfile), timeout=1)], journal, done.append
    )
    event = Event(
        id=1, rx_ts=time.time(), source="mqtt", sid="s", boot="b", seq=1, kind="mains_lost", ms=0, ts=0, data={}
    )

    async def go() -> int:
        assert runner.dispatch(event) == 1
        grandchild = await asyncio.to_thread(_pid, pidfile)
        await runner.drain()
        return grandchild

    grandchild = asyncio.run(go())
    assert done[0]["outcome"] == "timeout"
    assert _gone(grandchild), "the grandchild outlived the hook's timeout"
    journal.close()


def test_run_sync_kills_the_group_on_timeout(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    t0 = time.monotonic()
    r = proc.run_sync(STUBBORN.format(pid=pidfile), timeout=1, grace=0.5)
    assert r.outcome == "timeout" and not r.ok
    assert time.monotonic() - t0 < 10
    assert _gone(int(pidfile.read_text()))


def test_output_is_a_bounded_tail_and_failures_are_named() -> None:
    r = asyncio.run(proc.run("seq 1 100000; echo last line; exit 3", timeout=30, keep=100))
    assert r.outcome == "failed" and r.rc == 3 and r.describe() == "exit 3"
    assert len(r.output.encode()) <= 100 and r.output.endswith("last line\n")
    missing = asyncio.run(proc.run(["/nonexistent/holdover-test"], timeout=5))
    assert missing.outcome == "not_started" and "No such file" in missing.output
    assert proc.run_sync(["true"], timeout=5).ok


def test_a_spawned_service_is_stopped_with_its_children(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    p = proc.spawn(["sh", "-c", STUBBORN.format(pid=pidfile)])
    grandchild = _pid(pidfile)
    proc.stop(p, grace=0.5)
    assert p.poll() is not None
    assert _gone(grandchild)


@pytest.mark.parametrize(
    ("command", "problem"),
    [
        ("echo $HOLDOVER_EVENT >> /tmp/x", None),
        ("LANG=C sh -c 'exit 0'", None),
        (f"{sys.executable} -c pass", None),
        ("/no/such/script --now", "/no/such/script: no such file"),
        ("no-such-program-anywhere arg", "no-such-program-anywhere: not found on PATH"),
        ("/etc/passwd", "/etc/passwd: not an executable file"),
        ("unbalanced 'quote", "not a shell command line"),
    ],
)
def test_a_hooks_program_is_checked_before_the_first_outage(command: str, problem: str | None) -> None:
    got = proc.missing_program(command)
    assert got == problem if problem is None else (got is not None and got.startswith(problem)), got
