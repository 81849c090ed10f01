"""The mains watch on the emulated board: ghost edges, flickers, the timing of a loss."""

from __future__ import annotations

import time

import pytest

DEBOUNCE_MS = 300
CYCLE_MS = 20  # one mains cycle at 50 Hz
SAMPLE_MS = 5


@pytest.mark.parametrize("ghost_hz", [0, 2, 5, 10, 20])
def test_mains_lost_fires_on_time_through_ghost_edges(rig_factory, ghost_hz: int) -> None:
    rig = rig_factory(debounce_ms=DEBOUNCE_MS)
    rig.wait("boot", 15)
    rig.control.send(ghost_hz=ghost_hz)
    time.sleep(1.0)  # ghosts on top of healthy mains must not be taken for anything
    t0 = time.monotonic()
    cut = rig.control.send(mains=False)["uptime_ms"]
    ev = rig.wait("mains_lost", 5, since=t0)
    late = ev.info["ms"] - cut
    # On the board's own clock: the debounce, plus up to one cycle (the last edge came up to a
    # cycle before the cut... or after it, in the loop's scheduling), plus one sample.
    assert DEBOUNCE_MS - CYCLE_MS <= late <= DEBOUNCE_MS + CYCLE_MS + SAMPLE_MS, late
    time.sleep(1.0)  # the ghosts go on: nothing flips back
    assert rig.count("mains_restored", since=t0) == 0
    t1 = time.monotonic()
    rig.control.send(mains=True)
    rig.wait("mains_restored", 5, since=t1)
    assert rig.count("mains_lost") == 1, [x for x in rig.lines if "event" in x]


@pytest.mark.parametrize("ghost_hz", [0, 20])
def test_a_flicker_shorter_than_the_debounce_raises_nothing(rig_factory, ghost_hz: int) -> None:
    rig = rig_factory(debounce_ms=DEBOUNCE_MS)
    rig.wait("boot", 15)
    rig.control.send(ghost_hz=ghost_hz)
    t0 = time.monotonic()
    for _ in range(3):
        rig.control.send(mains=False)
        time.sleep(0.12)
        rig.control.send(mains=True)
        time.sleep(0.5)
    assert rig.count("mains_lost", since=t0) == 0, [x for x in rig.lines if "event" in x]
    assert rig.control.send(get="state")["state"]["mains"] is True
