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
        events.UPS_ON_BATTERY,  # the host's UPS: its runtime is the deadline
        events.UPS_LOW_BATTERY,
        "peer_lost",  # the link to another node of this node's jobs: save without a collective
        "checkpoint_requested",  # by a person, on the API
    }  # the sentinel's own battery events are its power, not the host's: they start nothing


def test_stock_messages_fill_what_is_known_and_never_raise() -> None:
    low = events.kind(protocol.BATTERY_LOW)
    assert low.describe(sid="rack1", runtime_s=240) == "sentinel rack1's own battery low: 240 s left"
    assert low.describe(sid="rack1") == "sentinel rack1's own battery low: ? s left"
    ups = events.kind(events.UPS_ON_BATTERY)
    assert ups.describe(sid="node", ups="myups", runtime_s=480) == "UPS myups on battery: 480 s left"
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
