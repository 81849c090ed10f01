"""Remove a sentinel's Home Assistant discovery entities from the broker.

Home Assistant drops an entity when its retained config topic is emptied, so removal is: find
every retained config under the sentinel's node id, publish an empty retained message to each,
and read the topics back to prove they are gone. The sentinel publishes them again on its next
connect unless its board config says `"ha": {"discovery": false}`.
"""

from __future__ import annotations

import threading
import time

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from holdover.errors import USAGE, HoldoverError
from holdover.firmware import protocol
from holdover.settings import MqttSettings

QUIET_S = 0.5  # retained messages arrive right after SUBACK; this long with none means all are in


class DiscoveryError(HoldoverError, RuntimeError):
    exit_code = USAGE


def node_filter(sid: str, prefix: str = protocol.HA_PREFIX) -> str:
    return f"{prefix}/+/holdover_{sid}/+/config"


def _retained(cfg: MqttSettings, topic_filter: str, timeout: float) -> tuple[paho.Client, set[str]]:
    found: set[str] = set()
    last = [time.monotonic()]
    subscribed = threading.Event()
    c = paho.Client(CallbackAPIVersion.VERSION2, client_id="", clean_session=True)
    if cfg.username:
        c.username_pw_set(cfg.username, cfg.password or None)

    def on_message(_c: paho.Client, _ud: object, msg: paho.MQTTMessage) -> None:
        if msg.retain and msg.payload:
            found.add(msg.topic)
        last[0] = time.monotonic()

    def on_subscribe(*_a: object) -> None:
        last[0] = time.monotonic()
        subscribed.set()

    c.on_message = on_message
    c.on_subscribe = on_subscribe
    try:
        c.connect(cfg.host, cfg.port, keepalive=30)
    except OSError as e:
        raise DiscoveryError(f"cannot reach the broker at {cfg.host}:{cfg.port}: {e}") from None
    c.loop_start()
    c.subscribe(topic_filter, qos=1)
    if not subscribed.wait(timeout):
        c.loop_stop()
        raise DiscoveryError(f"the broker at {cfg.host}:{cfg.port} did not answer the subscription in {timeout:.0f} s")
    while time.monotonic() - last[0] < QUIET_S:
        time.sleep(0.05)
    return c, found


def remove(cfg: MqttSettings, sid: str, prefix: str = protocol.HA_PREFIX, timeout: float = 10.0) -> list[str]:
    """Empty every retained discovery config of `sid`; returns the topics removed."""
    topic_filter = node_filter(sid, prefix)
    c, found = _retained(cfg, topic_filter, timeout)
    try:
        for t in sorted(found):
            c.publish(t, b"", qos=1, retain=True).wait_for_publish(timeout)
    finally:
        c.disconnect()
        c.loop_stop()
    # Read them back with a fresh subscription: the broker sends nothing retained for an emptied topic.
    check, left = _retained(cfg, topic_filter, timeout)
    check.disconnect()
    check.loop_stop()
    if left:
        raise DiscoveryError(f"still retained after removal: {', '.join(sorted(left))}")
    return sorted(found)
