"""Gaps in a sentinel's events (bridge/gaps.py): late is not lost. After the bridge was away, the
sentinel's new events can come before its outbox's next resend of the older ones; the log said
"event gap ... seq 20 came before seq 11 was heard" for events that came a moment later."""

from __future__ import annotations

import logging

from holdover.bridge.gaps import WAIT_S, Gaps
from holdover.firmware import protocol
from holdover.journal.schema import event


def _ev(seq: int, prev: int | None = None):
    body = {"sid": "rack1", "boot": "b1", "seq": seq, "kind": protocol.HEARTBEAT, "ms": 0, "ts": None}
    return event(seq, 0.0, "mqtt", {**body, "data": {} if prev is None else {"prev": prev}})


def test_an_event_named_and_heard_late_is_no_gap_and_one_never_heard_is_said_once(caplog) -> None:
    caplog.set_level(logging.INFO, logger="holdover.bridge")
    now = [1000.0]
    journaled: set[tuple[str, str, int]] = set()
    gaps = Gaps(lambda k: k in journaled, clock=lambda: now[0])

    def arrive(seq: int, prev: int | None = None) -> None:
        gaps.arrived(_ev(seq, prev))
        journaled.add(("rack1", "b1", seq))

    journaled.add(("rack1", "b1", 9))  # heard before the bridge went away
    arrive(10, 9)
    assert not gaps.open
    arrive(20, 19)  # the bridge came back: 11..19 are the outbox's to resend
    now[0] += 30
    gaps.judge()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    for seq in range(11, 20):
        arrive(seq, seq - 1)
    assert not gaps.open and not gaps.lost
    assert "rack1: seq 19 came 30 s after seq 20 named it (the sentinel's outbox sent it again)" in caplog.text

    arrive(31, 30)  # 30 never comes: lost from the sentinel's RAM (a reboot before it was written)
    now[0] += WAIT_S - 1
    gaps.judge()
    assert not gaps.lost
    now[0] += 1
    gaps.judge()
    gaps.judge()
    assert gaps.lost == {"rack1": 1} and not gaps.open
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert said == ["rack1: event gap in boot b1: seq 30, named by seq 31, not heard in 75 s: lost on the sentinel"]


def test_a_state_resent_after_a_later_one_is_journaled_and_not_acted_on(tmp_path, caplog) -> None:
    # A bridge that was away hears the sentinel's outbox resend mains_lost after mains_restored had
    # come through: acting on it drained a Slurm circuit for a cut that was over (bench/slurm.py).
    import time

    from holdover.bridge.mqtt_link import Inbound
    from holdover.bridge.service import Bridge
    from holdover.journal import Journal
    from holdover.settings import Settings

    key = "3c9e1f7a5b2d8c4e6f0a1b3d5e7c9a2f"
    s = Settings.model_validate({"journal": {"path": str(tmp_path / "j.db")}, "sentinels": [{"id": "s1", "key": key}]})
    b = Bridge(s)
    acted: list[tuple[str, int]] = []
    b.reactions = [SimpleReaction(acted)]
    signer = protocol.Signer(key)

    def event(seq: int, kind: str, boot: str = "b00tb00t") -> Inbound:
        payload = protocol.encode(signer, "s1", boot, seq, 10, None, kind, {})
        return Inbound(protocol.topic("s1", protocol.EVENT), payload, False, time.time())

    caplog.set_level(logging.WARNING, logger="holdover")
    assert b.handle(event(6, protocol.MAINS_RESTORED)).accepted
    assert b.handle(event(5, protocol.MAINS_LOST)).accepted  # late: journaled, not acted on
    assert b.handle(event(4, protocol.UPLINK_LOST)).accepted  # another family: news
    assert b.handle(event(7, protocol.MAINS_LOST)).accepted  # a new cut
    assert b.handle(event(2, protocol.MAINS_LOST, boot="n3wb00t0")).accepted  # another boot
    assert acted == [
        (protocol.MAINS_RESTORED, 6),
        (protocol.UPLINK_LOST, 4),
        (protocol.MAINS_LOST, 7),
        (protocol.MAINS_LOST, 2),
    ]
    assert "s1: mains_lost (seq 5) came after seq 6 of its kind: journaled, not acted on" in caplog.text
    with Journal(tmp_path / "j.db", readonly=True) as j:
        assert j.event_source("s1", "b00tb00t", 5) == "mqtt"  # kept: the history is whole


class SimpleReaction:
    def __init__(self, acted: list[tuple[str, int]]) -> None:
        self.acted = acted

    def on_event(self, event) -> None:
        self.acted.append((event.kind, event.seq))
