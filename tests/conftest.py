"""Shared fixtures: a private Mosquitto per test, the whole rig, a fake ntfy server. What tests
share that is not a fixture is in support.py."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from holdover.lab.rig import Rig
from support import Ntfy

# The suite starts hundreds of Python processes (8 workers, bridges, trainees, benches). Where
# PYTHONDONTWRITEBYTECODE is set (this machine sets it), each compiled the holdover modules it
# imported again, and each worker rewrote pytest's plugins' asserts again (2.3 s of its 7 s start).
# Compiled once instead, beside the sources, where git ignores them. The workers and every process
# a test starts inherit this from the controller, which reads this file before starting them.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
# torch gives each process an OpenMP thread a core, and the spare one spins after every op: on two
# cores shared by 8 workers and their trainees, a rank trained at 1.8 CPU-s in 10 s against 0.5 s
# with one, and the suite took 4:59 against 4:28. The tests' models are tiny; nothing here measures
# torch's own parallel speed (the benches' figures are measured outside the suite).
os.environ["OMP_NUM_THREADS"] = "1"
# A suite started in the background (`make test &`, nohup) inherits SIGINT ignored, and so would every
# demo a test interrupts with Ctrl-C: two tests failed only that way. A handler here is reset to the
# default in each child at exec, where an ignored signal stays ignored.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# Where runs register when nothing names a place: as root, the machine's own /run/holdover/targets.
# A test's bridge with no registry configured read it, and on a cut asked whatever was there: a
# registration left by a killed run, whose pid a test worker later had, ended that worker with
# SIGUSR2. On a real GPU box it would have asked the owner's runs. Each process of the suite (each
# worker, and what it starts) gets a directory of its own instead.
_registry = tempfile.mkdtemp(prefix=f"holdover-suite-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-registry-")
os.environ["HOLDOVER_REGISTRY"] = _registry
atexit.register(shutil.rmtree, _registry, True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked long (tens of seconds each, most of it waiting) first: the workers take
    them up one by one (--maxschedchunk) while the short ones fill in around them, rather than
    one worker finishing a bench minutes after the rest are done."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


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


@pytest.fixture
def ntfy():
    n = Ntfy().start()
    yield n
    n.stop()


@pytest.fixture
def site_dir() -> Iterator[Path]:
    """A directory the packaged daemons' users (mosquitto, nut) can enter, as /etc/holdover is on a
    server: pytest's own tmp_path sits under root's 0700 tree, where they could read nothing."""
    where = Path(tempfile.mkdtemp(prefix="holdover-site-", dir="/tmp"))
    where.chmod(0o755)
    yield where
    shutil.rmtree(where, ignore_errors=True)
