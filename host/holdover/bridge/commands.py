"""What the bridge signs for a sentinel: relay commands, and receipts for the events it has journaled.

A command names the sentinel's current boot and carries a sequence number above any the
sentinel has accepted in that boot, so a command recorded earlier, or from before a reboot,
is refused on the board without any clock there. The sequence is the sender's wall clock in
milliseconds, which keeps rising across bridge and CLI restarts.
"""

from __future__ import annotations

import queue
import secrets
import threading
import time
from typing import Any

import paho.mqtt.client as paho

from holdover.errors import USAGE, HoldoverError
from holdover.firmware import protocol
from holdover.mqtt_session import SessionError, session
from holdover.settings import MqttSettings

_last = 0
_lock = threading.Lock()


class CommandError(HoldoverError, RuntimeError):
    exit_code = USAGE


# Why a sentinel refused a command, in words, for the reasons its ack carries without a detail.
REFUSED = {
    protocol.NO_RELAY: "this sentinel has no relay (relay.pin in its board config)",
    protocol.SAFE_MODE: "the sentinel is in safe mode after a crash loop: its relay takes no commands",
    protocol.TOO_SOON: "inside the relay's min_interval_ms of its last switch",
    protocol.BUSY: "a pulse is still running",
}


def refusal(ack: dict[str, Any]) -> str:
    """An ack's refusal as a person reads it: its reason, and what it means or the sentinel's detail."""
    reason, detail = str(ack.get("reason")), ack.get("detail")
    said = detail if detail and detail != reason else REFUSED.get(reason, "")
    return f"{reason}: {said}" if said else reason


def next_seq() -> int:
    global _last
    with _lock:
        _last = max(_last + 1, time.time_ns() // 1_000_000)
        return _last


def build(
    key: bytes | str, sid: str, boot: str, op: str, ms: int = 0, cid: str | None = None, ts: int | None = None
) -> tuple[bytes, str]:
    """(envelope, command id) for one relay command, stamped now (or `ts`) for the board's expiry check."""
    data: dict[str, Any] = {"op": op, "id": cid or secrets.token_hex(4)}
    if op == protocol.OP_PULSE:
        data["ms"] = ms
    protocol.check_command(data)  # refuse here what the board would refuse
    stamp = int(time.time()) if ts is None else ts
    payload = protocol.encode(protocol.Signer(key), sid, boot, next_seq(), 0, stamp, protocol.CMD_KIND, data)
    return payload, data["id"]


def build_receipt(key: bytes | str, sid: str, events: list[tuple[str, int]]) -> bytes:
    """An evack envelope naming journaled events, so the sentinel can let them go from its outbox.

    Its own boot and seq mean nothing to the sentinel (a receipt is idempotent); they are the
    bridge's, to keep the envelope's schema.
    """
    data = {"events": [[b, s] for b, s in events]}
    protocol.check_evack(data)
    return protocol.encode(
        protocol.Signer(key), sid, "bridge", next_seq(), 0, int(time.time()), protocol.EVACK_KIND, data
    )


def send(cfg: MqttSettings, key: bytes | str, sid: str, op: str, ms: int = 0, timeout: float = 10.0) -> dict[str, Any]:
    """Send one relay command through the broker and return the sentinel's verified answer.

    The sentinel's current boot comes from its retained state; the answer is the ack whose id
    is ours, signed by the sentinel. Raises CommandError naming what is missing.
    """
    signer = protocol.Signer(key)
    boot: list[str] = []
    acks: queue.Queue[dict[str, Any]] = queue.Queue()
    subscribed = threading.Event()

    def on_message(_c: paho.Client, _ud: object, m: paho.MQTTMessage) -> None:
        try:
            body = protocol.open_envelope(bytes(m.payload), signer, sid)
        except protocol.ProtocolError:
            return  # not from this sentinel (or not genuine): not our answer
        if body["kind"] == protocol.STATE_KIND:
            boot[:] = [body["boot"]]
        elif body["kind"] == protocol.ACK_KIND:
            acks.put(body["data"])

    try:
        with session(
            cfg.host,
            cfg.port,
            cfg.username,
            cfg.password,
            client_id="holdover-cli-" + secrets.token_hex(3),
            timeout=timeout,
            on_message=on_message,
        ) as c:
            c.on_subscribe = lambda *_a: subscribed.set()
            c.subscribe([(protocol.topic(sid, protocol.STATE), 1), (protocol.topic(sid, protocol.CMD_ACK), 1)])
            deadline = time.monotonic() + timeout
            while not boot and time.monotonic() < deadline:
                time.sleep(0.05)
            if not boot:
                raise CommandError(
                    f"{sid}: no state on the broker in {timeout:.0f} s, so its boot is unknown (online?)"
                )
            payload, cid = build(key, sid, boot[0], op, ms)
            c.publish(protocol.topic(sid, protocol.CMD), payload, qos=1)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CommandError(f"{sid}: no answer to command {cid} in {timeout:.0f} s")
                try:
                    ack = acks.get(timeout=left)
                except queue.Empty:
                    continue
                if ack.get("id") == cid:
                    return ack
    except SessionError as e:
        raise CommandError(f"cannot reach the broker at {cfg.host}:{cfg.port}: {e.reason}") from None
