"""Where the commands find the config and what its relative paths mean: $HOLDOVER_CONFIG or
/etc/holdover/holdover.toml without --config, and a relative path taken from the config file's
directory, not from wherever the command runs."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from holdover.cli.common import DEFAULT_CONFIG
from holdover.journal import Journal
from holdover.settings import Settings, load
from support import HOLDOVER


def test_a_relative_path_is_the_config_files_and_holdover_config_finds_it_from_anywhere(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "rack1.key").write_text("3c9e1f7a5b2d8c4e6f0a1b3d5e7c9a2f\n")
    (etc / "holdover.toml").write_text(
        '[journal]\npath = "state/j.db"\n[[sentinels]]\nid = "rack1"\nkey_file = "rack1.key"\n'
    )
    cfg = load(etc / "holdover.toml")
    assert cfg.journal.path == etc / "state" / "j.db"
    assert cfg.keys()["rack1"] == b"3c9e1f7a5b2d8c4e6f0a1b3d5e7c9a2f"  # key_file, beside it
    (etc / "state").mkdir()
    Journal(etc / "state" / "j.db").close()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "HOLDOVER_CONFIG": str(etc / "holdover.toml"), "HOLDOVER_REGISTRY": str(tmp_path / "reg")}
    r = subprocess.run([HOLDOVER, "status", "--json"], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert (st["config"], st["journal"]) == (str(etc / "holdover.toml"), str(etc / "state" / "j.db"))
    assert [s["sid"] for s in st["sentinels"]] == ["rack1"]


@pytest.mark.skipif(DEFAULT_CONFIG.exists(), reason="this machine has a holdover config at the default place")
def test_no_config_anywhere_says_where_it_looked_and_how_to_make_one(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "HOLDOVER_CONFIG"}
    r = subprocess.run([HOLDOVER, "status"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "no config at /etc/holdover/holdover.toml (the default): pass --config FILE, set HOLDOVER_CONFIG" in r.stderr


def test_the_defaults_are_a_services_paths_not_the_working_directorys() -> None:

    s = Settings()
    assert s.journal.path == Path("/var/lib/holdover/journal.db")
    assert s.protect.rescue_dir == Path("/var/lib/holdover/rescue")
