"""What the tests share that is not a fixture: waiting for a thing (never sleeping for it), the
holdover command, a minimal board config, the MicroPython runner, an MQTT listener, the toy
training run as a child, a fake ntfy server and a disk that really fills. Fixtures stay in
conftest.py; test files import these by name from here."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import queue
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode

from holdover.board.emulator import DEFAULT_HEAP, firmware_dir, micropython_binary
from holdover.lab.ntfy import Ntfy  # noqa: F401 - the tests' alert receiver, shared with bench/
from holdover.lab.rig import Rig
from holdover.train import registry

HOLDOVER = str(Path(sys.executable).parent / "holdover")  # the installed command, as a user runs it
KEY = "5e0b8d2f7a4c9e1b3f6a8d0c2e5b7f9a"


def board_config(sid: str = "s", key: str = KEY, **sections: Any) -> dict[str, Any]:
    """The smallest board config the firmware accepts, with `sections` merged over it."""
    cfg: dict[str, Any] = {
        "sentinel_id": sid,
        "key": key,
        "wlan": {"ssid": "lab"},
        "mqtt": {"host": "10.0.0.2"},
        "mains": {"pin": 4},
    }
    for name, value in sections.items():
        cfg[name] = {**cfg[name], **value} if isinstance(value, dict) and isinstance(cfg.get(name), dict) else value
    return cfg


async def until(pred: Callable[[], Any], timeout: float, what: str, *, in_thread: bool = False) -> float:
    """Wait on the running loop until pred() is true (in a thread when it blocks); the seconds it
    took, or fail naming what never happened."""
    t0 = time.monotonic()
    while not (await asyncio.to_thread(pred) if in_thread else pred()):
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)
    return time.monotonic() - t0


MPY_DIR = Path(__file__).parent / "mpy"
# The torch-free stand-in (holdover.lab.trainee): the same Guard, socket and signal, started in a
# tenth of the time; for tests of the socket and the signal, not of what a resume reproduces.
TRAINEE = [sys.executable, "-m", "holdover.lab.trainee", "--mb", "1"]


def run_micropython(script: str, *args: str, heap: str = DEFAULT_HEAP, timeout: float = 60) -> str:
    """Run a script from tests/mpy in the real MicroPython unix port, with the firmware on its path."""
    env = dict(os.environ, MICROPYPATH=f"{firmware_dir()}:.frozen")
    proc = subprocess.run(
        [micropython_binary(), "-X", f"heapsize={heap}", str(MPY_DIR / script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"micropython failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def run_micropython_json(script: str, payload: object, tmp_path: Path) -> object:
    f = tmp_path / "mpy-input.json"
    f.write_text(json.dumps(payload))
    return json.loads(run_micropython(script, str(f)))


class Listener:
    """A paho subscriber that records (topic, payload, retained) as it arrives."""

    def __init__(self, rig: Rig, topics: list[str], client_id: str = "", persistent: bool = False) -> None:
        self.q: queue.Queue[tuple[str, bytes, bool]] = queue.Queue()
        kw = {"client_id": client_id, "clean_session": False} if persistent else {}
        self.c = paho.Client(CallbackAPIVersion.VERSION2, **kw)
        self.topics = topics
        self.subscribed = threading.Event()
        self.session_present: bool | None = None
        self.c.on_connect = self._on_connect
        self.c.on_subscribe = lambda *_: self.subscribed.set()
        self.c.on_message = lambda _c, _u, m: self.q.put((m.topic, bytes(m.payload), bool(m.retain)))
        self.c.reconnect_delay_set(0.2, 1)
        self.c.connect(rig.broker.host, rig.broker.port)
        self.c.loop_start()

    def _on_connect(self, c: paho.Client, _u: object, flags: paho.ConnectFlags, *_: object) -> None:
        self.session_present = flags.session_present
        # A persistent listener never subscribes again: what it hears after a reconnect is what the
        # broker kept for its session, so a broker that loses sessions makes the test fail.
        if not flags.session_present:
            c.subscribe([(t, 1) for t in self.topics])

    def next(self, timeout: float, match=lambda t, p, r: True) -> tuple[str, bytes, bool]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("nothing matching arrived")
            try:
                item = self.q.get(timeout=left)
            except queue.Empty:
                continue
            if match(*item):
                return item

    def close(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


# --- a protected training run (holdover.train.toy) as a child process -------------------------


class Mqtt5:
    """An MQTT 5 client that keeps the reason codes Mosquitto answers with (0x87: not authorized)."""

    def __init__(self, port: int, user: str | None, password: str | None) -> None:
        self.c = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
        if user:
            self.c.username_pw_set(user, password)
        self.connack: ReasonCode | None = None
        self.acks: dict[int, ReasonCode] = {}
        self.got: list[str] = []
        self.done = threading.Event()
        self.c.on_connect = lambda _c, _u, _f, rc, _p: (setattr(self, "connack", rc), self.done.set())
        self.c.on_publish = lambda _c, _u, mid, rc, _p: self.acks.__setitem__(mid, rc)
        self.c.on_subscribe = lambda _c, _u, mid, rcs, _p: self.acks.__setitem__(mid, rcs[0])
        self.c.on_message = lambda _c, _u, m: self.got.append(m.topic)
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()
        assert self.done.wait(10)

    def ack(self, mid: int) -> ReasonCode:
        wait_for(lambda: mid in self.acks, 10, f"the broker's answer to {mid}")
        return self.acks[mid]

    def close(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


def losses(out: str) -> dict[int, float]:
    return {d["step"]: d["loss"] for d in map(json.loads, out.splitlines()) if "step" in d}


# A run that imports torch spends about 2 s of CPU on the import alone, and the suite starts dozens
# on two cores. multiprocessing's forkserver imports torch once per test worker and forks each run
# from there: still its own process (its pid, signals, files, exit status), main() on its own argv
# and environment, started in milliseconds.
_PRELOAD = [
    "torch",
    "torch.distributed",
    "torch._dynamo",
    "holdover.train",
    "holdover.train.toy",
    "holdover.lab.ddp_trainee",
]


def _forked_main(module: str, argv: list[str], env: dict[str, str], out: str, err: str) -> None:
    """In the forked child: the process `python -m module *argv` would be, from main() on."""
    import importlib

    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    sys.argv = [module, *argv]
    sys.exit(importlib.import_module(module).main(argv))


class Forked:
    """`python -m module *argv` forked from the torch-loaded server, with Popen's face: pid, poll,
    wait, send_signal, kill, communicate (its output kept in files under `where`)."""

    _ctx: Any = None
    _n = itertools.count()

    def __init__(self, module: str, argv: list[str], where: Path, env: dict[str, str] | None = None) -> None:
        import multiprocessing

        if Forked._ctx is None:
            Forked._ctx = multiprocessing.get_context("forkserver")
            Forked._ctx.set_forkserver_preload(_PRELOAD)
        where.mkdir(parents=True, exist_ok=True)
        n = next(Forked._n)
        self.out, self.err = where / f"{module}.{n}.out", where / f"{module}.{n}.err"
        env = dict(os.environ if env is None else env)
        self.p = Forked._ctx.Process(target=_forked_main, args=(module, argv, env, str(self.out), str(self.err)))
        self.p.start()
        self.pid: int = self.p.pid

    @property
    def returncode(self) -> int | None:
        return self.p.exitcode

    def poll(self) -> int | None:
        return self.p.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self.p.join(timeout)
        if self.p.exitcode is None:
            raise subprocess.TimeoutExpired(str(self.p.name), timeout or 0)
        return self.p.exitcode

    def send_signal(self, sig: int) -> None:
        if self.p.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(9)

    def terminate(self) -> None:
        self.send_signal(15)

    def stdout(self) -> str:
        return self.out.read_text() if self.out.exists() else ""

    def stderr(self) -> str:
        return self.err.read_text() if self.err.exists() else ""

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        return self.stdout(), self.stderr()


class Toy:
    """The toy run as a child process, with its registration and socket."""

    def __init__(self, tmp: Path, *args: str, name: str = "toy", torch: bool = True) -> None:
        self.reg_dir = tmp / "reg"
        self.ckpt = tmp / "ckpt"
        self.name = name
        env = dict(os.environ, HOLDOVER_REGISTRY=str(self.reg_dir))
        argv = ["--ckpt", str(self.ckpt), "--name", name, *args]
        self.proc: Forked | subprocess.Popen[str]
        if torch:
            self.proc = Forked("holdover.train.toy", argv, tmp / "output", env)
        else:
            self.proc = subprocess.Popen(
                [*TRAINEE, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
            )

    def registration(self, timeout: float = 30) -> registry.Registration:
        path = registry.registration_path(self.reg_dir, self.name)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists():
                return registry.Registration.from_json(path.read_text())
            assert self.proc.poll() is None, self.finish()[1]
            time.sleep(0.05)
        raise AssertionError("the toy never registered")

    def ask(self, msg: dict) -> list[dict]:
        reg = self.registration()
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(30)
            s.connect(reg.socket)
            s.sendall(registry.encode(msg))
            f = s.makefile("rb")
            out = []
            for line in f:
                out.append(json.loads(line))
                if msg["op"] in ("status", "bound") or out[-1].get("state") in ("done", "failed", "unknown"):
                    break
            return out

    def finish(self, timeout: float = 60) -> tuple[str, str]:
        return self.proc.communicate(timeout=timeout)

    def __enter__(self) -> Toy:
        return self

    def __exit__(self, *exc: object) -> None:
        # A run left training (most tests ask it for steps without end) is killed and reaped.
        self.proc.kill()
        self.finish()


def wait_for(pred, timeout: float, what: str):
    """Poll pred until it returns something true; fail naming what never happened."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@contextlib.contextmanager
def small_tmpfs(where: Path, options: str) -> Iterator[Path]:
    """A tmpfs of a few MB (or a few inodes) mounted at `where`: a disk that really fills. Root only."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def build_wheel(work: Path) -> Path:
    """The wheel of this tree as it is now (committed or not), built from a copy of it in `work`:
    setuptools writes build/ and egg-info beside the sources, and nothing may write in the checkout."""
    root = Path(__file__).resolve().parent.parent
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root, capture_output=True, check=True
    ).stdout.split(b"\0")
    src = work / "src"
    for f in filter(None, map(os.fsdecode, files)):
        if (root / f).is_file():  # a file deleted in the work tree but not yet in git's index
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / f, src / f)
    dist = work / "dist"
    pip = ["nice", "-n", "10", sys.executable, "-m", "pip"]  # niced: the tests beside this one time boards
    r = subprocess.run(
        [*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), str(src)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = dist.glob("holdover-*.whl")
    return wheel


DOCS = Path(__file__).resolve().parents[1] / "docs"


def blocks(doc: str, lang: str) -> list[str]:
    """The fenced blocks of one language in a doc, in order: what a user is told to type."""
    return re.findall(rf"^```{lang}\n(.*?)^```", (DOCS / doc).read_text(), flags=re.M | re.S)


def the_block(doc: str, lang: str, starting: str) -> str:
    found = [b for b in blocks(doc, lang) if b.startswith(starting)]
    assert len(found) == 1, f"{doc}: one ```{lang} block starting {starting!r}, found {len(found)}"
    return found[0]


def _param(p: Any) -> dict[str, Any]:
    default = p.default
    return {
        "name": p.name,
        "kind": type(p).__name__,
        "opts": sorted(p.opts),
        "secondary_opts": sorted(getattr(p, "secondary_opts", [])),
        "required": p.required,
        "default": default if isinstance(default, str | int | float | bool | type(None)) else str(default),
        "is_flag": getattr(p, "is_flag", False),
        "hidden": getattr(p, "hidden", False),
        "help": getattr(p, "help", None),
        "type": str(p.bare_type()),
        "nargs": p.nargs,
        "multiple": getattr(p, "multiple", False),
    }


def cli_surface() -> dict[str, Any]:
    """Every command of `holdover`: its help and its parameters (tests/cli/test_cli_surface.py keeps
    them as recorded; the wheel test runs each --help)."""
    import typer.main

    from holdover.cli import app

    out: dict[str, Any] = {}

    def walk(cmd: Any, path: str) -> None:
        out[path] = {
            "help": (cmd.help or "").strip(),
            "params": sorted((_param(p) for p in cmd.params), key=lambda d: d["name"] or ""),
            "context": {k: v for k, v in sorted(cmd.context_settings.items()) if k != "help_option_names"},
        }
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            walk(sub, f"{path} {name}".strip())

    walk(typer.main.get_command(app), "")
    return out


class Cgroup:
    """A cgroup of a test's own (pids v1 or v2, whichever this machine mounts), so "nothing it
    started outlives it" can be checked: descendants stay in it whatever their parent, their
    environment or their command line, and daemons started by other tests at the same time are
    not in it. `wrap(argv)` starts a command inside it; `left()` is what still runs there."""

    ROOTS = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup"))

    def __init__(self) -> None:
        root = next((r for r in self.ROOTS if (r / "cgroup.procs").exists()), None)
        if root is None:
            pytest.fail("no cgroup hierarchy to put a command in (/sys/fs/cgroup)")
        self.dir = root / f"holdover-test-{os.getpid()}-{time.monotonic_ns()}"
        self.dir.mkdir()

    def wrap(self, argv: list[str]) -> list[str]:
        return ["bash", "-c", f'echo $$ > {self.dir}/cgroup.procs && exec "$@"', "cgroup", *argv]

    def left(self) -> list[str]:
        out = []
        for pid in (self.dir / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                out.append(f"{pid} {cmdline}")
        return out

    def close(self) -> None:
        for pid in (self.dir / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                os.kill(int(pid), 9)
        for _ in range(50):
            try:
                self.dir.rmdir()
                return
            except OSError:
                time.sleep(0.1)
