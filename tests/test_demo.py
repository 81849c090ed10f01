"""The README's first command: `holdover demo` runs the whole chain and says it went right."""

from __future__ import annotations

import os
import re
import subprocess

from support import HOLDOVER


def test_the_demo_runs_end_to_end_and_shows_what_holdover_does() -> None:
    r = subprocess.run(
        [HOLDOVER, "demo"], capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"}
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "demo complete" in out
    assert re.search(r"dashboard and API on http://127\.0\.0\.1:\d+/", out), out
    assert "GET /api/sentinels: demo online, mains False" in out  # the API, asked during the cut
    assert 'rejected: ["bad_signature"]' in out and "hook runs: ok, ok" in out
    # The training run's emergency checkpoint, verified and pinned; the uplink loss; the alerts.
    assert re.search(r"emergency checkpoint verified: step \d+, 16\.8 MB at \d+ MB/s, pinned", out), out
    assert re.search(r"uplink_lost \d\.\d\ds after the cut", out), out
    for alert in ("Mains power lost at demo", "Emergency checkpoint of demo-run verified", "Internet uplink lost"):
        assert f"alert     {alert}" in out, alert
    assert "emergency checkpoints: finished" in out
