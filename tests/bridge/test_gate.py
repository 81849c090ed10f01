"""The bridge's intake on its own: every payload gets a verdict and a journal row, none an exception."""

from __future__ import annotations

import json
import random

import pytest

from holdover.bridge.gate import Gate
from holdover.firmware import protocol
from holdover.journal import Journal

KEY = b"gate-test-key-0123456789"
SID = "rack1"
EVENT = protocol.topic(SID, protocol.EVENT)
STATE = protocol.topic(SID, protocol.STATE)


@pytest.fixture
def gate(tmp_path) -> Gate:
    return Gate({SID: KEY}, Journal(tmp_path / "j.db"))


def _sealed(kind: str = "mains_lost", seq: int = 1, boot: str = "b00tb00t", ts: int | None = 100) -> bytes:
    return protocol.encode(protocol.Signer(KEY), SID, boot, seq, 10, ts, kind, {})


def test_random_and_mutated_payloads_never_raise(gate: Gate) -> None:
    rng = random.Random(1234)
    genuine = _sealed()
    payloads = [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300))) for _ in range(300)]
    for _ in range(300):
        b = bytearray(genuine)
        for _ in range(rng.randrange(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        payloads.append(bytes(b))
    payloads += [b"{" * 3000, b'{"sig":"' + b"a" * 64 + b'","body":' + b"[" * 1000 + b"}", b"\xff" * 2049]
    topics = [EVENT, STATE, protocol.topic(SID, protocol.STATUS), "holdover/x/cmd", "holdover/../event", "a/b"]
    for p in payloads:
        for t in topics:
            v = gate.mqtt(t, p, retained=rng.random() < 0.2)
            assert v.reason != "internal", (t, p, v)
            # Only the genuine event, on its own topic, is ever taken (again: a duplicate is receipted).
            assert not v.accepted or (p == genuine and t == EVENT), (t, p, v)
        gate.line("serial:test", p)
    assert all(r["reason"] != "internal" for r in gate.journal.rejections())


def test_genuine_event_once_then_a_duplicate_that_is_receipted_again(gate: Gate) -> None:
    first = gate.mqtt(EVENT, _sealed(), False)
    assert first.accepted and first.receipt is not None
    v = gate.mqtt(EVENT, _sealed(), False)
    # The sentinel sends again until it has a receipt: a repeat is expected, answered, not journaled.
    assert (v.accepted, v.reason, v.event, v.receipt) == (False, protocol.DUPLICATE, None, first.receipt)
    # The same seq in another boot is a different event.
    assert gate.mqtt(EVENT, _sealed(boot="0therb00t"), False).accepted
    assert gate.journal.rejections() == []
    assert gate.mqtt(EVENT, _sealed(kind="heartbeat", seq=40), False).receipt is None  # telemetry: no receipt


def test_retained_event_and_wrong_kinds_are_refused(gate: Gate) -> None:
    assert gate.mqtt(EVENT, _sealed(seq=5), True).reason == "retained_event"
    assert gate.mqtt(EVENT, _sealed(kind="state", seq=6), False).reason == "wrong_kind"
    assert gate.mqtt(STATE, _sealed(kind="mains_lost", seq=7), False).reason == "wrong_kind"


def test_state_snapshots_only_move_forward(gate: Gate) -> None:
    assert gate.mqtt(STATE, _sealed("state", seq=5), True).state is not None
    again = gate.mqtt(STATE, _sealed("state", seq=5), True)  # the retained copy on resubscribe
    assert again.accepted and again.state is None
    assert gate.mqtt(STATE, _sealed("state", seq=3), False).reason == "stale_state"
    assert gate.mqtt(STATE, _sealed("state", seq=9), False).state is not None
    assert gate.mqtt(STATE, _sealed("state", seq=1, boot="0ldb00t", ts=50), False).reason == "stale_state"
    assert gate.mqtt(STATE, _sealed("state", seq=1, boot="n3wb00t", ts=200), False).state is not None


def test_serial_lines_pick_the_key_by_the_claimed_sid(gate: Gate) -> None:
    assert gate.line("serial:/dev/ttyUSB0", _sealed(seq=11)).accepted
    forged = protocol.encode(protocol.Signer(b"x" * 20), SID, "b00tb00t", 12, 1, None, "mains_lost", {})
    assert gate.line("serial:/dev/ttyUSB0", forged).reason == "bad_signature"
    stranger = protocol.encode(protocol.Signer(KEY), "nobody", "b00tb00t", 1, 1, None, "boot", {})
    assert gate.line("serial:/dev/ttyUSB0", stranger).reason == "unknown_sentinel"
    assert gate.line("serial:/dev/ttyUSB0", b"# a log line").reason == "malformed"


def test_rejections_keep_bounded_evidence(gate: Gate) -> None:
    gate.mqtt(EVENT, b"{" + b"x" * 5000, False)
    row = gate.journal.db.execute("SELECT reason, length(payload) FROM rejections").fetchone()
    assert row == ("oversized", 1024)
    assert json.loads(json.dumps(gate.journal.rejections()))  # journal rows are plain data
