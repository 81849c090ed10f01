"""Every benchmark still runs: each script in bench/ runs its --smoke (the same code path at sizes
whose figures mean nothing, no verdict), so a bench that a change broke fails the suite, not the
next person who runs it. Two had rotted unseen while --help still answered: bench/nut.py served
NUT from a 0700 temporary directory upsd (as nut) could not read, and bench/slurm.py's part 1 was
drained and signalled by part 3's cuts resent late (the bridge now journals a state's event that
comes after a later one of its kind and acts on nothing). Niced: several import torch, and the
emulator's timing tests beside them must keep their CPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if p.name != "common.py")


def test_every_bench_is_run_here() -> None:
    assert len(SCRIPTS) >= 10, SCRIPTS


@pytest.mark.long
@pytest.mark.timeout(240)
@pytest.mark.parametrize("script", SCRIPTS)
def test_each_bench_runs_its_smoke(script: str, tmp_path: Path) -> None:
    argv = ["nice", "-n", "15", sys.executable, str(BENCH / script), "--smoke"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=230, cwd=tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, (script, r.stdout[-1500:], r.stderr[-3000:])
    assert r.stdout.strip(), script  # it said its figures
    assert list(tmp_path.iterdir()) == [], "a bench left files where it was run"
