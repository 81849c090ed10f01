"""The host's event table and the bridge's list of reactions."""

from __future__ import annotations

import ast
import asyncio
import time
from pathlib import Path

import pytest

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
        events.PEER_LOST,  # the link to another node of this node's jobs: save without a collective
        events.CHECKPOINT_REQUESTED,  # by a person: Home Assistant's button, the API
    }  # the sentinel's own battery events are its power, not the host's: they start nothing


NOT_KINDS = {"INFO", "WARNING", "CRITICAL", "SENTINEL", "HOST"}
HOST_KINDS = {k.name for k in events.TABLE.values() if k.source == events.HOST}
# What raises a host event, by the name it is called by in the wings.
RAISERS = {"node_event", "raise_event", "host_event", "_host_event", "_raise", "_tell", "emit", "_event"}
SOURCES = sorted(p for p in Path(events.__file__).parent.rglob("*.py") if p.name != "events.py")


def test_each_host_kind_is_one_name_in_the_table() -> None:
    """A kind the table does not hold becomes an "info" event with a made-up message (events.kind):
    each is a name in events.py, and each name is an entry."""
    names = {v for k, v in vars(events).items() if k.isupper() and isinstance(v, str) and k not in NOT_KINDS}
    assert names == HOST_KINDS


def _spelled(tree: ast.AST) -> list[tuple[int, str]]:
    """Kinds written as strings where a kind is meant: raised, compared with `.kind`, asked for by
    `kind=`/`kinds=`, or a module's own name for one."""
    found = []
    for node in ast.walk(tree):
        values: list[ast.expr] = []
        if isinstance(node, ast.Call):
            f = node.func
            if (f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)) in RAISERS:
                values += node.args
            values += [k.value for k in node.keywords if k.arg in ("kind", "kinds")]
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(x, ast.Attribute) and x.attr == "kind" for x in sides):
                values += sides
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            values.append(node.value)
        for v in values:
            for c in ast.walk(v):
                if isinstance(c, ast.Constant) and c.value in HOST_KINDS:
                    found.append((c.lineno, c.value))
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(Path(events.__file__).parent)))
def test_no_wing_spells_a_kind_or_names_one_the_table_lacks(path: Path) -> None:
    tree = ast.parse(path.read_text())
    assert _spelled(tree) == [], f"{path.name}: a kind spelled out; use its name in holdover.events"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == "events" and node.attr.isupper():
            assert hasattr(events, node.attr), f"{path.name}:{node.lineno}: events.{node.attr} does not exist"


def test_the_spelling_check_sees_a_kind_spelled() -> None:
    bad = 'self._raise("checkpoint_hung", t)\nif e.kind == "slurm_drained": pass\nX = "peer_lost"\nj.events(kinds=["lost"])'
    assert sorted(k for _line, k in _spelled(ast.parse(bad))) == [
        "checkpoint_hung",
        "lost",
        "peer_lost",
        "slurm_drained",
    ]


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
