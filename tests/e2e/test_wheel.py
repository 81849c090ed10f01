"""holdover as a user installs it: the wheel built from this tree, installed (not editable) with its
dependencies into a fresh venv outside the checkout, run from a directory with no checkout in reach.
Every test before this ran from an editable install, and a wheel without holdover.cluster shipped.

The build runs on a copy of the tree (setuptools writes build/ and egg-info beside the sources);
the dependencies come from the wheelhouse `make test` prepares (.cache/wheelhouse), as the suite
runs with no network. The demo ran from the editable install until this test ran it from the wheel.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from support import build_wheel, cli_surface

ROOT = Path(__file__).resolve().parents[2]
WHEELHOUSE = ROOT / ".cache" / "wheelhouse"

# What an installed module may lack: the extras [emu] does not bring (torch, the frameworks, the
# board tools). A missing holdover module is never one of them.
OPTIONAL = {"torch", "numpy", "lightning", "transformers", "accelerate", "safetensors", "esptool", "mpremote"}

IMPORT_ALL = """
import importlib, json, pkgutil, holdover
bad = {}
for m in pkgutil.walk_packages(holdover.__path__, "holdover."):
    if m.name.endswith(".__main__") or m.name.startswith("holdover.firmware."):  # runs; MicroPython's
        continue
    try:
        importlib.import_module(m.name)
    except ModuleNotFoundError as e:
        bad[m.name] = e.name
print(json.dumps({"file": holdover.__file__, "missing": bad}))
"""

# Every command's --help in one interpreter: 28 of them started one at a time took 20 s of the
# suite. The entry point itself is run below (--version, demo).
HELP_ALL = """
import json, sys
from typer.testing import CliRunner
from holdover.cli import app
bad = {}
for path in json.loads(sys.argv[1]):
    r = CliRunner().invoke(app, [*path.split(), "--help"], prog_name="holdover")
    if r.exit_code != 0 or "Usage:" not in r.output or r.exception is not None:
        bad[path] = (r.exit_code, repr(r.exception), r.output[-600:])
print(json.dumps(bad))
"""


def _modules_in_tree() -> set[str]:
    host = {str(p.relative_to(ROOT / "host")) for p in (ROOT / "host" / "holdover").rglob("*.py")}
    return host | {f"holdover/firmware/{p.name}" for p in (ROOT / "firmware").glob("*.py")}


def test_the_wheel_installs_whole_and_runs_from_anywhere(tmp_path: Path) -> None:
    if not (WHEELHOUSE / "requirements.txt").exists():
        pytest.fail(f"no wheelhouse at {WHEELHOUSE}: `make test` prepares it (scripts/wheelhouse)")
    wheel = build_wheel(tmp_path)

    # Every module in the tree is in the wheel (the firmware's too), and the page with its plots.
    names = set(zipfile.ZipFile(wheel).namelist())
    assert _modules_in_tree() - names == set(), "modules missing from the wheel"
    for data in (
        "holdover/web/static/index.html",
        "holdover/web/static/icon.svg",
        "holdover/web/static/vendor/uplot/uPlot.iife.min.js",
    ):
        assert data in names, data
    version = re.match(r"holdover-([^-]+)-", wheel.name)[1]  # type: ignore[index]

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    py = venv / "bin" / "python"
    # Niced, as the build is: installing is all CPU, and the tests beside this one time boards.
    pip = ["nice", "-n", "10", sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-index"]
    install = subprocess.run(
        [*pip, "--find-links", str(WHEELHOUSE), f"{wheel}[emu]"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert install.returncode == 0, install.stdout + install.stderr

    away = tmp_path / "elsewhere"  # no checkout above it, none on its path
    away.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env |= {"COLUMNS": "200", "PATH": f"{venv / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin"}

    def run(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, cwd=away, env=env, capture_output=True, text=True, timeout=timeout)

    # Every module imports from the installed package (what --help alone never loads: the commands
    # import their wing when they run), lacking only what the [emu] install leaves out.
    r = run("nice", "-n", "10", str(py), "-c", IMPORT_ALL)
    assert r.returncode == 0, r.stdout + r.stderr
    imported = json.loads(r.stdout)
    assert imported["file"].startswith(str(venv)), imported["file"]
    wrong = {m: lack for m, lack in imported["missing"].items() if lack.split(".")[0] not in OPTIONAL}
    assert wrong == {}, "modules that cannot import from the wheel"

    holdover = str(venv / "bin" / "holdover")
    r = run(holdover, "--version")
    assert (r.returncode, r.stdout.strip()) == (0, f"holdover {version}"), r.stdout + r.stderr

    commands = list(cli_surface())
    r = run("nice", "-n", "10", str(py), "-c", HELP_ALL, json.dumps(commands))
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(commands) > 20 and json.loads(r.stdout) == {}, "commands whose --help fails from the wheel"

    # The README's first command, from the wheel.
    r = run(holdover, "demo", timeout=150)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "demo complete" in out
    # Piped, every line whole: rich cut them at 80 columns, the title and the flicker's among them.
    assert "== holdover demo: a power cut, an uplink loss and a forged event on an emulated sentinel ==" in out
    assert re.search(r"the flicker raised \d+ mains_suspect, \d+ mains_dip, 0 mains_lost\n", out), out
    assert re.search(r"dashboard and API on http://127\.0\.0\.1:\d+/", out), out
    assert "GET /api/sentinels: demo online, mains False" in out  # the API, asked during the cut
    assert 'rejected: ["bad_signature"]' in out and "hook runs: ok, ok" in out
    # The training run's emergency checkpoint, verified and pinned; the uplink loss; the alerts.
    assert re.search(r"emergency checkpoint verified: step \d+, 16\.8 MB at \d+ MB/s, pinned", out), out
    assert re.search(r"uplink_lost \d\.\d\ds after the cut", out), out
    for alert in ("Mains power lost at demo", "Emergency checkpoint of demo-run verified", "Internet uplink lost"):
        assert f"alert     {alert}" in out, alert
    assert "emergency checkpoints: finished" in out
    assert list(away.iterdir()) == [], "the demo left files where it was run"
