"""Training nodes in network namespaces of their own, joined through a switch namespace, for
multi-node jobs whose link between the nodes can die while each node still reaches the site.

    node0 ns  eth0 10.77.0.2/24 -- veth -- n0 10.77.0.1/24 \\
    node1 ns  eth0 10.77.1.2/24 -- veth -- n1 10.77.1.1/24 -- switch ns (forwards; the site's
    ...                                                       services on 10.77.255.1, its lo)

The switch routes between the nodes (its own ip_forward, set inside it) and holds the site's
services (the broker) on 10.77.255.1, which each node reaches through its gateway. `partition()`
drops every packet forwarded between nodes while leaving each node's traffic to the switch alone:
the inter-node fabric dead, the node's own link and the site's broker still up. Nothing here
touches the namespace the caller runs in; everything is removed on close.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from holdover import events, proc
from holdover.lab.netlab import Namespaces, veth
from holdover.train import registry

SITE = "10.77.255.1"


def node_addr(i: int) -> str:
    return f"10.77.{i}.2"


class ClusterNet(Namespaces):
    def __init__(self, nodes: int = 2) -> None:
        super().__init__()
        tag = f"{os.getpid()}{secrets.token_hex(2)}"
        self.switch_name = f"hsw{tag}"
        self.node_names = [f"hn{i}x{tag}" for i in range(nodes)]

    def _build(self) -> None:
        switch = self.open(self.switch_name)
        switch.addr("add", index=switch.link_lookup(ifname="lo")[0], address=SITE, prefixlen=32)
        for i, name in enumerate(self.node_names):
            node = self.open(name)
            veth(node, "eth0", switch, self.switch_name, f"n{i}", node_addr(i), f"10.77.{i}.1", 24)
            node.route("add", dst="default", gateway=f"10.77.{i}.1")
        self._sh(self.switch_name, "sysctl", "-qw", "net.ipv4.ip_forward=1")

    def _sh(self, ns: str, *argv: str, check: bool = True) -> None:
        r = proc.run_sync(["ip", "netns", "exec", ns, *argv], timeout=10)
        if check and not r.ok:
            raise OSError(f"{' '.join(argv)} in {ns}: {r.describe()}: {r.output.strip()}")

    def argv(self, node: int, argv: list[str]) -> list[str]:
        """`argv` run inside node `node`'s namespace."""
        return ["ip", "netns", "exec", self.node_names[node], *argv]

    def partition(self, on: bool = True) -> None:
        """Drop (on) or stop dropping every packet between nodes, silently, as a dead switch port
        or a dead fabric looks from both ends; a node's traffic to the site is untouched."""
        self._sh(self.switch_name, "nft", "delete", "table", "inet", "partition", check=False)
        if on:
            self._sh(self.switch_name, "nft", "add", "table", "inet", "partition")
            chain = "{ type filter hook forward priority 0 ; policy drop ; }"
            self._sh(self.switch_name, "nft", "add", "chain", "inet", "partition", "between", chain)


class TorchrunJob:
    """`holdover.lab.ddp_trainee` as a 2-node job: one torchrun a node (static rendezvous on node
    0), one gloo rank a node, each node its own checkpoint disk `tmp/nodeN/ckpt` and registry
    `tmp/nodeN/reg`; the workers' JSON lines gathered as they come, stderr in `tmp/nodeN.err`."""

    def __init__(self, net: ClusterNet, tmp: Path, *args: str, port: int | None = None) -> None:
        from holdover.lab.broker import free_port

        port = port or free_port()
        self.tmp = tmp
        self.nodes = range(len(net.node_names))
        self.lines: dict[int, list[dict[str, Any]]] = {n: [] for n in self.nodes}
        self.procs: list[subprocess.Popen[str]] = []
        self.readers: list[threading.Thread] = []
        self.errs = [tmp / f"node{n}.err" for n in self.nodes]
        tmp.mkdir(parents=True, exist_ok=True)
        for n in self.nodes:
            argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(self.nodes))]
            argv += ["--nproc-per-node", "1", "--node-rank", str(n), "--master-addr", node_addr(0)]
            argv += ["--master-port", str(port), "-m", "holdover.lab.ddp_trainee"]
            argv += ["--ckpt", str(self.ckpt(n)), "--registry", str(tmp / f"node{n}" / "reg"), *args]
            # gloo would take the address the hostname resolves to: loopback, inside a namespace
            env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0"}
            with self.errs[n].open("w") as err:
                p = proc.spawn(net.argv(n, argv), env=env, stdout=subprocess.PIPE, stderr=err, text=True)
            self.procs.append(p)
            self.readers.append(threading.Thread(target=self._read, args=(n, p), daemon=True))
            self.readers[-1].start()

    def ckpt(self, node: int) -> Path:
        return self.tmp / f"node{node}" / "ckpt"

    def _read(self, node: int, p: subprocess.Popen[str]) -> None:
        assert p.stdout is not None
        for line in p.stdout:
            if line.startswith("{"):
                self.lines[node].append(json.loads(line))

    def registered(self) -> bool:
        """Every rank's Guard registered with its node's bridge (so the bridge can ask it to save)."""
        return all(registry.read_registrations(self.tmp / f"node{n}" / "reg")[0] for n in self.nodes)

    def step(self, node: int) -> int:
        """The newest step the node's rank completed."""
        return max((x.get("step", 0) for x in self.lines[node]), default=0)

    def digest(self, node: int, step: int) -> str:
        return next(x["digest"] for x in self.lines[node] if x.get("step") == step)

    def kill(self) -> None:
        """Every process of the job, -9: torchrun starts its workers in sessions of their own, so
        killing the agents alone would leave the ranks running."""
        for p in self.procs:
            if p.poll() is None:
                proc.signal_group(p.pid, signal.SIGKILL)
            p.wait(30)
        for n in self.nodes:
            for reg in registry.read_registrations(self.tmp / f"node{n}" / "reg")[0]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(reg.pid, signal.SIGKILL)
                end = time.monotonic() + 30
                while registry.pid_alive(reg.pid) and time.monotonic() < end:
                    time.sleep(0.02)

    def finish(self, timeout: float = 120) -> list[int]:
        """Wait for every torchrun to exit; their exit codes."""
        codes = [p.wait(timeout) for p in self.procs]
        for t in self.readers:
            t.join(10)
        return codes


class NodeBridges:
    """One sentinel, one broker, one bridge a training node, as a site runs them: each bridge
    its own journal `tmp/nodeN.db`, registry `tmp/nodeN/reg` (where TorchrunJob's ranks
    register), node name and MQTT client id. Node 0's bridge is the rig's own (its verdicts
    timestamped as the rig sees them); the others beside it on the same broker and key. They
    reach the broker on the caller's loopback: what they share with the nodes is the registry's
    socket on the node's disk, not the namespaces' links."""

    def __init__(self, tmp: Path, nodes: int = 2, grace: float = 0.5) -> None:
        from holdover.lab.rig import Rig

        self.tmp = tmp
        self.grace = grace
        node0 = self.config(0)
        self.rig = Rig(
            tmp / "site",
            protect=node0["protect"],
            bridge_mqtt=node0["mqtt"],
            bridge_extra={"journal": node0["journal"], "failover": node0["failover"]},
        )
        self.nodes = range(nodes)
        self.others: list[Any] = []

    def config(self, node: int) -> dict[str, Any]:
        """Node `node`'s bridge's settings, less the broker and sentinel the rig provides."""
        return {
            "mqtt": {"client_id": f"holdover-bridge-node{node}"},
            "journal": {"path": str(self.journal(node))},
            "failover": {"node": f"node{node}"},
            "protect": {"registry": str(self.tmp / f"node{node}" / "reg"), "grace": self.grace, "gcore": False},
        }

    def journal(self, node: int) -> Path:
        return self.tmp / f"node{node}.db"

    def start(self) -> NodeBridges:
        from holdover.bridge.service import Bridge, BridgeThread
        from holdover.settings import Settings

        self.rig.start()
        for n in self.nodes[1:]:
            cfg = self.config(n)
            cfg["mqtt"] |= {"host": self.rig.broker.host, "port": self.rig.broker.port}
            cfg["sentinels"] = [{"id": self.rig.sid, "key": self.rig.key}]
            self.others.append(BridgeThread(Bridge(Settings.model_validate(cfg))).start())
        self.rig.wait("boot", 15)
        return self

    def verified(self, node: int) -> list[dict[str, Any]]:
        """The checkpoints node `node`'s bridge verified, oldest first."""
        from holdover.journal import Journal

        if not self.journal(node).exists():
            return []
        with Journal(self.journal(node), readonly=True) as j:
            return [e.data for e in reversed(j.events(kinds=[events.CHECKPOINT_VERIFIED]))]

    def close(self) -> None:
        for b in self.others:
            b.stop()
        self.rig.close()

    def __enter__(self) -> NodeBridges:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
