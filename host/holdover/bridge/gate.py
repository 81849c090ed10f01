"""The bridge's intake: every inbound message is verified here, accepted or rejected with a reason.

Nothing past this gate sees an unverified byte. Any payload at all yields a Verdict; a
bug in the checks becomes an ``internal`` rejection, never an exception in the bridge.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from holdover.bridge.history import History
from holdover.firmware import protocol
from holdover.journal import Event, Journal

log = logging.getLogger("holdover.bridge.gate")

INTERNAL = "internal"
RETAINED_EVENT = "retained_event"
WRONG_KIND = "wrong_kind"
STALE_STATE = "stale_state"


@dataclass
class Verdict:
    accepted: bool
    leaf: str | None = None
    sid: str | None = None
    event: Event | None = None  # set for an accepted event
    state: dict[str, Any] | None = None  # set for an accepted state snapshot
    status: str | None = None  # set for an accepted status message
    ack: dict[str, Any] | None = None  # set for an accepted command answer
    relay_set: tuple[str, int] | None = None  # (op, ms) from Home Assistant (unsigned; forwarded signed)
    receipt: tuple[str, int] | None = None  # (boot, seq) of an event journaled, now or before: acknowledge it
    reason: str | None = None
    detail: str = ""


@dataclass
class Gate:
    keys: dict[str, bytes]
    journal: Journal
    _signers: dict[str, protocol.Signer] = field(default_factory=dict)
    _state_via: dict[str, str] = field(default_factory=dict)  # the channel the held snapshot came by
    history: History = field(init=False)

    def __post_init__(self) -> None:
        self._signers = {sid: protocol.Signer(k) for sid, k in self.keys.items()}
        self.history = History(self.journal)

    def _reject(self, source: str, topic: str | None, payload: bytes, reason: str, detail: str, **kw: Any) -> Verdict:
        log.warning("rejected from %s on %s: %s: %s", source, topic, reason, detail)
        with self.journal.guard("journaling a rejection"):
            self.journal.reject(source, topic, reason, detail, payload)
        return Verdict(False, reason=reason, detail=detail, **kw)

    def mqtt(self, topic: str, payload: bytes, retained: bool) -> Verdict:
        try:
            return self._mqtt(topic, payload, retained)
        except Exception as e:  # the gate must survive its own bugs; the evidence is journaled
            log.exception("internal error on %s", topic)
            return self._reject("mqtt", topic, payload, INTERNAL, repr(e))

    def line(self, source: str, payload: bytes) -> Verdict:
        """A serial line: no topic, so the key is chosen by the body's claimed sid, then verified."""
        try:
            try:
                sid = protocol.peek_sid(payload)
            except protocol.ProtocolError as e:
                return self._reject(source, None, payload, e.reason, e.detail)
            return self._signed(source, None, payload, sid, None, retained=False)
        except Exception as e:
            log.exception("internal error on a line from %s", source)
            return self._reject(source, None, payload, INTERNAL, repr(e))

    def _mqtt(self, topic: str, payload: bytes, retained: bool) -> Verdict:
        parsed = protocol.parse_topic(topic)
        if parsed is None:
            return self._reject("mqtt", topic, payload, protocol.SCHEMA, "not a holdover topic")
        sid, leaf = parsed
        if leaf == protocol.STATUS:
            if payload not in (protocol.ONLINE.encode(), protocol.OFFLINE.encode()):
                return self._reject(
                    "mqtt", topic, payload, protocol.MALFORMED, "status must be online or offline", sid=sid
                )
            return Verdict(True, leaf=leaf, sid=sid, status=payload.decode())
        if leaf in (protocol.EVENT, protocol.STATE, protocol.CMD_ACK):
            return self._signed("mqtt", topic, payload, sid, leaf, retained)
        if leaf == protocol.RELAY_SET:
            return self._relay_set(topic, payload, sid, retained)
        return self._reject("mqtt", topic, payload, protocol.SCHEMA, f"bridge does not take {leaf}", sid=sid)

    def _relay_set(self, topic: str, payload: bytes, sid: str, retained: bool) -> Verdict:
        # Home Assistant cannot sign, so this topic is only as trusted as the broker's ACL on it.
        if sid not in self._signers:
            return self._reject("mqtt", topic, payload, protocol.UNKNOWN_SENTINEL, f"no key for {sid!r}", sid=sid)
        if retained:
            return self._reject(
                "mqtt", topic, payload, protocol.RETAINED, "a switch command must not be retained", sid=sid
            )
        words = payload.strip().upper().split()
        if words in ([b"ON"], [b"OFF"], [b"RESTART"]):  # RESTART: the board's restart button
            return Verdict(True, leaf=protocol.RELAY_SET, sid=sid, relay_set=(words[0].decode().lower(), 0))
        # The "Power-cycle modem" button sends PULSE and the board's own cycle_ms (its discovery says).
        if (
            len(words) == 2
            and words[0] == b"PULSE"
            and words[1].isdigit()
            and 50 <= int(words[1]) <= protocol.PULSE_MAX_MS
        ):
            return Verdict(True, leaf=protocol.RELAY_SET, sid=sid, relay_set=(protocol.OP_PULSE, int(words[1])))
        why = f"relay/set takes ON, OFF, PULSE MS (50..{protocol.PULSE_MAX_MS}) or RESTART"
        return self._reject("mqtt", topic, payload, protocol.MALFORMED, why, sid=sid)

    def _signed(
        self, source: str, topic: str | None, payload: bytes, sid: str, leaf: str | None, retained: bool
    ) -> Verdict:
        try:
            body = protocol.open_envelope(payload, self._signers.get(sid), sid)
        except protocol.ProtocolError as e:
            return self._reject(source, topic, payload, e.reason, e.detail, sid=sid, leaf=leaf)
        kind = body["kind"]
        if leaf is None:  # a serial line has no topic: its kind says what it is
            leaf = {protocol.STATE_KIND: protocol.STATE, protocol.ACK_KIND: protocol.CMD_ACK}.get(kind, protocol.EVENT)
        if leaf == protocol.CMD_ACK:
            if kind != protocol.ACK_KIND:
                return self._reject(source, topic, payload, WRONG_KIND, f"{kind} on the ack topic", sid=sid)
            return Verdict(True, leaf=leaf, sid=sid, ack=body)
        if leaf == protocol.STATE:
            if kind != protocol.STATE_KIND:
                return self._reject(source, topic, payload, WRONG_KIND, f"{kind} on the state topic", sid=sid)
            return self._state(source, topic, payload, body)
        if kind not in protocol.EVENT_KINDS:
            return self._reject(source, topic, payload, WRONG_KIND, f"{kind} on the event topic", sid=sid)
        if retained:
            # Events are never published retained; one that is would replay on every subscribe.
            return self._reject(source, topic, payload, RETAINED_EVENT, f"{kind} seq {body['seq']}", sid=sid)
        # Heartbeats and suspicions are never kept or sent again by the sentinel: no receipt.
        transient = kind in protocol.TRANSIENT_KINDS
        receipt = None if transient else (body["boot"], body["seq"])
        event, journaled = self.journal.take(source, body, hold=not transient)
        if not journaled:
            # Held in memory, the journal cannot write: acted on, not receipted, so the sentinel
            # keeps it and sends it again; the held copy makes that a duplicate, not a second action.
            if event is None:
                return Verdict(False, leaf=leaf, sid=sid, reason=protocol.DUPLICATE, detail="held, not yet journaled")
            return Verdict(True, leaf=leaf, sid=sid, event=event)
        if event is None:
            # Already journaled: by the other channel (serial and MQTT both carry every event), or
            # sent again because our receipt did not reach the sentinel. Expected either way and
            # harmless (nothing runs twice): counted and acknowledged again, not journaled.
            first = self.journal.event_source(sid, body["boot"], body["seq"])
            log.debug("%s seq %d from %s already came by %s", kind, body["seq"], source, first)
            return Verdict(
                False, leaf=leaf, sid=sid, reason=protocol.DUPLICATE, detail=f"already via {first}", receipt=receipt
            )
        return Verdict(True, leaf=leaf, sid=sid, event=event, receipt=receipt)

    def _state(self, source: str, topic: str | None, payload: bytes, body: dict[str, Any]) -> Verdict:
        sid = body["sid"]
        prev = self.journal.sentinel(sid)
        if prev and prev["boot"] == body["boot"]:
            if prev["seq"] == body["seq"]:
                # The retained snapshot, delivered again on (re)subscribe: nothing new, nothing wrong.
                return Verdict(True, leaf=protocol.STATE, sid=sid, state=None)
            if body["seq"] < prev["seq"]:
                if self._state_via.get(sid, source) != source:
                    # Overtaken by a newer one on the other channel: the two race, nothing is wrong.
                    return Verdict(True, leaf=protocol.STATE, sid=sid, state=None)
                return self._reject(
                    source, topic, payload, STALE_STATE, f"seq {body['seq']} < {prev['seq']} in boot {body['boot']}"
                )
        elif prev and prev["state_ts"] and body["ts"] and body["ts"] < prev["state_ts"]:
            return self._reject(source, topic, payload, STALE_STATE, f"older than the snapshot held (ts {body['ts']})")
        with self.journal.guard(f"keeping the state of {sid}"):
            self.journal.set_state(body)
            self.history.record(sid, body["data"])
        self._state_via[sid] = source
        return Verdict(True, leaf=protocol.STATE, sid=sid, state=body)
