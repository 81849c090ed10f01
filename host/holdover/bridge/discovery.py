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

from holdover.errors import USAGE, HoldoverError
from holdover.firmware import protocol
from holdover.mqtt_session import SessionError, session
from holdover.settings import MqttSettings

QUIET_S = 0.5  # retained messages arrive right after SUBACK; this long with none means all are in


class DiscoveryError(HoldoverError, RuntimeError):
    exit_code = USAGE


def node_filter(sid: str, prefix: str = protocol.HA_PREFIX) -> str:
    return protocol.ha_config_topic(prefix, "+", sid, "+")


def _retained(c: paho.Client, topic_filter: str, timeout: float) -> set[str]:
    """The topics under `topic_filter` that hold a retained message, on a fresh subscription."""
    found: set[str] = set()
    last = [time.monotonic()]
    subscribed = threading.Event()

    def on_message(_c: paho.Client, _ud: object, msg: paho.MQTTMessage) -> None:
        if msg.retain and msg.payload:
            found.add(msg.topic)
        last[0] = time.monotonic()

    def on_subscribe(*_a: object) -> None:
        last[0] = time.monotonic()
        subscribed.set()

    c.on_message = on_message
    c.on_subscribe = on_subscribe
    c.subscribe(topic_filter, qos=1)
    if not subscribed.wait(timeout):
        raise DiscoveryError(f"the broker did not answer the subscription to {topic_filter} in {timeout:.0f} s")
    while time.monotonic() - last[0] < QUIET_S:
        time.sleep(0.05)
    return found


def remove(cfg: MqttSettings, sid: str, prefix: str = protocol.HA_PREFIX, timeout: float = 10.0) -> list[str]:
    """Empty every retained discovery config of `sid`; returns the topics removed."""
    topic_filter = node_filter(sid, prefix)
    try:
        with session(cfg.host, cfg.port, cfg.username, cfg.password, timeout=timeout) as c:
            found = _retained(c, topic_filter, timeout)
            for t in sorted(found):
                c.publish(t, b"", qos=1, retain=True).wait_for_publish(timeout)
        # Read them back with a fresh subscription: the broker sends nothing retained for an emptied topic.
        with session(cfg.host, cfg.port, cfg.username, cfg.password, timeout=timeout) as check:
            left = _retained(check, topic_filter, timeout)
    except SessionError as e:
        raise DiscoveryError(str(e)) from None
    if left:
        raise DiscoveryError(f"still retained after removal: {', '.join(sorted(left))}")
    return sorted(found)
