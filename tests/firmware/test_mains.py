"""The mains watch on the emulated board: ghost edges, flickers, the timing of a loss."""

from __future__ import annotations

import time

import pytest

DEBOUNCE_MS = 300
CYCLE_MS = 20  # one mains cycle at 50 Hz
SAMPLE_MS = 5
# A sample may come this much late without the watch counting a stall (it counts one past the
# pulse gap plus a sample): on a busy host that lateness is in the report and not in held_up.
UNCOUNTED_MS = 25 + SAMPLE_MS


@pytest.mark.parametrize("ghost_hz", [0, 2, 5, 10, 20])
def test_mains_lost_fires_on_time_through_ghost_edges(rig_factory, ghost_hz: int) -> None:
    rig = rig_factory(debounce_ms=DEBOUNCE_MS)
    rig.wait("boot", 15)
    rig.control.send(ghost_hz=ghost_hz)
    time.sleep(1.0)  # ghosts on top of healthy mains must not be taken for anything
    t0 = time.monotonic()
    stalled = rig.board_state()["loop_stalled_ms"]
    cut = rig.control.send(mains=False)["uptime_ms"]
    ev = rig.wait("mains_lost", 5, since=t0)
    late = ev.info["ms"] - cut
    # On the board's own clock: the debounce, plus up to one cycle (the last edge came up to a
    # cycle before the cut... or after it, in the loop's scheduling), plus one sample. Plus any
    # time this machine held the interpreter up (a busy host, not the chip): the watch then
    # refuses to count the stall as evidence of a loss, and reports that much later.
    held_up = rig.board_state()["loop_stalled_ms"] - stalled
    # (A clean clone's run here once reported 327 ms with held_up 0: 2 ms past the old bound.)
    # The hold-up moves the stamps either way: 264 ms came with 35 ms held up (four test workers
    # on two cores), early by 16 of them.
    low = DEBOUNCE_MS - CYCLE_MS - held_up
    assert low <= late <= DEBOUNCE_MS + CYCLE_MS + SAMPLE_MS + UNCOUNTED_MS + held_up, (
        late,
        held_up,
    )
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
    assert rig.board_state()["mains"] is True


def test_an_outage_across_the_chips_clock_wrap_has_the_right_durations(rig_factory) -> None:
    # The board's ticks_ms starts 2.5 s before it wraps at 2^30 (as the ESP32's does after 12.4
    # days): mains goes before the wrap and comes back after it.
    rig = rig_factory(debounce_ms=DEBOUNCE_MS, ticks_start=(1 << 30) - 2500)
    rig.wait("boot", 15)
    assert rig.control.send(get="ticks")["ticks_ms"] > (1 << 30) - 2500  # not wrapped yet
    cut = rig.control.send(mains=False)["uptime_ms"]
    lost = rig.wait("mains_lost", 5)
    time.sleep(2.5)  # the wrap passes during the outage
    assert rig.control.send(get="ticks")["ticks_ms"] < 5000  # wrapped
    back_at = rig.control.send(mains=True)["uptime_ms"]
    restored = rig.wait("mains_restored", 5)
    outage = restored.info["data"]["outage_ms"]
    # Timed from the last edge before the cut to the first run of edges after the return (four
    # edges, each within the 25 ms gap): a cycle early at most, a run of edges late at most.
    run_ms = 4 * 25 + SAMPLE_MS
    assert -CYCLE_MS <= outage - (back_at - cut) <= run_ms, (outage, back_at - cut)
    assert restored.info["ms"] > lost.info["ms"] > cut >= 0
    st = rig.board_state()
    # When mains came back, on the uptime scale: never negative, never from the wrapped clock.
    assert -CYCLE_MS <= st["mains_since_ms"] - back_at <= run_ms, (st["mains_since_ms"], back_at)
    assert st["mains"] is True and rig.count("boot") == 1
