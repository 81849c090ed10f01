"""A Slurm cluster of Debian's own daemons in network namespaces, for the cluster tests:

    ctl ns: slurmctld, hostname ctl, 198.51.100.10 on br0 ---+--- veth --- n1 ns: slurmd -N n1, 198.51.100.11
                                                              +--- veth --- n2 ns: slurmd -N n2, 198.51.100.12

One munged of its own (its own key and socket, named by AuthInfo) serves all three: a Unix socket
crosses network namespaces. Each daemon runs in a UTS namespace of its own with the host name Slurm
knows it by (slurmctld refuses to start on a host not named in SlurmctldHost). Slurm's commands need
a non-loopback address to resolve anything (AI_ADDRCONFIG), so clients run in the controller's
namespace: `SlurmLab.run` for tests, `[slurm] netns` for a bridge. Nothing here touches the
caller's namespace; the namespaces are removed on close.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from pyroute2 import NetNS
from pyroute2 import netns as pr_netns

from holdover import proc
from holdover.cluster.slurm import SlurmError
from holdover.lab.broker import free_port
from holdover.node.netlink import configured

configured()  # before any namespace's socket: pyroute2's forked child must not take our signals

SUBNET = "198.51.100"  # TEST-NET-2: documentation only, never routed anywhere
CTL = ("ctl", f"{SUBNET}.10")
NODES = {"n1": f"{SUBNET}.11", "n2": f"{SUBNET}.12"}


def pids_in(namespaces: set[int]) -> list[int]:
    """The processes whose network namespace is one of these (by inode), this one never."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if os.stat(d / "ns" / "net").st_ino in namespaces:
                out.append(int(d.name))
    return out


def available() -> bool:
    tools = ("slurmctld", "slurmd", "munged", "scontrol")
    return all(shutil.which(t) or Path(f"/usr/sbin/{t}").exists() for t in tools)


class SlurmLab:
    def __init__(self, nodes: dict[str, str] | None = None) -> None:
        self.nodes = nodes or dict(NODES)
        tag = f"{os.getpid()}{secrets.token_hex(2)}"
        self.ns_names = {"ctl": f"hsctl{tag}", **{n: f"hs{n}{tag}" for n in self.nodes}}
        self.dir = Path(tempfile.mkdtemp(prefix="holdover-slurm-"))
        self.conf = self.dir / "slurm.conf"
        self.socket = self.dir / "munge" / "munge.socket"
        self._ns: dict[str, Any] = {}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._argv: dict[str, tuple[str, list[str]]] = {}  # daemon -> (namespace, argv), to start again

    @property
    def netns(self) -> str:
        """The controller's namespace, where Slurm's commands work."""
        return self.ns_names["ctl"]

    def __enter__(self) -> SlurmLab:
        try:
            self._network()
            self._munge()
            self._config()
            self._start("slurmctld", "ctl", ["slurmctld", "-D", "-f", str(self.conf)])
            for n in self.nodes:
                self._start(f"slurmd-{n}", n, ["slurmd", "-D", "-N", n, "-f", str(self.conf)])
            self.wait_idle(set(self.nodes), 30)
        except BaseException:
            self.__exit__()
            raise
        return self

    def stop(self, name: str) -> None:
        """Stop one daemon (slurmctld, slurmd-n1, munged): its process group, TERM then KILL."""
        proc.stop(self._procs.pop(name), grace=5)

    def restart(self, name: str) -> None:
        """Start a stopped daemon again as it first ran (its state is in its own files)."""
        self._start(name, *self._argv[name])

    def partition(self, on: bool = True) -> None:
        """Drop (on) or stop dropping every frame between two nodes, silently, as a dead switch
        port looks from both ends; each node still reaches the controller (its traffic to br0 is
        the bridge's input, not a forward between ports)."""
        nft = [*self._enter("ctl"), "nft"]
        table = ["bridge", "partition"]
        proc.run_sync([*nft, "delete", "table", *table], timeout=10)  # absent when none was made: fine
        if on:
            chain = "{ type filter hook forward priority 0 ; policy drop ; }"
            for argv in (["add", "table", *table], ["add", "chain", *table, "between", chain]):
                r = proc.run_sync([*nft, *argv], timeout=10)
                if not r.ok:
                    raise SlurmError(f"nft {' '.join(argv[:3])}: {r.describe()}: {r.output.strip()}")

    def namespaces(self) -> set[int]:
        """The inodes of the lab's network namespaces: what a process in one of them holds."""
        out = set()
        for name in self.ns_names.values():
            with contextlib.suppress(OSError):
                out.add(os.stat(f"/run/netns/{name}").st_ino)
        return out

    def __exit__(self, *exc: object) -> None:
        inside = self.namespaces()
        for name in reversed(list(self._procs)):
            self.stop(name)
        # What the daemons started and left: a job's slurmstepd runs in a session of its own,
        # outlives slurmd's process group and ignores SIGTERM (seen alive 5 min after a lab
        # closed, with the job's srun and ranks under it). Whatever still runs in the lab's
        # namespaces is the lab's: TERM, then KILL.
        for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 2.0)):
            left = pids_in(inside)
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + wait
            while left and time.monotonic() < deadline:
                time.sleep(0.05)
                left = pids_in(inside)
        for ns in self._ns.values():
            ns.close()
        for name in self.ns_names.values():
            with contextlib.suppress(OSError):
                pr_netns.remove(name)
        shutil.rmtree(self.dir, ignore_errors=True)

    # --- parts ----------------------------------------------------------------------------------

    def _network(self) -> None:
        for name in self.ns_names.values():
            pr_netns.create(name)
        self._ns = {k: NetNS(v) for k, v in self.ns_names.items()}
        for ns in self._ns.values():
            ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")
        ctl = self._ns["ctl"]
        ctl.link("add", ifname="br0", kind="bridge")
        br = ctl.link_lookup(ifname="br0")[0]
        ctl.addr("add", index=br, address=CTL[1], prefixlen=24)
        ctl.link("set", index=br, state="up")
        for i, (n, addr) in enumerate(self.nodes.items()):
            port = f"p{i}"
            ctl.link("add", ifname=port, kind="veth", peer={"ifname": "eth0", "net_ns_fd": self.ns_names[n]})
            ip = ctl.link_lookup(ifname=port)[0]
            ctl.link("set", index=ip, master=br, state="up")
            node = self._ns[n]
            eth = node.link_lookup(ifname="eth0")[0]
            node.addr("add", index=eth, address=addr, prefixlen=24)
            node.link("set", index=eth, state="up")

    def _munge(self) -> None:
        d = self.socket.parent
        d.mkdir(mode=0o755)
        key = self.dir / "munge.key"
        key.write_bytes(secrets.token_bytes(128))
        key.chmod(0o600)
        munge = pwd.getpwnam("munge")
        for p in (d, key):
            os.chown(p, munge.pw_uid, munge.pw_gid)
        self.dir.chmod(0o755)
        argv = [
            "munged",
            "-F",
            "--force",
            f"--socket={self.socket}",
            f"--key-file={key}",
            f"--pid-file={d / 'munged.pid'}",
            f"--log-file={d / 'munged.log'}",
            f"--seed-file={d / 'munged.seed'}",
        ]
        self._procs["munged"] = proc.spawn(
            ["runuser", "-u", "munge", "--", *argv],
            stdout=subprocess.DEVNULL,
            stderr=open(self.dir / "munged.err", "wb"),  # noqa: SIM115 - the child keeps it
        )
        deadline = time.monotonic() + 10
        while not self.socket.exists():
            if self._procs["munged"].poll() is not None or time.monotonic() > deadline:
                raise SlurmError(f"munged did not start: {(self.dir / 'munged.err').read_text()[-500:]}")
            time.sleep(0.05)

    def _config(self) -> None:
        d = self.dir
        (d / "state").mkdir()
        for n in self.nodes:
            (d / f"spool-{n}").mkdir()
        nodes = "\n".join(
            f"NodeName={n} NodeAddr={a} CPUs=2 RealMemory=1000 State=UNKNOWN" for n, a in self.nodes.items()
        )
        names = ",".join(self.nodes)
        self.conf.write_text(
            f"""ClusterName=holdover
SlurmctldHost={CTL[0]}({CTL[1]})
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={self.socket}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d / "state"}
SlurmdSpoolDir={d}/spool-%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/linear
MpiDefault=none
ReturnToService=2
MessageTimeout=5
SlurmdTimeout=30
{nodes}
PartitionName=gpu Nodes={names} Default=YES MaxTime=INFINITE State=UP
"""
        )

    def _enter(self, where: str) -> list[str]:
        # nsenter, not `ip netns exec`: that mounts a fresh /sys for the namespace, without the
        # cgroup filesystem slurmd looks for.
        return ["nsenter", f"--net=/run/netns/{self.ns_names[where]}"]

    def _start(self, name: str, where: str, argv: list[str]) -> None:
        self._argv[name] = (where, argv)
        host = CTL[0] if where == "ctl" else where
        script = f"hostname {host} && exec {' '.join(argv)}"
        self._procs[name] = proc.spawn(
            [*self._enter(where), "unshare", "--uts", "--", "sh", "-c", script],
            env={**os.environ, "SLURM_CONF": str(self.conf)},
            stdout=subprocess.DEVNULL,
            stderr=open(self.dir / f"{name}.err", "wb"),  # noqa: SIM115 - the child keeps it
        )

    # --- using it -------------------------------------------------------------------------------

    def run(self, *argv: str, timeout: float = 15) -> str:
        """A Slurm command in the controller's namespace; its stdout, or SlurmError with its words."""
        r = proc.run_sync(
            [*self._enter("ctl"), *argv],
            timeout=timeout,
            env={**os.environ, "SLURM_CONF": str(self.conf)},
            cwd=self.dir,  # sbatch writes its default slurm-%j.out where it was submitted: here, not the caller's tree
            stderr_apart=True,
        )
        if not r.ok:
            raise SlurmError(f"{' '.join(argv)}: {r.describe()}: {(r.stderr or r.output).strip()[-500:]}")
        return r.output

    def states(self) -> dict[str, tuple[str, str]]:
        """Each node's state and reason, as sinfo says them (idle, drained, draining, mixed...)."""
        out = self.run("sinfo", "-h", "-N", "-o", "%N|%T|%E")
        return {n: (s, why) for n, s, why in (line.split("|", 2) for line in out.splitlines() if line)}

    def wait_idle(self, nodes: set[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            for name, p in self._procs.items():
                if p.poll() is not None:  # a daemon that died at start says why
                    err = (self.dir / f"{name}.err").read_text(errors="replace")[-800:]
                    raise SlurmError(f"{name} exited {p.returncode}: {err}")
            with contextlib.suppress(SlurmError):
                last = self.states()
                if all(last.get(n, ("",))[0] == "idle" for n in nodes):
                    return
            time.sleep(0.3)
        raise SlurmError(f"nodes {sorted(nodes)} not idle within {timeout:.0f} s: {last}")

    def log(self, name: str) -> str:
        p = self.dir / name
        return p.read_text(errors="replace") if p.exists() else ""
