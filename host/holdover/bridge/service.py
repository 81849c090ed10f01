"""The host bridge: messages in from MQTT, through the gate, to the journal, state and hooks."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from holdover import events
from holdover.bridge import commands as command
from holdover.bridge.alerts import Alerts
from holdover.bridge.gaps import Gaps
from holdover.bridge.gate import Gate, Verdict
from holdover.bridge.history import UpsHistory
from holdover.bridge.hooks import HookRunner
from holdover.bridge.mqtt_link import Inbound, MqttLink
from holdover.bridge.node_report import NodeReport
from holdover.bridge.nut_serve import NutServe
from holdover.bridge.presence import Presence
from holdover.bridge.serial_link import SerialLink
from holdover.bridge.site import Site
from holdover.cluster.circuits import Circuits
from holdover.cluster.peers import PeerWatch
from holdover.events import Reaction
from holdover.firmware import protocol
from holdover.journal import Event, Journal
from holdover.node.bonding import BondWatch
from holdover.node.cadence import Cadence
from holdover.node.datacap import DataCap
from holdover.node.diagnose import Diagnosis
from holdover.node.dongle import Dongle, dial
from holdover.node.rescue import Rescuer, no_runtime
from holdover.node.systemd import Notifier
from holdover.node.ups import UpsReading, UpsWatch
from holdover.settings import Settings

if TYPE_CHECKING:
    from holdover.node.failover import Failover

# What runs beside the bridge on its loop while it runs (entered at start, left as it stops).
Beside = Callable[["Bridge"], contextlib.AbstractAsyncContextManager[None]]
log = logging.getLogger("holdover.bridge")
NODE = protocol.NODE  # the "sentinel" id of events about this machine itself


@dataclass
class SentinelView:
    sid: str
    status: str | None = None
    state: dict[str, Any] | None = None
    last_event: str | None = None
    events: int = 0
    rejected: int = 0
    duplicates: int = 0
    last_ack: dict[str, Any] | None = None
    uplink_down: bool = False  # its site's internet, by its last uplink event


@dataclass
class Bridge:
    settings: Settings
    on_verdict: Callable[[Verdict], None] | None = None
    on_hook: Callable[[dict], None] | None = None
    sentinels: dict[str, SentinelView] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A journal that cannot be opened is a stand-in in memory, tried again: the bridge still acts.
        self.journal = Journal(self.settings.journal.path, standin=True)
        self.gaps = Gaps(lambda k: k in self.journal.held or self.journal.event_source(*k) is not None)
        self._journal_said: str | None = None  # the breakage journal_broken was raised for
        self.gate = Gate(self.settings.keys(), self.journal)
        self.hooks = HookRunner(self.settings.hooks, self.journal, self.on_hook)
        # The host's UPS sets the rescue's deadline; without one it is protect.runtime_default, a guess.
        self.ups_history = UpsHistory(self.journal)
        self.ups = (
            UpsWatch(self.settings.ups, self.node_event, on_read=self._ups_read) if self.settings.ups.enabled else None
        )
        runtime = self.ups.runtime if self.ups is not None else no_runtime
        self.rescuer = Rescuer(self.settings.protect, self.journal, self._react, runtime)
        dongle = Dongle(self.settings.dongle) if self.settings.dongle.enabled else None
        channels = bool(self.settings.alerts.channels)
        self.site = Site(self.settings.node, channels) if channels and self.settings.alerts.once_per_site else None
        self.alerts = Alerts(
            self.settings.alerts,
            self.journal,
            self._publish_alert,
            wan_down=self.wan_down,
            dongle=dongle,
            elsewhere=self.site.elsewhere if self.site is not None else lambda: None,
        )
        # Every accepted event goes to each of these, in order; a new capability appends itself.
        self.reactions: list[Reaction] = [self.hooks, self.rescuer, self.alerts]
        if self.settings.protect.enabled and self.settings.protect.max_loss_min:
            self.reactions.append(Cadence(self.settings.protect, runtime, self.node_event, self.rescuer.in_outage))
        if self.ups is not None:
            self.reactions.append(self.ups)
        if self.settings.nut_server.serve:
            sids = [x.id for x in self.settings.sentinels]
            self.reactions.append(NutServe(self.settings.nut_server, sids, self.journal, self.ups))
        self.failover: Failover | None = None
        fo = self.settings.failover
        if fo.uplinks:
            # pyroute2 (9 MB resident) only where there are uplinks to fail over: a site's node bridges have none.
            from holdover.node.failover import Failover
            from holdover.node.hotplug import Hotplug
            from holdover.node.netlink import open_handle

            # The routing table of the namespace configured (tests), else this machine's own.
            self.failover = Failover(
                fo,
                open_handle(fo.netns),
                self.node_event,
                on_state=self._node_uplinks,
                prepare=dial(dongle, self.settings.dongle.uplink) if dongle else None,
            )
            self.reactions.append(self.failover)
            self.reactions.append(Diagnosis(self.settings, self.failover, self.node_event))
            self.reactions.append(Hotplug(fo.netns, self.node_event, on_link=self.failover.link))
            ds = self.settings.dongle
            if ds.enabled and ds.data_cap_mb:
                self.reactions.append(DataCap(ds, self.failover, self.journal, self.node_event, dongle))
        bonds = self.settings.bonding
        if bonds.enabled and (bonds.proc / "net" / "bonding").is_dir():
            self.reactions.append(BondWatch(bonds, self.node_event))
        self.circuits = (
            Circuits(self.settings, self.node_event, journal=self.journal) if self.settings.slurm.enabled else None
        )
        self.peers = PeerWatch(self.settings.cluster, self.node_event) if self.settings.cluster.peers else None
        if self.peers is not None:
            self.reactions.append(self.peers)
        if self.circuits is not None:
            self.reactions.append(self.circuits)
        self._uplink_active: str | None = None  # from failover's last state
        self._uplink_heard = False  # a state from failover yet: before one, None is not "down"
        self.node_report = NodeReport(
            self.settings,
            self.journal,
            self._publish,
            self.ups,
            self.rescuer,
            lambda: (self._uplink_heard, self._uplink_active),
            self.node_event,
        )
        self.reactions.append(self.node_report)
        silent = {sc.url: sc.silent_after_s for sc in self.settings.serial}
        self.presence = Presence(self.journal, self._host_event, silent)
        self.queue: asyncio.Queue[Inbound] = asyncio.Queue()
        self._stop = asyncio.Event()
        self.link: MqttLink | None = None
        self.serial: list[SerialLink] = []

    def view(self, sid: str) -> SentinelView:
        return self.sentinels.setdefault(sid, SentinelView(sid))

    def handle(self, item: Inbound) -> Verdict:
        if item.topic is None:
            v = self.gate.line(item.source, item.payload)
        else:
            v = self.gate.mqtt(item.topic, item.payload, item.retained)
        if v.sid is not None:
            view = self.view(v.sid)
            if item.port is not None and (v.accepted or v.reason == protocol.DUPLICATE):
                self.presence.heard(v.sid, item.port)
            if v.reason == protocol.DUPLICATE:
                view.duplicates += 1
            elif not v.accepted:
                view.rejected += 1
            elif v.ack is not None:
                view.last_ack = v.ack["data"]
                log.info("ack from %s: %s", v.sid, v.ack["data"])
            elif v.relay_set is not None:
                self._relay_set(v.sid, *v.relay_set)
            elif v.status is not None:
                view.status = v.status
                self.presence.status(v.sid, v.status, item.retained)
            elif v.state is not None:
                view.state = v.state["data"]
            elif v.event is not None:
                view.events += 1
                view.last_event = v.event.kind
                if v.event.kind in (protocol.UPLINK_LOST, protocol.UPLINK_RESTORED):
                    view.uplink_down = v.event.kind == protocol.UPLINK_LOST  # before the alert is made
                log.info("event %s from %s (boot %s seq %d)", v.event.kind, v.sid, v.event.boot, v.event.seq)
                self.gaps.arrived(v.event)
                if not self._superseded(v.event):
                    self._react(v.event)
        if v.receipt is not None and v.sid is not None:
            self._receipt(v.sid, v.receipt, item)
        if self.journal.broken and self._journal_said is None:
            self._journal_watch_once()
        if self.on_verdict:
            self.on_verdict(v)
        return v

    JOURNAL_RETRY_S = 2.0

    def _journal_watch_once(self) -> None:
        """Say once that the journal broke (critical, to people, not needing the journal), and try
        it again; once it takes writes, what was held is journaled and that is said too."""
        j = self.journal
        if j.broken and self._journal_said is None:
            self._journal_said = j.broken
            self.node_event(events.JOURNAL_BROKEN, {"detail": j.broken, "path": str(j.path)})
        if j.broken and (n := j.recover()) is not None:
            self._journal_said = None
            self.node_event(events.JOURNAL_RESTORED, {"held": n, "dropped": j.dropped, "path": str(j.path)})

    RETENTION_EVERY_S = 3600.0

    def prune(self) -> None:
        """Heartbeats and refused messages past [journal] keep_routine_days go, so the journal's
        size is bounded by its outages, not by the sentinels' 2,880 heartbeats a day each."""
        days = self.settings.journal.keep_routine_days
        if not days or not self.journal.durable or self.journal.broken:
            return
        try:
            n, r = self.journal.prune_routine(time.time() - days * 86400)
        except (sqlite3.Error, OSError) as e:
            log.warning("journal retention: %s (tried again in an hour)", e)
            return
        if n or r:
            log.info("journal retention: %d heartbeat(s), %d refused message(s) older than %g days deleted", n, r, days)

    async def _retention(self) -> None:
        while True:
            self.prune()
            await asyncio.sleep(self.RETENTION_EVERY_S)

    async def _journal_watch(self) -> None:
        while True:
            await asyncio.sleep(self.JOURNAL_RETRY_S)
            try:
                self._journal_watch_once()
                self.gaps.judge()
            except Exception:  # the watch must outlive anything the journal throws at it
                log.exception("journal watch")

    def _receipt(self, sid: str, ident: tuple[str, int], item: Inbound) -> None:
        """Tell the sentinel its event is journaled, by the channel it came: it keeps sending until told."""
        payload = command.build_receipt(self.settings.keys()[sid], sid, [ident])
        if item.port is None:
            if self.link is not None:
                self.link.publish(protocol.topic(sid, protocol.CMD), payload)
            return
        for s in self.serial:
            if s.url == item.port:
                # A serial write waits for the UART; off the loop, which must keep taking events.
                asyncio.get_running_loop().run_in_executor(None, s.write, payload)

    def _ups_read(self, r: UpsReading) -> None:
        with self.journal.guard(f"keeping the history of UPS {self.settings.ups.name}"):
            self.ups_history.record(self.settings.ups.name, r.runtime_s, r.charge, r.on_battery)

    def node_event(self, kind: str, data: dict[str, Any]) -> Event:
        """An event about this machine (failover, a checkpoint asked for): journaled under NODE,
        then handed to every reaction."""
        event = self.journal.host_event(NODE, kind, data)
        self._react(event)
        return event

    def _node_state(self, node: str, payload: bytes) -> None:
        # Unsigned, from a node's bridge: read for what it says of runs and whether it alerts, and
        # nothing acts on it but the wait for a signalled job's checkpoints and the choice of the
        # site's alerting bridge; a garbled one is named and dropped.
        try:
            body = json.loads(payload)
            if not isinstance(body, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            log.warning("node %s's state is not readable (%s): %r", node, e, payload[:80])
            return
        if self.site is not None:
            self.site.state(node, body)
        if self.circuits is not None:
            self.circuits.node_state(node, body)

    def _publish(self, topic: str, payload: bytes, retain: bool) -> None:
        if self.link is not None:
            self.link.publish(topic, payload, retain=retain)

    def _publish_alert(self, text: str) -> bool:
        if self.link is None:
            return False
        self.link.publish(protocol.ALERTS, text.encode())
        return self.link.connected.is_set()

    def _node_uplinks(self, state: dict[str, Any]) -> None:
        """The node's uplink state, retained on MQTT for dashboards and phone apps on the LAN."""
        self._uplink_active = state.get("active")
        self._uplink_heard = True
        if self.link is not None:
            body = {"node": self.settings.failover.node, "ts": round(time.time(), 3), **state}
            topic = protocol.node_topic(self.settings.failover.node, protocol.UPLINK)
            self.link.publish(topic, json.dumps(body).encode(), retain=True)

    def _superseded(self, event: Event) -> bool:
        """A state's event that came after a later one of its family (a resend, out of order after
        this bridge was away): acting on it would open a cut that is over. Journaled, not acted on."""
        family = next((f for f in protocol.FAMILIES if event.kind in f), None)
        if family is None or (later := self.journal.later(event.sid, event.boot, event.seq, family)) is None:
            return False
        log.warning(
            "%s: %s (seq %d) came after seq %d of its kind: journaled, not acted on (that state has passed)",
            event.sid,
            event.kind,
            event.seq,
            later,
        )
        return True

    def _host_event(self, sid: str, kind: str, data: dict[str, Any]) -> None:
        """An event the bridge raises about a sentinel (its presence): journaled, then to every reaction."""
        self._react(self.journal.host_event(sid, kind, data))

    def _react(self, event: Event) -> None:
        for r in self.reactions:
            try:
                r.on_event(event)
            except Exception:  # one broken reaction must not keep the event from the others
                log.exception("reaction %s failed on %s from %s", type(r).__name__, event.kind, event.sid)

    def send_command(self, sid: str, op: str, ms: int = 0, by: str = "api") -> str:
        """Sign and send a relay command for the sentinel's current boot; returns its id (the ack
        carries it). Journaled with who asked (`by`): a relay cuts a modem's power."""
        held = self.journal.sentinel(sid)
        if held is None or not held["boot"]:
            raise command.CommandError(f"{sid}: no state heard yet, so its boot is unknown")
        payload, cid = command.build(self.settings.keys()[sid], sid, held["boot"], op, ms)
        if self.link is not None and self.link.connected.is_set():
            self.link.publish(protocol.topic(sid, protocol.CMD), payload)
        elif not any(s.write(payload) for s in self.serial):
            raise command.CommandError(f"{sid}: neither the broker nor a serial port is reachable")
        self.node_event(events.RELAY_COMMANDED, {"sentinel": sid, "op": op, "ms": ms, "command": cid, "by": by})
        return cid

    def _relay_set(self, sid: str, op: str, ms: int) -> None:
        if not self.settings.mqtt.ha_commands:
            log.warning("relay/set for %s ignored: mqtt.ha_commands is off", sid)
            return
        try:
            # Only Home Assistant's login may publish relay/set where broker-config wrote the ACL.
            cid = self.send_command(sid, op, ms, by=f"home assistant ({protocol.topic(sid, protocol.RELAY_SET)})")
            log.info("Home Assistant: relay %s%s for %s (command %s)", op, f" {ms} ms" if ms else "", sid, cid)
        except command.CommandError as e:
            log.warning("Home Assistant relay/set not forwarded: %s", e)

    def stop(self) -> None:
        self._stop.set()

    async def run(self, beside: Beside | None = None) -> None:
        """The bridge until stop(); `beside`, what is served next to it on this loop for as long
        (the web layer's API and dashboard: web.server.serving), which this wing never imports."""
        async with beside(self) if beside is not None else contextlib.nullcontext():
            await self._run()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            # Not possible off the main thread, where the demo and tests run a bridge.
            with contextlib.suppress(RuntimeError, ValueError):
                loop.add_signal_handler(sig, self.stop)
        self.link = MqttLink(
            self.settings.mqtt,
            self.queue,
            loop,
            will=(self.node_report.status_topic, protocol.OFFLINE.encode()),
            # Beside slurmctld: every node's state, to know when a signalled job is saved everywhere;
            # with alert channels, every node's state and status, to know which bridge alerts.
            subscribe=(self.node_report.press_topic,)
            + ((protocol.node_topic("+", protocol.STATE),) if self.circuits or self.site else ())
            + ((protocol.node_topic("+", protocol.STATUS),) if self.site else ()),
            on_connect=self.node_report.connected,
            client_id=self.settings.client_id,
        )
        self.link.start()
        for sc in self.settings.serial:
            link = SerialLink(sc.url, sc.baud, self.queue, loop)
            link.start()
            self.serial.append(link)
        for r in self.reactions:
            r.start()
        self.presence.start()
        journal_watch = asyncio.create_task(self._journal_watch())
        retention = asyncio.create_task(self._retention())
        log.info("bridge up: %d sentinel(s), %d hook(s)", len(self.settings.sentinels), len(self.settings.hooks))
        notifier = Notifier()  # systemd's Type=notify; nothing outside systemd
        ready = asyncio.create_task(self._ready(notifier))
        watchdog = asyncio.create_task(notifier.watchdog(self.health, self.summary))
        stopper = asyncio.create_task(self._stop.wait())
        try:
            while not self._stop.is_set():
                getter = asyncio.create_task(self.queue.get())
                done, _ = await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    item = getter.result()
                    node = protocol.parse_node_topic(item.topic) if item.topic else None
                    if node is None:
                        self.handle(item)
                    elif item.topic == self.node_report.press_topic:
                        self.node_report.pressed(item.payload, item.retained)  # not a sentinel's: no gate
                    elif node[1] == protocol.STATE and (self.circuits or self.site):
                        self._node_state(node[0], item.payload)
                    elif node[1] == protocol.STATUS and self.site is not None:
                        self.site.status(node[0], item.payload)
                else:
                    getter.cancel()
        finally:
            notifier.send(stopping=1, status="stopping")
            ready.cancel()
            watchdog.cancel()
            stopper.cancel()
            journal_watch.cancel()
            retention.cancel()
            self.link.stop(last=(self.node_report.status_topic, protocol.OFFLINE.encode()))
            for s in self.serial:
                s.stop()
            await self.presence.close()
            # An unfinished rescue stays 'active' in the journal; the next bridge resumes it.
            for r in reversed(self.reactions):
                await r.close()
            self.journal.close()
            notifier.close()
            log.info("bridge stopped")

    READY_WAIT_S = 10.0  # a broker that is down does not hold the bridge's start for longer

    async def _ready(self, notifier: Notifier) -> None:
        """READY=1 once the broker link is up (what `systemctl start` and its status then say), or
        after READY_WAIT_S without it: the rescue needs no broker, so a dead one must not fail the
        start; the status then says so. Its own task: messages are handled meanwhile."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.link.connected.wait(), self.READY_WAIT_S)
        notifier.send(ready=1, status=self.summary())

    def wan_down(self) -> bool:
        """No uplink left to the internet: every uplink of the node's failover failing, or (without
        failover) a sentinel whose uplink watch says lost. Then SMS channels are used."""
        if self.failover is not None:
            return not any(h.up for h in self.failover.health.values())
        return any(v.uplink_down for v in self.sentinels.values())

    QUEUE_WEDGED = 1000  # inbound messages waiting: the loop is not keeping up

    def health(self) -> str | None:
        """What is wrong enough that systemd should restart the bridge, or None. A broker or a
        sentinel being away is not: a restart would not bring them back. Called on the loop, so a
        wedged loop answers nothing at all."""
        if self.queue.qsize() >= self.QUEUE_WEDGED:
            return f"{self.queue.qsize()} inbound messages waiting"
        return None

    def summary(self) -> str:
        online = sum(1 for v in self.sentinels.values() if v.status == protocol.ONLINE)
        broker = "broker connected" if self.link and self.link.connected.is_set() else "broker not connected"
        journal = f", JOURNAL BROKEN ({len(self.journal.held)} held)" if self.journal.broken else ""
        return f"{online}/{len(self.settings.sentinels)} sentinel(s) online, {broker}{journal}"


class BridgeThread:
    """A bridge on an event loop of its own, for the demo and benchmarks that drive it from outside."""

    def __init__(self, bridge: Bridge, beside: Beside | None = None) -> None:
        self.bridge = bridge
        self.beside = beside
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._main, name="holdover-bridge", daemon=True)

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self.bridge.run(self.beside))
        finally:
            # Closed here, in its own thread: left to the garbage collector, a loop was closed at
            # the interpreter's exit after its self-pipe was gone ("Invalid file descriptor: -1",
            # a traceback on stderr; seen once in bench/alert_latency.py's smoke under the suite).
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    def start(self) -> BridgeThread:
        self.thread.start()
        return self

    def stop(self) -> None:
        with contextlib.suppress(RuntimeError):  # the bridge has ended already, and its loop with it
            self.loop.call_soon_threadsafe(self.bridge.stop)
        self.thread.join(15)
