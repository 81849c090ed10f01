"""Slurm, through its own commands (scontrol, sinfo, squeue, scancel): never its state files,
never a hostlist parser of our own. Each call is bounded by [slurm] timeout_s and raises
SlurmError naming the command and Slurm's own words; callers run these on a thread (the bridge's
loop must never wait on slurmctld)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from holdover import proc
from holdover.errors import HoldoverError
from holdover.settings import SlurmSettings

REASON_PREFIX = "holdover:"  # a node drained by holdover says so first; only those are resumed


class SlurmError(HoldoverError):
    pass


@dataclass(frozen=True)
class Job:
    id: str
    name: str
    partition: str
    nodes: str  # a hostlist, as squeue gives it: every node the job runs on, not only this circuit's
    user: str
    count: int = 0  # how many nodes (squeue's %D); 0: not known (a follow taken up from the journal)


class Slurm:
    def __init__(self, settings: SlurmSettings) -> None:
        self.s = settings
        self._expanded: dict[str, list[str]] = {}

    def _run(self, *argv: str) -> str:
        env = dict(os.environ)
        if self.s.conf is not None:
            env["SLURM_CONF"] = str(self.s.conf)
        # A namespace only for tests (the lab's controller lives in one); nsenter keeps /sys as is.
        enter = ["nsenter", f"--net=/run/netns/{self.s.netns}"] if self.s.netns else []
        r = proc.run_sync([*enter, *argv], timeout=self.s.timeout_s, env=env, stderr_apart=True)
        if r.outcome == "not_started":
            raise SlurmError(f"{argv[0]} cannot be run ({r.output.strip()}): is slurm-client installed?")
        if not r.ok:
            said = (r.stderr or r.output).strip().splitlines()
            raise SlurmError(f"{' '.join(argv[:3])}: {r.describe()}: {said[-1] if said else 'no message'}")
        return r.output

    def hostnames(self, hostlist: str) -> list[str]:
        """A hostlist expanded by Slurm, once: the expansion is its syntax alone (slurm.conf plays no
        part), and a cut then asks slurmctld's host one command less (bench/site_scale.py: 0.14 to
        0.22 s of a 32-node cut, on a loaded host)."""
        if hostlist not in self._expanded:
            self._expanded[hostlist] = self._run("scontrol", "show", "hostnames", hostlist).split()
        return list(self._expanded[hostlist])

    def nodes(self, names: list[str]) -> dict[str, tuple[str, str]]:
        """Each node's state (idle, mixed, allocated, drained, draining, down...) and reason."""
        out = self._run("sinfo", "-h", "-N", "-n", ",".join(names), "-o", "%N|%T|%E")
        found = {}
        for line in out.splitlines():
            name, state, reason = [*line.split("|", 2), "", ""][:3]
            found[name] = (state, "" if reason == "none" else reason)
        return found

    def drain(self, names: list[str], reason: str) -> None:
        self._run("scontrol", "update", f"NodeName={','.join(names)}", "State=DRAIN", f"Reason={reason}")

    def resume(self, names: list[str]) -> None:
        self._run("scontrol", "update", f"NodeName={','.join(names)}", "State=RESUME")

    def jobs_on(self, names: list[str]) -> list[Job]:
        """The running (and suspended) jobs with a step on any of these nodes."""
        out = self._run("squeue", "-h", "-w", ",".join(names), "-t", "RUNNING,SUSPENDED", "-o", "%i|%j|%P|%N|%u|%D")
        jobs = []
        for line in out.splitlines():
            if line.count("|") == 5:
                *fields, count = line.split("|", 5)
                jobs.append(Job(*fields, count=int(count) if count.isdigit() else 0))
        return jobs

    def signal(self, jobs: list[str], signal: str) -> None:
        """Every step's processes of these jobs ([slurm] signal_to = "steps", scancel's default), or
        with the batch shell ("full"), or the shell alone ("batch"): one scancel for them all, so a
        cut costs one call however many jobs it tells (bench/site_scale.py). scancel signals every
        job it can and fails if any one is gone: SlurmError then, and `running` says which were."""
        scope = {"steps": [], "full": ["--full"], "batch": ["--batch"]}[self.s.signal_to]
        self._run("scancel", f"--signal={signal}", *scope, *jobs)

    def running(self, jobs: list[str]) -> set[str]:
        """Which of these jobs are still there (running or suspended)."""
        out = self._run("squeue", "-h", "-j", ",".join(jobs), "-t", "RUNNING,SUSPENDED", "-o", "%i")
        return set(out.split())

    # Each takes a job list: the jobs a cut saved at about the same time, in one call.
    def requeue(self, jobs: list[str]) -> None:
        self._run("scontrol", "requeue", ",".join(jobs))

    def hold(self, jobs: list[str]) -> None:
        self._run("scontrol", "requeuehold", ",".join(jobs))

    def suspend(self, jobs: list[str]) -> None:
        """Every process of the jobs stopped where it is (SIGSTOP from its slurmstepd), their nodes
        still theirs: off the UPS's load, and on from the same instruction when resumed."""
        self._run("scontrol", "suspend", ",".join(jobs))

    def suspended(self, jobs: list[str]) -> set[str]:
        """Which of these jobs are suspended now (not resumed by someone else, ended, or requeued)."""
        out = self._run("squeue", "-h", "-j", ",".join(jobs), "-t", "SUSPENDED", "-o", "%i")
        return set(out.split())

    def resume_jobs(self, jobs: list[str]) -> None:
        self._run("scontrol", "resume", ",".join(jobs))


def unknown_nodes(settings: SlurmSettings) -> list[str]:
    """Each circuit's nodes that slurmctld does not know, as "slurm.circuits[i].nodes: n9, n10";
    SlurmError when Slurm cannot be asked (then nothing can be said either way)."""
    slurm = Slurm(settings)
    problems = []
    for i, c in enumerate(settings.circuits):
        names = slurm.hostnames(c.nodes)
        known = set(slurm.nodes(names))
        missing = [n for n in names if n not in known]
        if missing:
            unknown = ", ".join(missing)
            problems.append(f"slurm.circuits[{i}].nodes: Slurm knows no node {unknown} (sinfo -N lists them)")
    return problems
