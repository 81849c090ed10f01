"""Every benchmark still starts: each script in bench/ imports what it runs and answers --help, so
a bench that a refactor broke fails the suite, not the next person who runs it (bench/uplink_detect.py
died at import for weeks once: the firmware's config had a new sibling). One after another and
niced: several import torch, and the emulator's timing tests beside them must keep their CPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_each_bench_imports_and_says_how_it_is_run() -> None:
    scripts = sorted(p for p in BENCH.glob("*.py") if p.name != "common.py")
    assert len(scripts) >= 10
    for script in scripts:
        argv = ["nice", "-n", "15", sys.executable, str(script), "--help"]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "Traceback" not in r.stderr, (script.name, r.stderr[-2000:])
        assert r.stdout.startswith("usage: "), (script.name, r.stdout[:300])
