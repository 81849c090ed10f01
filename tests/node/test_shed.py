"""Buying the UPS time ([protect] shed): a run verified in a rescue is stopped, with its process
group, until the power is back; a restarted bridge continues what the last one stopped, never a
stranger on its pid; its GPUs' power limits go to their floor and back (NVML as a stand-in: there
is no GPU here)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

from test_rescue import _drive, _event, _settings

from holdover.firmware import protocol
from holdover.journal import Journal
from holdover.node.rescue import Rescuer
from holdover.node.rescue_ledger import RescueLedger
from holdover.node.shed import Shedder, nvml
from holdover.node.targets import Target
from support import Toy, wait_for


def _state(pid: int) -> str:
    """The kernel's letter for the process: T stopped, S sleeping, R running."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_verified_run_is_stopped_until_the_power_is_back_across_a_bridge_restart(tmp_path: Path) -> None:
    with Toy(tmp_path, "--steps", "100000", "--step-sleep", "0.02", torch=False) as run:
        run.registration()
        s = _settings(tmp_path, shed=True)
        db = tmp_path / "j.db"
        with Journal(db) as j:
            asyncio.run(_drive(Rescuer(s, j), _event(j, protocol.MAINS_LOST)))
            actions = [x["action"] for x in RescueLedger(j).steps() if x["target"] != "*"]
        assert actions.index("verified") < actions.index("shed"), actions
        wait_for(lambda: _state(run.proc.pid) == "T", 5, "the run stopped")

        with Journal(db) as j:  # a new bridge, the power still off

            async def second() -> None:
                r = Rescuer(s, j)
                r.recover()
                assert list(r.shed.stopped) == [f"toy:{run.proc.pid}"]
                r.on_event(_event(j, protocol.MAINS_RESTORED))

            asyncio.run(second())
            continued = [x for x in RescueLedger(j).steps() if x["action"] == "continued"]
        assert len(continued) == 1 and "mains_restored" in continued[0]["detail"]["why"]
        wait_for(lambda: _state(run.proc.pid) != "T", 5, "the run continued")
        assert run.ask({"op": "status"})[0]["registration"]["pid"] == run.proc.pid  # it answers again


def test_a_run_saved_after_the_power_came_back_is_not_stopped(tmp_path: Path) -> None:
    with Toy(tmp_path, "--steps", "100000", "--step-sleep", "0.02", torch=False) as run:
        run.registration()
        with Journal(tmp_path / "j.db") as j:

            async def go() -> None:
                r = Rescuer(_settings(tmp_path, shed=True), j)
                await _drive(r, _event(j, protocol.MAINS_LOST), _event(j, protocol.MAINS_RESTORED))

            asyncio.run(go())
            actions = [x["action"] for x in RescueLedger(j).steps()]
        assert "verified" in actions and "shed" not in actions, actions
        assert _state(run.proc.pid) != "T"


def test_the_whole_process_group_stops_and_a_stranger_on_the_pid_is_never_continued(tmp_path: Path) -> None:
    # A launcher and its worker in a session of their own, as a run started from a shell or by
    # torchrun is: stopping the launcher's group stops the worker too.
    group = subprocess.Popen(["sh", "-c", "sleep 60 & exec sleep 60"], start_new_session=True)
    try:
        worker = lambda: [  # noqa: E731
            int(p)
            for p in subprocess.run(["pgrep", "-g", str(group.pid)], capture_output=True, text=True).stdout.split()
        ]
        wait_for(lambda: len(worker()) == 2, 5, "both in the group")
        with Journal(tmp_path / "j.db") as j:
            shed = Shedder(RescueLedger(j))
            t = Target("launcher", group.pid, "registration")
            assert shed.stop(7, t)
            wait_for(lambda: all(_state(p) == "T" for p in worker()), 5, "the group stopped")
            assert shed.stopped[t.key].pgid == group.pid
            shed.stopped[t.key].started -= 100  # as if the pid now belonged to another process
            assert shed.continue_all("test") == 0
            assert all(_state(p) == "T" for p in worker())
            steps = RescueLedger(j).steps(7)
            assert [x["action"] for x in steps] == ["shed", "continued"] and steps[1]["detail"]["gone"] is True
    finally:
        os.killpg(group.pid, signal.SIGKILL)
        group.wait()


class FakeNvml:
    """NVML's calls as nvidia-ml-py names them, on two GPUs; the run holds GPU 1."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.limits = {0: 300_000, 1: 350_000}

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=self.pid)] if h == 1 else [SimpleNamespace(pid=1)]

    def nvmlDeviceGetPowerManagementLimitConstraints(self, h: int) -> tuple[int, int]:
        return 100_000, 400_000

    def nvmlDeviceGetPowerManagementLimit(self, h: int) -> int:
        return self.limits[h]

    def nvmlDeviceSetPowerManagementLimit(self, h: int, mw: int) -> None:
        self.limits[h] = mw


def test_the_gpus_a_run_holds_go_to_their_power_floor_and_back(tmp_path: Path) -> None:
    p = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        nv = FakeNvml(p.pid)
        with Journal(tmp_path / "j.db") as j:
            rid = RescueLedger(j).open(_event(j, protocol.MAINS_LOST).id, "s1", "mains_lost", time.time() + 60, False)
            assert rid is not None
            shed = Shedder(RescueLedger(j), nv)
            assert shed.stop(rid, Target("gpu-run", p.pid, "registration"))
            assert nv.limits == {0: 300_000, 1: 100_000}  # only the GPU it holds
            assert RescueLedger(j).steps(rid)[0]["detail"]["gpus"] == {"1": 350_000}
            restarted = Shedder(RescueLedger(j), nv)  # the limit to restore survives a restart
            assert restarted.recover() == 1
            assert restarted.continue_all("power back") == 1
        assert nv.limits == {0: 300_000, 1: 350_000}
        assert _state(p.pid) != "T"
    finally:
        p.kill()
        p.wait()


def test_the_stand_in_speaks_nvmls_own_names_and_without_a_gpu_nvml_is_left_alone() -> None:
    import pynvml  # nvidia-ml-py, the gpu extra

    calls = [n for n in vars(FakeNvml) if n.startswith("nvml")]
    assert len(calls) == 6 and all(callable(getattr(pynvml, n, None)) for n in calls), calls
    assert nvml() is None  # no driver here: NVMLError_LibraryNotFound, and shedding goes on without it
