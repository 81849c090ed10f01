"""The sections of what spans machines: Slurm's circuits, and the peers of a multi-node job."""

from __future__ import annotations

import fnmatch
from typing import Literal

from pydantic import Field, field_validator, model_validator

from holdover.settings.base import ConfigPath, SignalName, _Strict


class SlurmCircuit(_Strict):
    """Nodes that lose power together, and what says their power went (a sentinel, the UPS, or both)."""

    name: str = Field(..., min_length=1, description="the circuit, as people call it (rack1)")
    sentinel: str | None = Field(None, description="the sentinel watching this circuit's mains")
    ups: bool = Field(False, description="the host UPS of [ups] feeds these nodes: its on-battery counts")
    nodes: str = Field(..., min_length=1, description="a Slurm hostlist: gpu[01-04] (expanded by scontrol)")

    @model_validator(mode="after")
    def _watched(self) -> SlurmCircuit:
        if self.sentinel is None and not self.ups:
            raise ValueError("a circuit needs a sentinel, or ups = true, to know when its power goes")
        return self


class SlurmSignal(_Strict):
    """The signal a job is told to checkpoint with, by its partition or its name."""

    partition: str | None = Field(None, description="jobs in this partition")
    job_name: str | None = Field(None, description="jobs whose name matches this glob (train-*)")
    signal: SignalName = Field(..., description="USR1, USR2, TERM...")


class PeerSettings(_Strict):
    """The other nodes of this node's multi-node jobs, checked every second (cluster/peers.py): one
    silent for lost_after_s means the link between the nodes may be dead, and this node's runs are
    asked to checkpoint (their Guards save without a collective)."""

    peers: list[str] = Field(
        default_factory=list, description='"host:port" of each other node; any port (a refused one answers)'
    )
    every_s: float = Field(1.0, gt=0, description="how often each peer is checked")
    timeout_s: float = Field(1.0, gt=0, description="a check with no answer within this is silence")
    lost_after_s: float = Field(5.0, gt=0, description="silent this long: peer_lost, and a checkpoint of every run")
    netns: str | None = Field(None, description="check from this network namespace (tests)")

    @field_validator("peers")
    @classmethod
    def _host_port(cls, peers: list[str]) -> list[str]:
        for p in peers:
            host, _, port = p.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"peer {p!r} is not host:port")
        return peers


class SlurmSettings(_Strict):
    """Slurm's nodes on circuits: drain them on a cut and tell their jobs to checkpoint."""

    circuits: list[SlurmCircuit] = Field(default_factory=list)
    signal: SignalName = Field(
        "USR2", description="what jobs are told to checkpoint with (NCCL takes USR1 in some builds)"
    )
    signals: list[SlurmSignal] = Field(default_factory=list, description="per partition or job name; first match")
    # Who gets the signal (scancel's own choices). "steps": every step srun started, the training
    # processes, not the batch script's shell, as `sbatch --signal` does. "full" adds the shell,
    # which a script without a trap for the signal dies of, and the job with it (seen here with
    # USR2). "batch": the shell alone, for scripts that trap it and pass it on themselves.
    signal_to: Literal["steps", "full", "batch"] = Field(
        "steps", description="who is signalled: the steps' processes, with the batch shell, or the shell alone"
    )
    grace: float | None = Field(None, ge=0, description="seconds of a cut before draining; default [protect] grace")
    then: Literal["run", "requeue", "hold", "suspend"] = Field(
        "run",
        description="once a job is saved on every node it runs on: let it run, requeue it, requeue and hold it, or"
        " suspend it (scontrol suspend: off the UPS's load, resumed in place when the power is back)",
    )
    save_timeout_s: float = Field(
        300.0, gt=0, description="a job not saved on every node by then is reported unsaved (and left running)"
    )
    resume_after_s: float = Field(60.0, ge=0, description="mains back and steady this long before nodes resume")
    timeout_s: float = Field(10.0, gt=0, le=120, description="each Slurm command's time limit")
    conf: ConfigPath | None = Field(None, description="SLURM_CONF for the commands; default: Slurm's own")
    netns: str | None = Field(None, description="run Slurm's commands in this network namespace (tests)")

    @property
    def enabled(self) -> bool:
        return bool(self.circuits)

    def signal_for(self, partition: str, job_name: str) -> str:
        for rule in self.signals:
            if rule.partition is not None and rule.partition != partition:
                continue
            if rule.job_name is not None and not fnmatch.fnmatchcase(job_name, rule.job_name):
                continue
            return rule.signal
        return self.signal
