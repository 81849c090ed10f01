"""The host's event table and the bridge's list of reactions."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from holdover import events
from holdover.bridge import Bridge
from holdover.firmware import protocol
from holdover.journal import Event
from holdover.settings import Settings


def test_every_sentinel_kind_has_an_entry_and_the_table_is_consistent() -> None:
    for k in protocol.EVENT_KINDS:
        assert events.TABLE[k].source == events.SENTINEL, k
    for k in events.TABLE.values():
        assert k.severity in events.SEVERITIES, k
        assert k.resolves is None or k.resolves in events.TABLE, k
    assert set(events.RESCUE_TRIGGERS) == {
        protocol.MAINS_LOST,
        protocol.BATTERY_LOW,
        protocol.BATTERY_CRITICAL,
        "checkpoint_requested",  # by a person, on the API
    }


def test_stock_messages_fill_what_is_known_and_never_raise() -> None:
    assert events.kind(protocol.BATTERY_LOW).describe(sid="rack1", runtime_s=240) == "battery low at rack1: 240 s left"
    assert events.kind(protocol.BATTERY_LOW).describe(sid="rack1") == "battery low at rack1: ? s left"
    assert events.kind("something_new").severity == events.INFO


class Recorder:
    def __init__(self) -> None:
        self.seen: list[str] = []
        self.started = self.closed = False

    def start(self) -> None:
        self.started = True

    def on_event(self, event: Event) -> None:
        self.seen.append(event.kind)

    async def close(self) -> None:
        self.closed = True


class Broken(Recorder):
    def on_event(self, event: Event) -> None:
        raise RuntimeError("boom")


def test_a_new_reaction_is_one_more_entry_and_a_broken_one_harms_no_other(tmp_path: Path) -> None:
    settings = Settings.model_validate(
        {"mqtt": {"host": "127.0.0.1", "port": 1}, "journal": {"path": str(tmp_path / "j.db")}}
    )

    async def go() -> tuple[Recorder, Bridge]:
        bridge = Bridge(settings)
        rec = Recorder()
        bridge.reactions[:0] = [Broken()]
        bridge.reactions.append(rec)
        ev = Event(1, time.time(), "mqtt", "s", "b", 1, protocol.MAINS_LOST, 0, 0, {})
        bridge._react(ev)
        for r in bridge.reactions:
            await r.close()
        bridge.journal.close()
        return rec, bridge

    rec, _bridge = asyncio.run(go())
    assert rec.seen == [protocol.MAINS_LOST] and rec.closed
