"""The one way holdover starts a child process.

Every child gets a session of its own, so a timeout or a stop reaches everything it spawned (a
hook's shell that started a grandchild, gdb under gcore), not just the process we hold: SIGTERM to
the whole group, a grace period, then SIGKILL to whatever of the group is left. Commands that run
to completion (`run`, `run_sync`) keep only the tail of their output, so a chatty hook cannot grow
the bridge. Long-lived children (the broker, the MicroPython interpreter) are started with
`spawn` and ended with `stop`, under the same rules.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

OUTPUT_KEEP = 4096  # bytes of output kept from a command
KILL_GRACE = 2.0  # seconds between SIGTERM and SIGKILL

Command = str | Sequence[str]  # a string runs through /bin/sh, as NUT's NOTIFYCMD and SHUTDOWNCMD do


@dataclass
class Result:
    command: str
    outcome: str  # "ok", "failed" (non-zero exit), "timeout", or "not_started"
    rc: int | None
    output: str  # the last OUTPUT_KEEP bytes of stdout and stderr together (stdout only with stderr_apart)
    seconds: float
    stderr: str = ""  # with stderr_apart only

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    def describe(self) -> str:
        """One phrase for logs and journal entries."""
        if self.outcome == "timeout":
            return f"timed out after {self.seconds:.0f}s"
        if self.outcome == "not_started":
            return f"failed to start: {self.output}"
        return "ok" if self.ok else f"exit {self.rc}"


# Words the shell runs itself: a hook starting with one of these has no program to look for.
_SHELL_OWN = frozenset(
    {
        *(":", ".", "[", "[[", "cd", "echo", "eval", "exec", "exit", "export", "if", "printf", "read"),
        *("set", "source", "test", "true", "false", "case", "for", "while", "{", "("),
    }
)


def missing_program(command: str) -> str | None:
    """What is wrong with the program a shell command line starts, if anything: found out when it
    is configured, not at the first outage, when the hook would fail."""
    try:
        words = shlex.split(command)
    except ValueError as e:
        return f"not a shell command line: {e}"
    words = [w for w in words if not (("=" in w) and w.split("=", 1)[0].isidentifier())][:1]  # VAR=x cmd
    if not words or words[0] in _SHELL_OWN:
        return None
    prog = words[0]
    if "/" in prog:
        p = Path(prog)
        if not p.exists():
            return f"{prog}: no such file"
        if p.is_dir() or not os.access(p, os.X_OK):
            return f"{prog}: not an executable file"
        return None
    return None if shutil.which(prog) else f"{prog}: not found on PATH"


def _display(cmd: Command) -> str:
    return cmd if isinstance(cmd, str) else " ".join(cmd)


def _argv(cmd: Command) -> list[str]:
    return ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)


def _env(env: Mapping[str, str] | None) -> dict[str, str] | None:
    return None if env is None else {**os.environ, **env}


def signal_group(pgid: int, sig: int) -> bool:
    """Send sig to a whole process group; False when the group is already gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # the pid was reused by someone else's process: never ours to signal
    return True


async def run(
    cmd: Command,
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    keep: int = OUTPUT_KEEP,
    grace: float = KILL_GRACE,
) -> Result:
    """Run a command to completion inside the event loop; never raises for the command's own faults."""
    started = time.monotonic()
    try:
        p = await asyncio.create_subprocess_exec(
            *_argv(cmd),
            env=_env(env),
            cwd=cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as e:
        return Result(_display(cmd), "not_started", None, str(e), time.monotonic() - started)

    tail = b""

    async def collect() -> None:
        nonlocal tail
        assert p.stdout is not None
        while chunk := await p.stdout.read(65536):
            tail = (tail + chunk)[-keep:]

    try:
        # The output is read to EOF, so a grandchild that keeps our pipe open counts as still running.
        await asyncio.wait_for(asyncio.gather(collect(), p.wait()), timeout)
        outcome = "ok" if p.returncode == 0 else "failed"
    except TimeoutError:
        outcome = "timeout"
        await _end_group(p.pid, p.wait, grace)
    except asyncio.CancelledError:
        await asyncio.shield(_end_group(p.pid, p.wait, grace))
        raise
    return Result(_display(cmd), outcome, p.returncode, tail.decode(errors="replace"), time.monotonic() - started)


async def _end_group(pgid: int, wait: Callable[[], Awaitable[int]], grace: float) -> None:
    signal_group(pgid, signal.SIGTERM)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(wait(), grace)
    # Whatever of the group outlived the leader (a child that ignores SIGTERM) goes now.
    signal_group(pgid, signal.SIGKILL)
    await wait()


def run_sync(
    cmd: Command,
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    keep: int = OUTPUT_KEEP,
    grace: float = KILL_GRACE,
    stderr_apart: bool = False,
) -> Result:
    """`run` for callers without an event loop (the CLI, tmux queries, esptool, mpremote).

    With stderr_apart, output holds stdout only and stderr its own field: for commands whose
    output is data (tmux display-message) and whose complaints are the error message.
    """
    started = time.monotonic()
    try:
        p = subprocess.Popen(
            _argv(cmd),
            env=_env(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if stderr_apart else subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as e:
        return Result(_display(cmd), "not_started", None, str(e), time.monotonic() - started)
    try:
        out, err = p.communicate(timeout=timeout)
        outcome = "ok" if p.returncode == 0 else "failed"
    except subprocess.TimeoutExpired:
        stop(p, grace)
        out, err = p.communicate()
        outcome = "timeout"
    return Result(
        _display(cmd),
        outcome,
        p.returncode,
        out[-keep:].decode(errors="replace"),
        time.monotonic() - started,
        (err or b"")[-keep:].decode(errors="replace"),
    )


def spawn(argv: Sequence[str], **popen: object) -> subprocess.Popen:
    """Start a long-lived child in its own session; end it with `stop`."""
    return subprocess.Popen(list(argv), start_new_session=True, **popen)  # type: ignore[call-overload]


def stop(p: subprocess.Popen, grace: float = KILL_GRACE) -> int | None:
    """SIGTERM to the child's group, up to `grace` seconds for it to exit, then SIGKILL to the group."""
    if p.poll() is not None:
        return p.returncode  # reaped: its pid may belong to someone else by now
    signal_group(p.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(grace)
    signal_group(p.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        return p.wait(grace)
    return p.returncode
