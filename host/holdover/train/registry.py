"""How a training process and the bridge find and talk to each other (shared by both sides).

A protected process writes ``<registry>/<name>.json`` (atomically) and listens on a Unix stream
socket named in it. The socket speaks JSON lines:

    -> {"op": "save", "id": "<request id>", "reason": "mains_lost", "deadline": <unix time>}
    <- {"id": ..., "state": "queued" | "saving" | "done" | "failed", "step": ..., "bytes_done": ...,
        "bytes_total": ..., "dir": ..., "seconds": ..., "error": ...}      (streamed until done/failed)
    -> {"op": "watch", "id": "<request id>"}   the same stream for a request made earlier; asking to
                                               save with a known id also only watches, never saves twice
    -> {"op": "status"}                        <- {"registration": {...}, "requests": {id: state}}
    -> {"op": "bound", "max_loss_s": 900.0}    <- {"max_loss_s", "every_s", "save_s", "step_s", "meets"}:
                                               save by the clock so that a cut loses at most that (null
                                               lifts it; node/cadence.py sets it, train/schedule.py LossBound)

Both ends live here: ``RunServer`` for the training side (``guard`` answers what it parses),
``SaveChannel`` for the bridge's client (used by ``node.rescue``).

The signal (SIGUSR2 by default) is the fallback when the socket cannot be reached; it carries no
id, so the bridge journals that it sent it and never sends it twice for one rescue.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from holdover.files import write_atomic

STATES_FINAL = ("done", "failed")


def default_registry() -> Path:
    env = os.environ.get("HOLDOVER_REGISTRY")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/run/holdover/targets")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "holdover" / "targets"
    return Path(tempfile.gettempdir()) / f"holdover-{os.geteuid()}" / "targets"


@dataclass
class LastSave:
    step: int
    directory: str
    nbytes: int
    seconds: float
    at: float
    reason: str = ""


@dataclass
class Registration:
    name: str
    pid: int
    socket: str
    ckpt_dir: str
    signal: int
    argv: list[str]
    cwd: str
    started: float
    tmux: str | None = None
    rank: int = 0
    world: int = 1
    last_save: LastSave | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    job: str | None = None  # the Slurm job it runs in (SLURM_JOB_ID), for the cluster's bridge
    bound: dict[str, Any] | None = None  # the loss bound it holds (LossBound.as_dict), when the bridge set one
    # When its process started, in the kernel's ticks since boot (/proc/PID/stat): what tells the run
    # from a later process given the same pid. Not wall time, which a clock step moves.
    proc_start: int | None = None

    def alive(self) -> bool:
        """Its process still runs: the pid is alive and is the process that registered. A run killed
        without closing (SIGKILL, the OOM killer) leaves its file behind, and its pid goes to some
        later process, which a rescue would then signal, and SIGUSR2's default action ends it (seen:
        a test worker given a stale registration's pid, ended by a test bridge's rescue)."""
        if not pid_alive(self.pid):
            return False
        now = proc_start(self.pid)
        return self.proc_start is None or now is None or now == self.proc_start

    @classmethod
    def of_this_process(cls, name: str, ckpt_dir: Path, signal: int, rank: int, world: int) -> Registration:
        """This process as a run: its command line to run it again, its tmux session and its Slurm
        job, if any (the socket is filled in once it listens)."""
        return cls(
            name=name,
            pid=os.getpid(),
            socket="",
            ckpt_dir=str(ckpt_dir),
            signal=signal,
            argv=[sys.executable, *sys.argv],
            cwd=os.getcwd(),
            started=time.time(),
            proc_start=proc_start(os.getpid()),
            tmux=os.environ.get("HOLDOVER_TMUX_SESSION"),
            rank=rank,
            world=world,
            job=os.environ.get("SLURM_JOB_ID"),
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> Registration:
        d = json.loads(text)
        last = d.pop("last_save", None)
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        reg = cls(**known)
        if last:
            reg.last_save = LastSave(**{k: v for k, v in last.items() if k in LastSave.__dataclass_fields__})
        return reg


def socket_path(registry: Path, name: str, rank: int = 0) -> Path:
    """Where a run's socket listens: beside its registration, or in /tmp when that path is too
    long for a Unix socket (sun_path is 108 bytes on Linux)."""
    path = registry / (f"{name}.sock" if rank == 0 else f"{name}.rank{rank}.sock")
    return path if len(str(path).encode()) <= 100 else Path(f"/tmp/holdover-{os.getpid()}.sock")


def registration_path(registry: Path, name: str, rank: int = 0) -> Path:
    return registry / (f"{name}.json" if rank == 0 else f"{name}.rank{rank}.json")


_writing = threading.Lock()  # the loop, the watchdog and the socket's threads publish; one temporary file a process


def write_registration(registry: Path, reg: Registration) -> Path:
    registry.mkdir(parents=True, exist_ok=True)
    path = registration_path(registry, reg.name, reg.rank)
    # The bridge never reads a half-written file. Not fsync'd: it is rewritten after every save, in
    # the training process, and lives in the runtime directory that a reboot empties anyway.
    with _writing:
        return write_atomic(path, reg.to_json(), durable=False)


def read_registrations(registry: Path) -> tuple[list[Registration], list[str]]:
    """Every registration in the directory, and a message for each file that could not be read."""
    regs: list[Registration] = []
    problems: list[str] = []
    if not registry.is_dir():
        return regs, problems
    for p in sorted(registry.glob("*.json")):
        try:
            regs.append(Registration.from_json(p.read_text()))
        except (OSError, ValueError, TypeError) as e:
            problems.append(f"{p}: unreadable registration: {e}")
    return regs, problems


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie answers kill(0) but will never save anything.
    stat = proc_stat(pid)
    return stat is None or stat[0] != "Z"


def proc_stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields from the state on (field 3; the command name before it may hold
    spaces and parentheses); None where /proc cannot say."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def proc_start(pid: int) -> int | None:
    """When the process started, in ticks since boot (field 22); None where /proc cannot say."""
    stat = proc_stat(pid)
    try:
        return None if stat is None else int(stat[19])
    except (IndexError, ValueError):
        return None


def encode(msg: dict[str, Any]) -> bytes:
    return (json.dumps(msg, separators=(",", ":")) + "\n").encode()


def parse_request(raw: bytes) -> dict[str, Any]:
    """One request line as the training side reads it; ValueError says what is wrong with it."""
    try:
        msg = json.loads(raw)
    except ValueError:
        raise ValueError("malformed request: not JSON") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("op"), str):
        raise ValueError("malformed request: expected a JSON object with 'op'")
    return msg


class RunServer:
    """The training side's end of the socket: bound 0600, connections accepted on a thread, each
    served on its own (only live ones kept: a run polled for weeks must not pile up dead threads);
    every request line is parsed here and handed to `handle(conn, msg)`; a malformed one is
    answered with what is wrong and the connection goes on."""

    def __init__(self, path: Path, handle: Callable[[socket.socket, dict[str, Any]], None]) -> None:
        self.path = path
        self.handle = handle
        self.clients: list[threading.Thread] = []
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self.sock: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        os.chmod(path, 0o600)
        self.sock.listen(8)
        threading.Thread(target=self._accept, args=(self.sock,), name="holdover-guard", daemon=True).start()

    def _accept(self, srv: socket.socket) -> None:
        while self.sock is srv:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.clients = [c for c in self.clients if c.is_alive()]
            self.clients.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as rf:
            for raw in rf:
                try:
                    msg = parse_request(raw)
                except ValueError as e:
                    conn.sendall(encode({"error": str(e)}))
                    continue
                self.handle(conn, msg)

    def close(self, until: float) -> None:
        """Let the connections finish (their last answers) until `until` (monotonic), then go."""
        for t in self.clients:
            t.join(max(0.0, until - time.monotonic()))
        sock, self.sock = self.sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
            with contextlib.suppress(OSError):
                os.unlink(self.path)


class SaveChannel:
    """The bridge's end of the socket: one request and the stream of states the run answers with.

    ``next()`` raises ConnectionError when the run closes the socket or answers garbage, so the
    caller has one failure to handle and falls back to the signal.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, path: str | Path, timeout: float = 5.0) -> SaveChannel:
        reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(str(path)), timeout)
        return cls(reader, writer)

    async def send(self, op: str, **fields: Any) -> None:
        self.writer.write(encode({"op": op, **fields}))
        await self.writer.drain()

    async def next(self, timeout: float) -> dict[str, Any] | None:
        """The next message, or None if none came within ``timeout`` seconds."""
        try:
            line = await asyncio.wait_for(self.reader.readline(), timeout=timeout)
        except TimeoutError:
            return None
        if not line:
            raise ConnectionError("the training process closed the socket")
        try:
            msg = json.loads(line)
        except ValueError:
            raise ConnectionError(f"garbled answer from the training process: {line[:80]!r}") from None
        if not isinstance(msg, dict):
            raise ConnectionError(f"garbled answer from the training process: {line[:80]!r}")
        return msg

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError, ConnectionError):
            await self.writer.wait_closed()

    async def __aenter__(self) -> SaveChannel:
        return self

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()
