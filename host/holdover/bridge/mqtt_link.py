"""paho-mqtt 2.x, running its own network thread, feeding an asyncio queue."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from holdover.firmware import protocol
from holdover.settings import MqttSettings

log = logging.getLogger("holdover.mqtt")

SESSION_EXPIRY_S = 7 * 24 * 3600
SUBSCRIPTIONS = [
    protocol.topic("+", leaf)
    for leaf in (protocol.STATUS, protocol.STATE, protocol.EVENT, protocol.CMD_ACK, protocol.RELAY_SET)
]


# A broker that takes a client's id for another connection closes the older one at once; a link
# that lasted longer than this was cut by something else.
TAKEN_OVER_S = 5.0


class _Client(paho.Client):
    """paho's client, keeping the reason a connect failed (its loop swallows the OSError)."""

    last_error: OSError | None = None

    def reconnect(self) -> paho.MQTTErrorCode:
        try:
            rc = super().reconnect()
        except OSError as e:
            self.last_error = e
            raise
        self.last_error = None
        return rc


@dataclass(frozen=True)
class Inbound:
    topic: str | None  # None for a serial line, which has no topic
    payload: bytes
    retained: bool
    rx: float
    source: str = "mqtt"
    port: str | None = None  # the serial port's URL, for a line: where an answer goes back


class MqttLink:
    def __init__(
        self,
        cfg: MqttSettings,
        queue: asyncio.Queue[Inbound],
        loop: asyncio.AbstractEventLoop,
        will: tuple[str, bytes] | None = None,
        subscribe: tuple[str, ...] = (),
        on_connect: Callable[[], None] | None = None,
        client_id: str = "",
    ) -> None:
        self.cfg = cfg
        self.queue = queue
        self.loop = loop
        self.connected = asyncio.Event()
        self.subscriptions = [*SUBSCRIPTIONS, *subscribe]
        self.on_connect = on_connect  # called on the loop after each connect (the node's birth)
        # MQTT 5, for retain-as-published: under 3.1.1 a broker clears the retain flag on live
        # delivery, so the gate could not refuse an event someone published retained.
        self.client_id = client_id or cfg.client_id
        c = _Client(CallbackAPIVersion.VERSION2, client_id=self.client_id, protocol=paho.MQTTv5)
        if cfg.username:
            c.username_pw_set(cfg.username, cfg.password or None)
        # A broker on the LAN is cheap to retry: back within 2 s of it coming back, not paho's 30.
        c.reconnect_delay_set(min_delay=1, max_delay=2)
        c.on_connect = self._on_connect
        c.on_connect_fail = self._on_connect_fail
        c.on_disconnect = self._on_disconnect
        c.on_message = self._on_message
        c.on_publish = self._on_publish
        if will is not None:
            # The node's availability for Home Assistant: offline, retained, when the bridge is gone.
            c.will_set(will[0], will[1], qos=1, retain=True)
        self.client = c
        self._failing: tuple[str, float] | None = None  # (reason, since) while connects fail
        self._said = 0.0
        self.connect_failures = 0  # attempts refused or unanswered since start
        self._connected_at = 0.0
        self._cut_short = 0  # connections the broker closed soon after accepting them, in a row
        self._said_taken = 0.0
        self._in_flight: dict[int, str] = {}  # a QoS 1 publish's mid -> its topic, until the broker answers
        self._refused: set[str] = set()  # topics the broker refused, each logged once
        self._early: dict[int, object] = {}  # answers that came before publish() returned
        self._stopping = False

    def start(self) -> None:
        # A persistent session: the broker queues QoS 1 events while the bridge is away (a week;
        # the sentinel's outbox covers anything longer, or a broker that forgets).
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = SESSION_EXPIRY_S
        self.client.connect_async(
            self.cfg.host, self.cfg.port, keepalive=self.cfg.keepalive, clean_start=False, properties=props
        )
        self.client.loop_start()

    def stop(self, last: tuple[str, bytes] | None = None) -> None:
        """Disconnect; `last`, retained, first (a clean disconnect sends no last will)."""
        self._stopping = True  # the disconnect that follows is ours: no "paho reconnects"
        if last is not None and self.client.is_connected():
            with contextlib.suppress(RuntimeError, ValueError):
                self.client.publish(last[0], last[1], qos=1, retain=True).wait_for_publish(2)
        self.client.disconnect()
        self.client.loop_stop()

    def publish(self, topic: str, payload: bytes, retain: bool = False) -> None:
        # paho queues it while disconnected and sends it on reconnect (QoS 1).
        info = self.client.publish(topic, payload, qos=1, retain=retain)
        # The answer is taken on paho's thread, sometimes before publish() returns (no lock here:
        # paho calls on_publish holding its own, which publish() takes too).
        early = self._early.pop(info.mid, None)
        if early is not None:
            self._judge(topic, early)
        elif len(self._in_flight) < 10000:  # a broker that never answers must not grow this forever
            self._in_flight[info.mid] = topic

    # paho's thread from here on: hand everything to the loop, touch nothing else.

    def _on_connect(self, client: paho.Client, _ud: object, _flags: object, reason: object, _props: object) -> None:
        if getattr(reason, "is_failure", False):
            log.error("broker %s:%d refused the connection: %s", self.cfg.host, self.cfg.port, reason)
            return
        if self._failing is not None:
            log.info(
                "broker %s:%d reachable again after %.0f s",
                self.cfg.host,
                self.cfg.port,
                time.time() - self._failing[1],
            )
            self._failing = None
        log.info("connected to broker %s:%d", self.cfg.host, self.cfg.port)
        self._connected_at = time.monotonic()
        client.subscribe([(t, SubscribeOptions(qos=1, retainAsPublished=True)) for t in self.subscriptions])
        self.loop.call_soon_threadsafe(self.connected.set)
        if self.on_connect is not None:
            self.loop.call_soon_threadsafe(self.on_connect)

    def _on_connect_fail(self, client: _Client, _ud: object) -> None:
        self.connect_failures += 1
        e = client.last_error
        reason = (e.strerror or str(e)) if e is not None else "unknown error"
        now = time.time()
        # Every new reason at once, the same one again each minute: a dead broker must be seen
        # in the log, but not as a line every two seconds.
        if self._failing is None or self._failing[0] != reason or now - self._said >= 60:
            since = self._failing[1] if self._failing and self._failing[0] == reason else now
            log.error(
                "cannot connect to broker %s:%d: %s (for %.0f s; retrying every 2 s)",
                self.cfg.host,
                self.cfg.port,
                reason,
                now - since,
            )
            self._failing = (reason, since)
            self._said = now

    def _on_disconnect(self, _c: paho.Client, _ud: object, flags: object, reason: object, _props: object) -> None:
        self.loop.call_soon_threadsafe(self.connected.clear)
        if self._stopping:
            log.info("disconnected from broker %s:%d (stopping)", *self._where)
            return
        if getattr(flags, "is_disconnect_packet_from_server", True) or not self._connected_at:
            log.warning("disconnected from broker: %s (paho reconnects)", reason)
            return
        lasted = time.monotonic() - self._connected_at
        self._connected_at = 0.0
        # Mosquitto answers a second client with the same id by closing the first one's socket, no
        # word why (paho: "Unspecified error"), and each then takes the id back from the other
        # every two seconds. A connection cut this soon, twice running, is that.
        self._cut_short = self._cut_short + 1 if lasted < TAKEN_OVER_S else 0
        if self._cut_short < 2:
            log.warning("connection to broker %s:%d lost after %.0f s (paho reconnects)", *self._where, lasted)
        elif time.monotonic() - self._said_taken >= 60:
            self._said_taken = time.monotonic()
            log.error(
                "broker %s:%d closed the connection %.1f s after accepting it, %d times in a row: another client "
                "connected as %s? (a second bridge on this host, or another machine with this [mqtt] client_id; "
                "`holdover doctor` finds a second bridge here)",
                *self._where,
                lasted,
                self._cut_short,
                self.client_id,
            )

    @property
    def _where(self) -> tuple[str, int]:
        return self.cfg.host, self.cfg.port

    def _on_publish(self, _c: paho.Client, _ud: object, mid: int, reason: object, _props: object) -> None:
        topic = self._in_flight.pop(mid, None)
        if topic is None:
            if len(self._early) < 1000:
                self._early[mid] = reason
            return
        self._judge(topic, reason)

    def _judge(self, topic: str, reason: object) -> None:
        if not getattr(reason, "is_failure", False) or topic in self._refused:
            return
        # A broker's ACL refuses silently but for this answer (MQTT 5): a bridge whose [failover]
        # node is not the name its broker login was made for would publish nothing, unseen.
        self._refused.add(topic)
        log.error(
            "broker %s:%d refused %s from %s: %s (its ACL: is [failover] node the name `holdover "
            "broker-config --node` made this login for?)",
            *self._where,
            topic,
            self.cfg.username or "an anonymous login",
            reason,
        )

    def _on_message(self, _c: paho.Client, _ud: object, msg: paho.MQTTMessage) -> None:
        item = Inbound(msg.topic, bytes(msg.payload), bool(msg.retain), time.time())
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
