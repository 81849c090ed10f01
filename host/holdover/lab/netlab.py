"""A node with two uplinks through two ISPs, in network namespaces of its own, for failover tests
and benchmarks.

    node ns                     isp1 ns                           inet ns
    wan0 10.1.0.2/24 -- veth -- e1 10.1.0.1/24  t1 172.16.1.1/30 -- veth -- x1 172.16.1.2/30
    usb0 10.2.0.2/24 -- veth -- e2 10.2.0.1/24  t2 172.16.2.1/30 -- veth -- x2 172.16.2.2/30
                                isp2 ns                           target 198.51.100.1 (TEST-NET-2) on lo

Each ISP namespace forwards between the node and the internet (its own ip_forward, set inside it);
the internet namespace routes each node subnet back through its ISP. The node's default routes: via
10.1.0.1 on wan0 (metric 100, the primary) and via 10.2.0.1 on usb0 (metric 200). Faults are made
where they happen in the field, in the ISP: a link dropped, everything silently dropped (a dead
upstream whose link stays up), a share of packets lost. Every address exists only inside these
namespaces, which are removed on close; nothing here touches the namespace the caller runs in.
"""

from __future__ import annotations

import abc
import contextlib
import os
import secrets
import socket
import threading
from typing import Any, Self

from pyroute2 import NetNS
from pyroute2 import netns as pr_netns

from holdover import proc
from holdover.node.netlink import configured, in_netns

configured()  # before any namespace's socket: pyroute2's forked child must not take our signals

TARGET = "198.51.100.1"
# near: the node's interface; far: the ISP's end facing the node; up/peer: the ISP's link upstream.
PRIMARY = {
    "name": "wan",
    "dev": "wan0",
    "gateway": "10.1.0.1",
    "addr": "10.1.0.2",
    "far": "e1",
    "net": "10.1.0.0",
    "isp": "isp1",
    "up": "t1",
    "up_addr": "172.16.1.1",
    "peer": "x1",
    "peer_addr": "172.16.1.2",
}
BACKUP = {
    "name": "usb",
    "dev": "usb0",
    "gateway": "10.2.0.1",
    "addr": "10.2.0.2",
    "far": "e2",
    "net": "10.2.0.0",
    "isp": "isp2",
    "up": "t2",
    "up_addr": "172.16.2.1",
    "peer": "x2",
    "peer_addr": "172.16.2.2",
}


def veth(a: Any, a_name: str, b: Any, b_ns: str, b_name: str, a_addr: str, b_addr: str, plen: int) -> None:
    """A veth pair from namespace `a` (its end `a_name`) into namespace `b` (named `b_ns`), both ends
    addressed and up."""
    a.link("add", ifname=a_name, kind="veth", peer={"ifname": b_name, "net_ns_fd": b_ns})
    ia, ib = a.link_lookup(ifname=a_name)[0], b.link_lookup(ifname=b_name)[0]
    a.addr("add", index=ia, address=a_addr, prefixlen=plen)
    b.addr("add", index=ib, address=b_addr, prefixlen=plen)
    a.link("set", index=ia, state="up")
    b.link("set", index=ib, state="up")


class Namespaces(abc.ABC):
    """A lab's network namespaces: each made and opened by `open()` inside `_build`, all closed and
    removed on exit, also when the build failed halfway."""

    def __init__(self) -> None:
        self._made: list[tuple[str, Any]] = []

    def __enter__(self) -> Self:
        try:
            self._build()
        except BaseException:
            self.__exit__()
            raise
        return self

    @abc.abstractmethod
    def _build(self) -> None:
        """Make the lab's namespaces (with `open`) and wire them."""

    def open(self, name: str) -> Any:
        """A new namespace `name` with its loopback up, as a pyroute2 handle."""
        pr_netns.create(name)
        ns = NetNS(name)
        self._made.append((name, ns))
        ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")
        return ns

    def __exit__(self, *exc: object) -> None:
        for _name, ns in self._made:
            ns.close()
        for name, _ns in self._made:
            with contextlib.suppress(OSError):
                pr_netns.remove(name)
        self._made = []


class NetLab(Namespaces):
    def __init__(self) -> None:
        super().__init__()
        tag = f"{os.getpid()}{secrets.token_hex(2)}"
        self.node_name = f"hnode{tag}"
        self.inet_name = f"hinet{tag}"
        self.isp_names = {u["isp"]: f"h{u['isp']}{tag}" for u in (PRIMARY, BACKUP)}
        self.node: Any = None
        self.inet: Any = None
        self.isps: dict[str, Any] = {}
        self._servers: list[socket.socket] = []
        self.peers: list[str] = []  # source address of every connection the target accepted

    def _build(self) -> None:
        self.node = self.open(self.node_name)
        self.inet = self.open(self.inet_name)
        self.isps = {isp: self.open(name) for isp, name in self.isp_names.items()}
        for u in (PRIMARY, BACKUP):
            isp, isp_name = self.isps[u["isp"]], self.isp_names[u["isp"]]
            veth(self.node, u["dev"], isp, isp_name, u["far"], u["addr"], u["gateway"], 24)
            veth(isp, u["up"], self.inet, self.inet_name, u["peer"], u["up_addr"], u["peer_addr"], 30)
            isp.route("add", dst="default", gateway=u["peer_addr"])
            self.inet.route("add", dst=u["net"], dst_len=24, gateway=u["up_addr"])
            # The ISP is a router: forwarding on in its own namespace only (`ip netns exec` names it).
            r = proc.run_sync(["ip", "netns", "exec", isp_name, "sysctl", "-qw", "net.ipv4.ip_forward=1"], timeout=10)
            if not r.ok:
                raise OSError(f"ip_forward in {isp_name}: {r.describe()}: {r.output.strip()}")
        self.inet.addr("add", index=self.inet.link_lookup(ifname="lo")[0], address=TARGET, prefixlen=32)
        for u, metric in ((PRIMARY, 100), (BACKUP, 200)):
            oif = self.node.link_lookup(ifname=u["dev"])[0]
            self.node.route("add", dst="default", gateway=u["gateway"], oif=oif, priority=metric)

    def __exit__(self, *exc: object) -> None:
        for s in self._servers:
            s.close()
        super().__exit__(*exc)

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
        """The uplink's ISP drops everything from the node, silently: a dead upstream whose link
        stays up, which is how most outages look from the node (its ARP still answers)."""
        self._nft(uplink, "dead", "" if on else None)

    def lossy(self, uplink: dict[str, str], pct: int) -> None:
        """The uplink's ISP drops `pct` % of the packets the node sends, at random (nftables'
        numgen; this kernel has no netem). 0 removes the rule, 100 drops all."""
        draw = f"numgen random mod 100 < {pct}" if pct < 100 else ""  # 100: every packet, no draw
        self._nft(uplink, "loss", draw if pct else None)

    def _nft(self, uplink: dict[str, str], what: str, match: str | None) -> None:
        """One table per fault and uplink in the ISP's namespace: a drop rule for the node's
        packets that also satisfy `match`, or no table at all for None.

        nft, not pyroute2's nftables API, which does not build numgen expressions; the command
        runs inside the ISP's namespace only (`ip netns exec`)."""
        nft = ["ip", "netns", "exec", self.isp_names[uplink["isp"]], "nft"]
        table = f"{what}_{uplink['isp']}"
        proc.run_sync([*nft, "delete", "table", "ip", table], timeout=10)  # absent the first time: fine
        if match is None:
            return
        for cmd in (
            ["add", "table", "ip", table],
            ["add", "chain", "ip", table, "in", "{ type filter hook prerouting priority 0 ; }"],
            f"add rule ip {table} in ip saddr {uplink['addr']} {match} drop".split(),
        ):
            r = proc.run_sync([*nft, *cmd], timeout=10)
            if not r.ok:
                raise OSError(f"nft {' '.join(cmd)}: {r.describe()}: {r.output.strip()}")

    def link(self, uplink: dict[str, str], up: bool) -> None:
        """The ISP's end of the node's cable: down is a pulled cable or a dead modem."""
        isp = self.isps[uplink["isp"]]
        isp.link("set", index=isp.link_lookup(ifname=uplink["far"])[0], state="up" if up else "down")

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
