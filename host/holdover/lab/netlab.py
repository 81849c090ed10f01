"""A node with two uplinks, in network namespaces of its own, for failover tests and benchmarks.

    node ns                          inet ns
    wan0 10.1.0.2/24 ---- veth ---- e1 10.1.0.1/24
    usb0 10.2.0.2/24 ---- veth ---- e2 10.2.0.1/24     target 198.51.100.1 (TEST-NET-2) on lo

The node's default routes: via 10.1.0.1 on wan0 (metric 100, the primary) and via 10.2.0.1 on
usb0 (metric 200). Every address exists only inside these namespaces, which are removed on close;
nothing here touches the namespace the caller runs in.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import threading
from typing import Any

from pyroute2 import NetNS
from pyroute2 import netns as pr_netns

from holdover import proc
from holdover.node.probe import in_netns

TARGET = "198.51.100.1"
PRIMARY = {"name": "wan", "dev": "wan0", "gateway": "10.1.0.1", "addr": "10.1.0.2", "far": "e1"}
BACKUP = {"name": "usb", "dev": "usb0", "gateway": "10.2.0.1", "addr": "10.2.0.2", "far": "e2"}


class NetLab:
    def __init__(self) -> None:
        tag = f"{os.getpid()}{secrets.token_hex(2)}"
        self.node_name = f"hnode{tag}"
        self.inet_name = f"hinet{tag}"
        self.node: Any = None
        self.inet: Any = None
        self._servers: list[socket.socket] = []
        self.peers: list[str] = []  # source address of every connection the target accepted

    def __enter__(self) -> NetLab:
        pr_netns.create(self.node_name)
        pr_netns.create(self.inet_name)
        self.node = NetNS(self.node_name)
        self.inet = NetNS(self.inet_name)
        for ns in (self.node, self.inet):
            ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")
        for u in (PRIMARY, BACKUP):
            self.node.link("add", ifname=u["dev"], kind="veth", peer={"ifname": u["far"], "net_ns_fd": self.inet_name})
            near = self.node.link_lookup(ifname=u["dev"])[0]
            far = self.inet.link_lookup(ifname=u["far"])[0]
            self.node.addr("add", index=near, address=u["addr"], prefixlen=24)
            self.inet.addr("add", index=far, address=u["gateway"], prefixlen=24)
            self.node.link("set", index=near, state="up")
            self.inet.link("set", index=far, state="up")
        self.inet.addr("add", index=self.inet.link_lookup(ifname="lo")[0], address=TARGET, prefixlen=32)
        for u, metric in ((PRIMARY, 100), (BACKUP, 200)):
            oif = self.node.link_lookup(ifname=u["dev"])[0]
            self.node.route("add", dst="default", gateway=u["gateway"], oif=oif, priority=metric)
        return self

    def __exit__(self, *exc: object) -> None:
        for s in self._servers:
            s.close()
        for ns in (self.node, self.inet):
            if ns is not None:
                ns.close()
        for name in (self.node_name, self.inet_name):
            with contextlib.suppress(OSError):
                pr_netns.remove(name)

    # --- the internet side ------------------------------------------------------------------------

    def serve(self, *ports: int) -> None:
        """TCP targets in the internet namespace that record who connected."""
        for port in ports:
            self._serve(port)

    def _serve(self, port: int) -> None:
        with in_netns(self.inet_name):
            s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((TARGET, port))
        s.listen(128)
        self._servers.append(s)

        def accept() -> None:
            while True:
                try:
                    c, (peer, _p) = s.accept()
                except OSError:
                    return
                self.peers.append(peer)
                c.close()

        threading.Thread(target=accept, daemon=True).start()

    def silence(self, uplink: dict[str, str], on: bool = True) -> None:
        """The uplink's far end drops everything back to the node, silently: a dead upstream whose
        link stays up (a blackhole route for the node's address on that side)."""
        self.inet.route("add" if on else "del", dst=uplink["addr"], dst_len=32, type="blackhole")

    def lossy(self, uplink: dict[str, str], pct: int) -> None:
        """Drop `pct` % of the packets the node sends through this uplink, at random (nftables'
        numgen, on the far side; this kernel has no netem). 0 removes the rule, 100 drops all.

        nft, not pyroute2's nftables API, which does not build numgen expressions; the command
        runs inside the internet namespace only (`ip netns exec`)."""
        nft = ["ip", "netns", "exec", self.inet_name, "nft"]
        table = f"loss_{uplink['far']}"
        proc.run_sync([*nft, "delete", "table", "ip", table], timeout=10)  # absent the first time: fine
        if not pct:
            return
        draw = f"numgen random mod 100 < {pct}" if pct < 100 else ""  # 100: every packet, no draw
        for cmd in (
            ["add", "table", "ip", table],
            ["add", "chain", "ip", table, "in", "{ type filter hook prerouting priority 0 ; }"],
            f"add rule ip {table} in ip saddr {uplink['addr']} {draw} drop".split(),
        ):
            r = proc.run_sync([*nft, *cmd], timeout=10)
            if not r.ok:
                raise OSError(f"nft {' '.join(cmd)}: {r.describe()}: {r.output.strip()}")

    def link(self, uplink: dict[str, str], up: bool) -> None:
        idx = self.inet.link_lookup(ifname=uplink["far"])[0]
        self.inet.link("set", index=idx, state="up" if up else "down")

    # --- the node side ----------------------------------------------------------------------------

    def connect_from_node(self, port: int, timeout: float = 1.0) -> str | None:
        """Open a connection from the node the way any program would (no interface bound): the
        source address says which uplink carried it. None if it did not get through."""
        with in_netns(self.node_name):
            c = socket.socket()
        c.settimeout(timeout)
        try:
            c.connect((TARGET, port))
            return c.getsockname()[0]
        except OSError:
            return None
        finally:
            c.close()
