"""Uplink failover on the training node: probe every uplink, judge each, switch routes, fail back.

Each uplink is judged like mwan3 judges one (a round is good when `reliability` targets answer;
down after `down` bad rounds in a row, up after `up` good ones) but at sub-second pace, so a
hard loss is acted on in about two seconds instead of mwan3's 25. On top of that, a dwell: no
two switches closer than `dwell`, and fail-back only once the primary has been up for
`failback_after`. A sentinel's `uplink_lost` is evidence, not an order: it starts a probe round
at once rather than waiting for the next tick.

It is a Reaction (events.py): the bridge starts it, hands it every event, and closes it, which
puts the routes back as they were. A start after a crash first removes what a killed process left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyroute2.netlink.exceptions import NetlinkError

from holdover import events
from holdover.firmware import protocol
from holdover.journal import Event
from holdover.node import probe, routes
from holdover.node.netlink import NetlinkThread, configured
from holdover.settings import FailoverSettings

configured()  # before any namespace's socket: pyroute2's forked child must not take our signals

log = logging.getLogger("holdover.failover")


@dataclass
class Health:
    """One uplink's verdict from its probe rounds."""

    down_after: int
    up_after: int
    up: bool | None = None
    since: float = 0.0  # when `up` last changed
    good: int = 0
    bad: int = 0
    rounds: int = 0
    lost: int = 0  # probes that failed, all told
    sent: int = 0
    rtt_ms: float | None = None

    def judge(self, ok: bool, now: float) -> bool:
        """Feed one round; True when the verdict flipped."""
        self.rounds += 1
        if ok:
            self.good, self.bad = self.good + 1, 0
            flip = self.up is not True and self.good >= self.up_after
        else:
            self.bad, self.good = self.bad + 1, 0
            flip = self.up is not False and self.bad >= self.down_after
        if flip:
            self.up = ok
            self.since = now
        return flip


def round_good(rtts: list[float | None], reliability: int) -> bool:
    """A round is good when at least `reliability` targets answered: with several targets, one
    lost probe is not an outage (mwan3's reliability)."""
    return sum(r is not None for r in rtts) >= reliability


PREPARE_EVERY_S = 30.0


@dataclass
class Failover:
    settings: FailoverSettings
    ipr: Any  # a pyroute2 IPRoute or NetNS: the only routing table this touches
    emit: Callable[[str, dict[str, Any]], None]  # (kind, data): a host event to journal and react to
    on_state: Callable[[dict[str, Any]], None] | None = None  # status() whenever a verdict or the route changed
    # Make a backup ready to carry traffic (dial a 4G dongle) when the primary is down and it is
    # not up yet; on a thread of its own, at most once per PREPARE_EVERY_S, never blocking a decision.
    prepare: Callable[[routes.Uplink], None] | None = None
    clock: Callable[[], float] = time.monotonic
    uplinks: list[routes.Uplink] = field(init=False)
    health: dict[str, Health] = field(init=False)
    _task: asyncio.Task[None] | None = None
    _nudge: asyncio.Event = field(default_factory=asyncio.Event)
    repaired: asyncio.Event = field(default_factory=asyncio.Event)  # set once a crash's leftovers are gone
    _switched: float = -1e9
    switches: int = 0
    barred: dict[str, str] = field(default_factory=dict)  # uplink -> why it must not carry traffic
    _on: str | None = None  # the backup our route goes through
    _prepared: float = -1e9

    def __post_init__(self) -> None:
        s = self.settings
        self.uplinks = [routes.Uplink(u.name, u.dev, u.gateway) for u in s.uplinks]
        self.health = {u.name: Health(s.down, s.up) for u in self.uplinks}
        # (ip, port) for TCP, (ip, None) for ICMP
        self._targets = [(h, int(p)) if c else (p, None) for h, c, p in (t.rpartition(":") for t in s.targets)]
        # Every netlink call runs on one thread, its socket made here (netlink.py says why).
        self._nl = NetlinkThread(self.ipr)
        self._nl.run(routes.ours, self.ipr)

    async def netlink(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) on the netlink thread: pyroute2's blocking calls, off the loop."""
        return await self._nl.arun(fn, *args)

    # --- the Reaction interface -------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run())

    def on_event(self, event: Event) -> None:
        if event.kind == protocol.UPLINK_LOST:
            self._nudge.set()  # evidence: probe now, decide on our own figures

    async def close(self) -> None:
        await events.cancel(self._task)
        if await self.netlink(routes.ours, self.ipr):
            await self.netlink(routes.switch_back, self.ipr)
            log.info("stopping: routes back to the system's own")
        self._nl.close()

    # --- probing and deciding -----------------------------------------------------------------------

    async def _round(self, u: routes.Uplink) -> bool:
        s = self.settings
        rtts = await asyncio.gather(
            *[
                probe.tcp(u.dev, h, p, s.timeout, s.netns) if p else probe.icmp(u.dev, h, s.timeout, s.netns)
                for h, p in self._targets
            ]
        )
        h = self.health[u.name]
        h.sent += len(rtts)
        h.lost += sum(r is None for r in rtts)
        answered = [r for r in rtts if r is not None]
        if answered:
            h.rtt_ms = min(answered)
        return round_good(rtts, s.reliability)

    async def run(self) -> None:
        left = await self.netlink(routes.repair, self.ipr)
        if left:
            log.warning("removed %d route(s) a previous run left behind (killed mid-failover?)", left)
        self.repaired.set()
        while True:
            t0 = self.clock()
            verdicts = await asyncio.gather(*[self._round(u) for u in self.uplinks])
            now = self.clock()
            flipped = False
            for u, ok in zip(self.uplinks, verdicts, strict=True):
                if self.health[u.name].judge(ok, now):
                    flipped = True
                    log.info("uplink %s is %s", u.name, "up" if ok else "down")
            try:
                happened = await self.netlink(self.decide, now)
            except (OSError, NetlinkError) as e:  # a refused route change must not end the watch
                log.error("route change failed: %s", e)
                happened = []
            for kind, data in happened:  # on the loop's thread: the journal and hooks live there
                self.emit(kind, data)
            if self.on_state is not None and (flipped or happened):
                with contextlib.suppress(OSError, NetlinkError):
                    self.on_state(await self.netlink(self.status))
            self._nudge.clear()
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancel that arrives as
            # the nudge is set, and close() then waits for this task forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, self.settings.interval - (self.clock() - t0))):
                    await self._nudge.wait()

    def link(self, dev: str, present: bool) -> None:
        """An interface plugged or pulled (hotplug): an uplink whose device is gone is down now,
        not after three failed rounds; one that appears is probed at once."""
        for u in self.uplinks:
            if u.dev == dev and not present:
                h = self.health[u.name]
                h.up, h.good, h.bad, h.since = False, 0, h.down_after, self.clock()
                log.warning("uplink %s: its interface %s is gone", u.name, dev)
        self._nudge.set()

    def bar(self, name: str, on: bool, why: str = "") -> None:
        """Keep traffic off an uplink (its data cap is used up), or let it carry traffic again.
        If our route goes through it, the next round takes it back to the primary."""
        if on and name not in self.barred:
            log.warning("uplink %s barred: %s", name, why)
            self.barred[name] = why
            self._nudge.set()
        elif not on and self.barred.pop(name, None) is not None:
            log.info("uplink %s may carry traffic again", name)

    def decide(self, now: float) -> list[tuple[str, dict[str, Any]]]:
        """Switch if the verdicts say so; returns the events to raise. Blocking (netlink calls):
        the loop runs it on the netlink thread."""
        primary, backups = self.uplinks[0], self.uplinks[1:]
        hp = self.health[primary.name]
        if now - self._switched < self.settings.dwell:
            return []
        current = routes.ours(self.ipr)
        if current and self._on in self.barred:
            why = self.barred[self._on]
            routes.switch_back(self.ipr)
            self._switched, self.switches, self._on = now, self.switches + 1, None
            return [self._event(events.FAILBACK, primary, f"the backup is barred: {why}")]
        if not current and hp.up is False:
            backup = next((b for b in backups if self.health[b.name].up and b.name not in self.barred), None)
            if backup is None and self.prepare is not None and now - self._prepared >= PREPARE_EVERY_S:
                self._prepared = now
                for b in backups:
                    if b.name not in self.barred:
                        threading.Thread(target=self.prepare, args=(b,), name="holdover-prepare", daemon=True).start()
            if backup is None:
                return []  # nothing better to go to; the alert says so (sentinel/uplink events)
            routes.switch_to(self.ipr, backup)
            self._switched, self.switches, self._on = now, self.switches + 1, backup.name
            return [self._event(events.FAILOVER, backup, f"{primary.name} down")]
        if current and hp.up and now - hp.since >= self.settings.failback_after:
            routes.switch_back(self.ipr)
            self._switched, self.switches, self._on = now, self.switches + 1, None
            return [self._event(events.FAILBACK, primary, f"{primary.name} up for {now - hp.since:.0f} s")]
        return []

    def _event(self, kind: str, uplink: routes.Uplink, why: str) -> tuple[str, dict[str, Any]]:
        (log.warning if kind == events.FAILOVER else log.info)("%s to %s: %s", kind, uplink.name, why)
        return kind, {"uplink": uplink.name, "why": why, "uplinks": self.status()["uplinks"]}

    def status(self) -> dict[str, Any]:
        return {
            "active": routes.active(self.ipr, self.uplinks),
            "uplinks": [
                {
                    "name": u.name,
                    "dev": u.dev,
                    "up": self.health[u.name].up,
                    "rtt_ms": self.health[u.name].rtt_ms,
                    "loss_pct": round(100 * self.health[u.name].lost / self.health[u.name].sent, 1)
                    if self.health[u.name].sent
                    else None,
                }
                for u in self.uplinks
            ],
        }


def check(settings: FailoverSettings, ipr: Any) -> dict[str, Any]:
    """One probe round out of every uplink, and which one carries traffic now: what
    `holdover failover status` prints. It judges nothing and changes no route."""
    fo = Failover(settings, ipr, lambda _k, _d: None)

    async def probe_all() -> list[bool]:
        return await asyncio.gather(*[fo._round(u) for u in fo.uplinks])

    answered = asyncio.run(probe_all())
    fo._nl.close()
    out = fo.status()
    for u, ok in zip(out["uplinks"], answered, strict=True):
        u["up"] = ok
    out["holdover_route"] = bool(routes.ours(ipr))
    return out
