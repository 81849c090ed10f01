"""`holdover diagnose`: the field report's first-five-minutes checklist, done for the operator on
every outage and on demand. Hop by hop for each uplink: the link (carrier, operstate), its
gateway, each probe target; then DNS through each configured resolver, an optional cloud metadata
endpoint, the kernel's recent words about the NICs, and the dongle. Each check is pass / warn /
fail; the first failing hop of each uplink is named.

It only reads and probes (probes bound to each uplink, as the failover's are): no route, link or
sysctl is changed.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any

from holdover import events, proc
from holdover.node import probe
from holdover.node.checks import FAIL, PASS, WARN, Check
from holdover.node.dongle import Dongle, DongleError
from holdover.node.netlink import in_netns
from holdover.settings import Settings


def links(ipr: Any, devs: list[str]) -> dict[str, dict[str, Any]]:
    """Carrier and operstate of each interface, from the kernel (None for one that is not there)."""
    out: dict[str, dict[str, Any]] = {}
    for dev in devs:
        idx = ipr.link_lookup(ifname=dev)
        if not idx:
            out[dev] = {"present": False}
            continue
        link = ipr.link("get", index=idx[0])[0]
        out[dev] = {
            "present": True,
            "carrier": bool(link.get_attr("IFLA_CARRIER")),
            "operstate": link.get_attr("IFLA_OPERSTATE"),
        }
    return out


def _dns_query(name: str) -> tuple[bytes, int]:
    ident = secrets.randbits(16)
    qname = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\x00"
    return struct.pack(">HHHHHH", ident, 0x0100, 1, 0, 0, 0) + qname + struct.pack(">HH", 1, 1), ident


async def dns(server: str, name: str, timeout: float, netns: str | None) -> tuple[str, str]:
    """Ask `server` for NAME's A record over UDP: (status, what happened)."""
    query, ident = _dns_query(name)
    with in_netns(netns):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        t0 = time.monotonic()
        host, _, port = server.partition(":")
        await loop.sock_sendto(s, query, (host, int(port or 53)))
        async with asyncio.timeout(timeout):
            reply = await loop.sock_recv(s, 512)
        ms = (time.monotonic() - t0) * 1000
        if len(reply) < 12 or struct.unpack(">H", reply[:2])[0] != ident:
            return FAIL, "an answer that is not ours"
        rcode = reply[3] & 0x0F
        return (PASS, f"answered in {ms:.0f} ms") if rcode == 0 else (WARN, f"answered rcode {rcode} in {ms:.0f} ms")
    except TimeoutError:
        return FAIL, f"no answer within {timeout:.1f} s"
    except OSError as e:
        return FAIL, e.strerror or str(e)
    finally:
        s.close()


def kernel_words(devs: list[str], lines: int = 5) -> list[str]:
    """The kernel's last lines about these interfaces (dmesg; empty where it may not be read)."""
    r = proc.run_sync(["dmesg", "--ctime"], timeout=10, stderr_apart=True)
    if not r.ok:
        return []
    about = [ln for ln in r.output.splitlines() if any(d in ln for d in devs)]
    return about[-lines:]


Netlink = Callable[..., Awaitable[Any]]  # runs fn(*args) where the routing socket may be used


async def diagnose(cfg: Settings, ipr: Any, netlink: Netlink, timeout: float = 1.0) -> list[Check]:
    """The report. `ipr` is the node's routing socket (the failover's namespace in tests), used
    only through `netlink` (pyroute2 gives each thread its own socket: the failover's one thread)."""
    fo = cfg.failover
    out: list[Check] = []
    devs = [u.dev for u in fo.uplinks]
    state = await netlink(links, ipr, devs) if devs else {}
    targets = [(h, int(p)) if c else (p, None) for h, c, p in (t.rpartition(":") for t in fo.targets)]
    for u in fo.uplinks:
        st = state[u.dev]
        name = f"{u.name} ({u.dev})"
        if not st["present"]:
            out.append(Check(f"{name}: link", FAIL, f"no interface {u.dev}: unplugged?"))
            continue
        if not st["carrier"]:
            out.append(Check(f"{name}: link", FAIL, f"no carrier (operstate {st['operstate']}): cable or modem"))
            continue
        out.append(Check(f"{name}: link", PASS, f"carrier, operstate {st['operstate']}"))
        gw = await probe.icmp(u.dev, u.gateway, timeout, fo.netns)
        if gw is None:
            out.append(Check(f"{name}: gateway {u.gateway}", FAIL, "no echo reply: the first failed hop"))
            continue
        out.append(Check(f"{name}: gateway {u.gateway}", PASS, f"echo in {gw:.1f} ms"))
        rtts = await asyncio.gather(
            *[
                probe.tcp(u.dev, h, p, timeout, fo.netns) if p else probe.icmp(u.dev, h, timeout, fo.netns)
                for h, p in targets
            ]
        )
        for (h, p), rtt in zip(targets, rtts, strict=True):
            where = f"{h}:{p}" if p else h
            out.append(
                Check(
                    f"{name}: target {where}",
                    PASS if rtt is not None else FAIL,
                    f"{rtt:.1f} ms" if rtt is not None else "no answer beyond the gateway: upstream of it",
                )
            )
    for server in cfg.diagnose.resolvers:
        status, what = await dns(server, cfg.diagnose.name, timeout, fo.netns)
        out.append(Check(f"DNS {server} ({cfg.diagnose.name})", status, what))
    if cfg.diagnose.metadata_url:
        out.append(await _metadata(cfg.diagnose.metadata_url, timeout))
    words = await asyncio.to_thread(kernel_words, devs) if devs else []
    if words:
        out.append(Check("kernel messages about the uplinks", WARN, " | ".join(words)))
    if cfg.dongle.enabled:
        try:
            d = await Dongle(cfg.dongle).astatus()
            status = PASS if d.connected else WARN
            out.append(Check("4G dongle", status, f"{d.connection}, {d.operator}, RSSI {d.rssi}, SINR {d.sinr}"))
        except DongleError as e:
            out.append(Check("4G dongle", FAIL, str(e)))
    return out


async def _metadata(url: str, timeout: float) -> Check:
    import urllib.request

    def get() -> int:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status

    try:
        code = await asyncio.to_thread(get)
        return Check(f"cloud metadata {url}", PASS, f"HTTP {code}")
    except Exception as e:  # any failure to reach it is the finding
        return Check(f"cloud metadata {url}", FAIL, str(e)[:200])


def first_failures(findings: list[Check]) -> list[str]:
    """One line per failed check, for an alert's body."""
    return [f"{f.name}: {f.detail}" for f in findings if f.status == FAIL]


def summary(findings: list[Check]) -> dict[str, Any]:
    # The diagnosis event and --json keep their own key names (check, status, detail): journals hold them.
    findings_out = [{"check": f.name, "status": f.status, "detail": f.detail} for f in findings]
    return {"findings": findings_out, "failed": first_failures(findings)}


class Diagnosis:
    """A Reaction: on every outage (failover, the uplink lost), the report, journaled as a
    `diagnosis` event whose alert carries the failed checks."""

    TRIGGERS = ("failover", "uplink_lost")

    def __init__(self, cfg: Settings, failover: Any, emit: Callable[[str, dict[str, Any]], object]) -> None:
        self.cfg = cfg
        self.failover = failover
        self.emit = emit
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        pass

    def on_event(self, event: Any) -> None:
        if event.kind in self.TRIGGERS:
            t = asyncio.get_running_loop().create_task(self._run(event.kind))
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def _run(self, why: str) -> None:
        findings = await diagnose(self.cfg, self.failover.ipr, self.failover.netlink)
        failed = first_failures(findings)
        self.emit(
            events.DIAGNOSIS,
            {
                "after": why,
                "first": failed[0] if failed else "every check passed",
                "failed": "; ".join(failed) or "none",
                **summary(findings),
            },
        )

    async def close(self) -> None:
        await events.cancel(*self._tasks)
