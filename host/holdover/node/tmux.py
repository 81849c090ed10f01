"""The one home for tmux: launched runs live in its sessions, and targets are matched by session name."""

from __future__ import annotations

import shutil

from holdover import proc
from holdover.errors import HoldoverError

TIMEOUT = 10.0


class TmuxError(HoldoverError, RuntimeError):
    pass


def available() -> bool:
    return shutil.which("tmux") is not None


def tmux(*args: str, check: bool = True) -> proc.Result:
    """Run one tmux command; output is its stdout only. With check, a failure raises TmuxError with tmux's words."""
    if not available():
        raise TmuxError("tmux is not installed (apt-get install tmux)")
    r = proc.run_sync(["tmux", *args], timeout=TIMEOUT, stderr_apart=True)
    if check and not r.ok:
        raise TmuxError(f"tmux {args[0]}: {r.stderr.strip() or r.describe()}")
    return r


def sessions() -> set[str]:
    if not available():
        return set()
    r = tmux("list-sessions", "-F", "#{session_name}", check=False)
    return set(r.output.split()) if r.ok else set()


def panes() -> list[tuple[str, int]]:
    """(session name, pane pid) for every pane of the server."""
    if not available():
        return []
    r = tmux("list-panes", "-a", "-F", "#{session_name} #{pane_pid}", check=False)
    out = []
    for line in r.output.splitlines() if r.ok else []:
        name, _, pid = line.rpartition(" ")
        if pid.isdigit():
            out.append((name, int(pid)))
    return out
