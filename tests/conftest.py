"""Shared fixtures: a private Mosquitto per test, the MicroPython runner, the whole rig."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from holdover.emulator import firmware_dir, micropython_binary
from holdover.rig import Rig

MPY_DIR = Path(__file__).parent / "mpy"


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
