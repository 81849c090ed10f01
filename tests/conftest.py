"""Shared fixtures: a private Mosquitto per test, the MicroPython runner, the whole rig."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from holdover.board.emulator import firmware_dir, micropython_binary
from holdover.lab.rig import Rig
from holdover.train import registry

MPY_DIR = Path(__file__).parent / "mpy"
TOY = [sys.executable, "-m", "holdover.train.toy"]


def run_micropython(script: str, *args: str, heap: str = "110K", timeout: float = 60) -> str:
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


@pytest.fixture
def rig_factory(tmp_path: Path) -> Iterator:
    rigs: list[Rig] = []

    def make(bridge: bool = True, emulator: bool = True, **kw: object) -> Rig:
        r = Rig(tmp_path / f"rig{len(rigs)}", **kw)  # type: ignore[arg-type]
        rigs.append(r)
        return r.start(bridge=bridge, emulator=emulator)

    yield make
    for r in rigs:
        r.close()


# --- a protected training run (holdover.train.toy) as a child process -------------------------


def losses(out: str) -> dict[int, float]:
    return {d["step"]: d["loss"] for d in map(json.loads, out.splitlines()) if "step" in d}


class Toy:
    """The toy run as a child process, with its registration and socket."""

    def __init__(self, tmp: Path, *args: str, name: str = "toy") -> None:
        self.reg_dir = tmp / "reg"
        self.ckpt = tmp / "ckpt"
        self.name = name
        env = dict(os.environ, HOLDOVER_REGISTRY=str(self.reg_dir))
        self.proc = subprocess.Popen(
            [*TOY, "--ckpt", str(self.ckpt), "--name", name, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    def registration(self, timeout: float = 30) -> registry.Registration:
        path = registry.registration_path(self.reg_dir, self.name)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists():
                return registry.Registration.from_json(path.read_text())
            assert self.proc.poll() is None, self.proc.stderr.read()
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
                if msg["op"] == "status" or out[-1].get("state") in ("done", "failed", "unknown"):
                    break
            return out

    def finish(self, timeout: float = 60) -> tuple[str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        return out, err

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
