"""The site tier (`make site-test`): holdover deployed on Debian 12 machines with systemd as PID 1
(tests_site/box.py), from the wheel, as docs/service.md and docs/nut.md tell a user to."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # support.build_wheel, shared with the wheel test

from support import build_wheel  # noqa: E402


@pytest.fixture(scope="session")
def image() -> Path:
    """The bookworm image `make site-test` built (scripts/site-image needs the network, this does not)."""
    found = os.environ.get("HOLDOVER_SITE_IMAGE")
    if not found or not (Path(found) / ".complete").exists():
        pytest.fail("no site image: run `make site-test` (it builds one with scripts/site-image)")
    for tool in ("systemd-nspawn", "nsenter"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is missing: `make site-test` installs it (scripts/ensure-system-deps.sh site)")
    return Path(found)


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The wheel of this tree and the wheelhouse of its dependencies, in one directory: what a box
    installs from with no network (`pip install --no-index --find-links`)."""
    work = tmp_path_factory.mktemp("wheels")
    wheel = build_wheel(work)
    out = work / "whl"
    shutil.copytree(ROOT / ".cache" / "wheelhouse", out, ignore=shutil.ignore_patterns("requirements.txt", ".built"))
    shutil.copy2(wheel, out)
    yield out
    subprocess.run(["rm", "-rf", str(work)], check=False)
