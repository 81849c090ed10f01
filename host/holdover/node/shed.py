"""Buying the UPS time once a run is safe: its load stopped, and continued when the power is back.

A run whose emergency checkpoint is verified has nothing left to lose at the cut, but its CPUs and
GPUs still draw from the UPS that the runs still saving need, and that decides whether the box
rides out the outage at all. Stopped (SIGSTOP to its process group, so its launcher and dataloader
workers stop with it; its own process alone when that group is the bridge's) it draws close to
idle; continued (SIGCONT) when the power returns, it trains on from where it stopped. Where NVML
answers (`nvidia-ml-py` and a GPU), the GPUs the run holds also get their power limit set to their
floor, and back to what it was on continue: a stopped process's kernels already queued still run,
and an idle GPU still draws its idle power. The NVML half is untried here (this machine has no
GPU); its calls are the documented nvmlDeviceGetComputeRunningProcesses,
nvmlDeviceGetPowerManagementLimitConstraints and nvmlDeviceSetPowerManagementLimit (root only).

A multi-node job's other ranks stall on their next collective while this one is stopped; their
own Guards' watchdogs save them, and their nodes' bridges stop them in turn. A job stopped longer
than its process group's timeout fails on continue and resumes from the checkpoint just verified.

Every stop and continue is a rescue step in the journal ("shed", "continued"), with the process's
start time, so a bridge restarted mid-outage continues what it stopped, and never a stranger that
took the pid.
"""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import dataclass, field
from typing import Any

import psutil

from holdover.node.rescue_ledger import RescueLedger
from holdover.node.targets import Target

log = logging.getLogger("holdover.node.shed")

RECOVER_FROM = 5  # the newest rescues whose stops a restarted bridge takes up


@dataclass
class Stopped:
    rid: int
    key: str
    pid: int
    pgid: int | None  # the group stopped; None: the process alone
    started: float  # the process's start time, so a reused pid is never continued
    gpus: dict[int, int] = field(default_factory=dict)  # NVML index -> its power limit before (mW)


def nvml() -> Any | None:
    """NVML, if this machine has it: None without nvidia-ml-py, a driver or a GPU."""
    try:
        import pynvml  # type: ignore[import-not-found]  # the `gpu` extra: nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...: no GPU to speak of
        log.info("NVML not available (%s): no GPU power limits", e)
        return None
    return pynvml


class Shedder:
    def __init__(self, ledger: RescueLedger, nvml: Any | None = None) -> None:
        self.ledger = ledger
        self.nvml = nvml
        self.stopped: dict[str, Stopped] = {}

    def stop(self, rid: int, t: Target) -> bool:
        """Stop a verified run's load; False if it is gone (or stopped already)."""
        if t.key in self.stopped:
            return False
        try:
            proc = psutil.Process(t.pid)
            started = proc.create_time()
            pgid: int | None = os.getpgid(t.pid)
        except (psutil.Error, ProcessLookupError):
            return False
        if pgid in (os.getpgrp(), 0, 1) or any(s.pgid == pgid for s in self.stopped.values()):
            pgid = None  # the bridge's own group (or one already stopped): this process only
        try:
            os.killpg(pgid, signal.SIGSTOP) if pgid else os.kill(t.pid, signal.SIGSTOP)
        except ProcessLookupError:
            return False
        s = Stopped(rid, t.key, t.pid, pgid, started, self._lower_gpus(t.pid))
        self.stopped[t.key] = s
        self.ledger.step(rid, t.key, t.pid, "shed", pgid=pgid, started=started, gpus=s.gpus)
        log.warning(
            "%s: verified, so stopped (%s) until the power is back%s",
            t.key,
            f"process group {pgid}" if pgid else "this process",
            f"; GPUs {sorted(s.gpus)} at their power floor" if s.gpus else "",
        )
        return True

    def continue_all(self, why: str) -> int:
        """Continue every run stopped; how many were."""
        n = 0
        for s in list(self.stopped.values()):
            self.stopped.pop(s.key)
            self._restore_gpus(s)
            if not self._same(s):
                self.ledger.step(s.rid, s.key, s.pid, "continued", why=why, gone=True)
                continue
            try:
                os.killpg(s.pgid, signal.SIGCONT) if s.pgid else os.kill(s.pid, signal.SIGCONT)
            except ProcessLookupError:
                continue
            self.ledger.step(s.rid, s.key, s.pid, "continued", why=why)
            log.warning("%s: continued (%s)", s.key, why)
            n += 1
        return n

    def recover(self) -> int:
        """What a previous bridge stopped and never continued, taken up; how many."""
        for r in self.ledger.rescues()[-RECOVER_FROM:]:
            for st in self.ledger.steps(r["id"]):
                d = st["detail"]
                if st["action"] == "shed":
                    gpus = {int(k): int(v) for k, v in (d.get("gpus") or {}).items()}
                    self.stopped[st["target"]] = Stopped(
                        r["id"], st["target"], st["pid"], d.get("pgid"), d["started"], gpus
                    )
                elif st["action"] == "continued":
                    self.stopped.pop(st["target"], None)
        for s in self.stopped.values():
            log.warning("%s: stopped by a previous bridge; continued when the power is back", s.key)
        return len(self.stopped)

    def _same(self, s: Stopped) -> bool:
        try:
            return abs(psutil.Process(s.pid).create_time() - s.started) < 1.0
        except psutil.Error:
            return False

    def _lower_gpus(self, pid: int) -> dict[int, int]:
        if self.nvml is None:
            return {}
        nv, before = self.nvml, {}
        try:
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                if not any(p.pid == pid for p in nv.nvmlDeviceGetComputeRunningProcesses(h)):
                    continue
                floor, _ceiling = nv.nvmlDeviceGetPowerManagementLimitConstraints(h)
                before[i] = nv.nvmlDeviceGetPowerManagementLimit(h)
                nv.nvmlDeviceSetPowerManagementLimit(h, floor)
        except Exception as e:  # NVMLError: not root, not supported on this board, ...
            log.warning("GPU power limit for pid %d not lowered: %s", pid, e)
        return before

    def _restore_gpus(self, s: Stopped) -> None:
        if self.nvml is None:
            return
        for i, mw in s.gpus.items():
            try:
                self.nvml.nvmlDeviceSetPowerManagementLimit(self.nvml.nvmlDeviceGetHandleByIndex(i), mw)
            except Exception as e:
                log.warning("GPU %d's power limit not restored to %d mW: %s", i, mw, e)
