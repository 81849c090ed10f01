"""A short MQTT session with the broker, for the commands that ask one thing and leave (`holdover
relay`, `ha-remove`, the doctor's login check): connected, its CONNACK accepted, paho's network
loop on a thread; disconnected and stopped when the block ends. The bridge's own long-lived link
is bridge/mqtt_link.py."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from holdover.errors import FAILED, HoldoverError


class SessionError(HoldoverError):
    """The broker could not be reached, did not answer, or refused the login; `reason` in words."""

    exit_code = FAILED

    def __init__(self, host: str, port: int, reason: str) -> None:
        super().__init__(f"the broker at {host}:{port}: {reason}")
        self.reason = reason


@contextlib.contextmanager
def session(
    host: str,
    port: int,
    username: str | None = None,
    password: str | None = None,
    *,
    client_id: str = "",
    mqtt5: bool = False,
    timeout: float = 10.0,
    on_message: Callable[[paho.Client, Any, paho.MQTTMessage], None] | None = None,
) -> Iterator[paho.Client]:
    kw: dict[str, Any] = {"protocol": paho.MQTTv5} if mqtt5 else {"clean_session": True}
    c = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, **kw)
    if username:
        c.username_pw_set(username, password or None)
    answer: list[Any] = []
    done = threading.Event()

    def on_connect(_c: paho.Client, _u: object, _f: object, rc: Any, _p: object = None) -> None:
        answer.append(rc)
        done.set()

    c.on_connect = on_connect
    if on_message is not None:
        c.on_message = on_message
    try:
        c.connect(host, port, keepalive=30)
    except OSError as e:
        raise SessionError(host, port, f"cannot connect: {e.strerror or e}") from None
    c.loop_start()
    try:
        if not done.wait(timeout):
            raise SessionError(host, port, f"no CONNACK within {timeout:.0f} s")
        if answer[0].is_failure:
            raise SessionError(host, port, f"refused: {answer[0]}")
        yield c
    finally:
        c.disconnect()
        c.loop_stop()
