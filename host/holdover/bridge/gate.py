"""The bridge's intake: every inbound message is verified here, accepted or rejected with a reason.

Nothing past this gate sees an unverified byte. Any payload at all yields a Verdict; a
bug in the checks becomes an ``internal`` rejection, never an exception in the bridge.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

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
    reason: str | None = None
    detail: str = ""


@dataclass
class Gate:
    keys: dict[str, bytes]
    journal: Journal
    _signers: dict[str, protocol.Signer] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._signers = {sid: protocol.Signer(k) for sid, k in self.keys.items()}

    def _reject(self, source: str, topic: str | None, payload: bytes, reason: str, detail: str, **kw: Any) -> Verdict:
        log.warning("rejected from %s on %s: %s: %s", source, topic, reason, detail)
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
            return self._signed(source, None, payload, sid, protocol.EVENT, retained=False)
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
            status = payload.decode()
            self.journal.set_status(sid, status)
            return Verdict(True, leaf=leaf, sid=sid, status=status)
        if leaf in (protocol.EVENT, protocol.STATE):
            return self._signed("mqtt", topic, payload, sid, leaf, retained)
        return self._reject("mqtt", topic, payload, protocol.SCHEMA, f"bridge does not take {leaf}", sid=sid)

    def _signed(self, source: str, topic: str | None, payload: bytes, sid: str, leaf: str, retained: bool) -> Verdict:
        try:
            body = protocol.open_envelope(payload, self._signers.get(sid), sid)
        except protocol.ProtocolError as e:
            return self._reject(source, topic, payload, e.reason, e.detail, sid=sid, leaf=leaf)
        kind = body["kind"]
        if leaf == protocol.STATE:
            if kind != protocol.STATE_KIND:
                return self._reject(source, topic, payload, WRONG_KIND, f"{kind} on the state topic", sid=sid)
            return self._state(source, topic, payload, body)
        if kind not in protocol.EVENT_KINDS:
            return self._reject(source, topic, payload, WRONG_KIND, f"{kind} on the event topic", sid=sid)
        if retained:
            # Events are never published retained; one that is would replay on every subscribe.
            return self._reject(source, topic, payload, RETAINED_EVENT, f"{kind} seq {body['seq']}", sid=sid)
        event = self.journal.accept(source, body)
        if event is None:
            return self._reject(
                source,
                topic,
                payload,
                protocol.REPLAYED,
                f"{kind}: seq {body['seq']} already seen in boot {body['boot']}",
                sid=sid,
                leaf=leaf,
            )
        return Verdict(True, leaf=leaf, sid=sid, event=event)

    def _state(self, source: str, topic: str | None, payload: bytes, body: dict[str, Any]) -> Verdict:
        sid = body["sid"]
        prev = self.journal.sentinel(sid)
        if prev and prev["boot"] == body["boot"]:
            if prev["seq"] == body["seq"]:
                # The retained snapshot, delivered again on (re)subscribe: nothing new, nothing wrong.
                return Verdict(True, leaf=protocol.STATE, sid=sid, state=None)
            if body["seq"] < prev["seq"]:
                return self._reject(
                    source, topic, payload, STALE_STATE, f"seq {body['seq']} < {prev['seq']} in boot {body['boot']}"
                )
        elif prev and prev["state_ts"] and body["ts"] and body["ts"] < prev["state_ts"]:
            return self._reject(source, topic, payload, STALE_STATE, f"older than the snapshot held (ts {body['ts']})")
        self.journal.set_state(body)
        return Verdict(True, leaf=protocol.STATE, sid=sid, state=body)
