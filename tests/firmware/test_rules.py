"""The sentinel's decision rules, deterministic: the firmware's own uplink judge, battery
hysteresis and modem power-cycle cap, run in the real MicroPython unix port on a virtual clock
that crosses the chip's ticks wrap, with seeded loss and ADC noise (tests/mpy/rules.py).

Minutes to hours of simulated time each; the live soaks of the same rules (5 min of 20 % probe
loss on the emulated sentinel, the long battery and relay runs) are in bench/."""

from __future__ import annotations

from pathlib import Path

from support import run_micropython_json

NEAR_WRAP = (1 << 30) - 60_000  # a minute before ticks_ms wraps
THREE = [{"kind": "dns", "host": "10.0.0.1", "name": f"r{i}"} for i in range(3)]


def test_20_percent_loss_on_every_target_for_5_minutes_raises_nothing(tmp_path: Path) -> None:
    a = {"rule": "uplink", "uplink": {"targets": THREE}, "rounds": 600, "loss": 0.2, "seed": 1, "start": NEAR_WRAP}
    got = run_micropython_json("rules.py", a, tmp_path)
    assert got["rounds"] == 600
    assert 0.17 < got["lost"] / got["sent"] < 0.23, got  # the loss was there
    assert got["flips"] == [[True, 0]] or got["flips"] == [], got  # up at the start, never down


def test_the_same_loss_is_an_alarm_when_every_target_must_answer(tmp_path: Path) -> None:
    # The control: what keeps the uplink up above is the rule across targets, not the seed.
    strict = {"targets": THREE, "reliability": 3}
    a = {"rule": "uplink", "uplink": strict, "rounds": 600, "loss": 0.2, "seed": 1, "start": NEAR_WRAP}
    got = run_micropython_json("rules.py", a, tmp_path)
    assert any(up is False for up, _ms in got["flips"]), got


def test_every_target_silent_is_down_after_three_rounds_timed_from_the_last_good_one(tmp_path: Path) -> None:
    a = {"rule": "uplink", "uplink": {"targets": THREE}, "rounds": 110, "dead_from": 100, "loss": 0.0}
    got = run_micropython_json("rules.py", {**a, "seed": 2, "start": NEAR_WRAP}, tmp_path)
    assert [up for up, _ms in got["flips"]] == [False], got  # it was never down before: one flip only
    assert got["flips"][0][1] == 3 * 500  # three rounds of the default 500 ms, across the wrap
    assert got["status"] == "down"


BATTERY = {"pin": 34, "interval_ms": 200, "samples": 4, "low_pct": 30, "critical_pct": 10}
# (volts, seconds, discharge V/s): right on the low threshold (30 %), down to critical in ~8 s,
# wobbling on the critical threshold (3.4 V is 10 %), then charged again.
DISCHARGE = [[4.0, 2, 0], [3.625, 5, 0], [3.625, 10, 0.04], [3.4, 10, 0], [4.0, 3, 0]]


def test_a_noisy_discharge_crosses_low_and_critical_once_each(tmp_path: Path) -> None:
    a = {"rule": "battery", "battery": BATTERY, "noise_v": 0.05, "steps": DISCHARGE, "seed": 3, "start": NEAR_WRAP}
    got = run_micropython_json("rules.py", a, tmp_path)
    levels = [(new, prev) for new, prev, _rt in got["said"]]
    assert levels == [("low", "ok"), ("critical", "low"), ("ok", "low")], got  # critical -> low on the way up is silent
    assert got["marks"] == [0, 1, 2, 2, 3]  # each said in its own step: low on the threshold, no repeat
    low_rt, crit_rt = got["said"][0][2], got["said"][1][2]
    assert crit_rt < low_rt


def test_with_too_little_hysteresis_the_same_noise_says_low_again_and_again(tmp_path: Path) -> None:
    bare = {**BATTERY, "hysteresis_pct": 1}
    steps = [[4.0, 2, 0], [3.625, 20, 0]]
    got = run_micropython_json(
        "rules.py",
        {"rule": "battery", "battery": bare, "noise_v": 0.05, "steps": steps, "seed": 3, "start": NEAR_WRAP},
        tmp_path,
    )
    assert sum(new == "low" for new, _p, _rt in got["said"]) > 1, got


def _cycles(tmp_path: Path, on_battery: bool, **relay: object) -> list[int]:
    a = {"rule": "relay", "relay": {"pin": 26, **relay}, "hours": 3, "on_battery": on_battery, "start": NEAR_WRAP}
    return run_micropython_json("rules.py", a, tmp_path)["cycles"]


def test_the_modem_is_power_cycled_at_most_twice_an_hour_while_the_uplink_stays_down(tmp_path: Path) -> None:
    # The defaults: after 300 s down, then the full wait again, then the hourly cap of two.
    assert _cycles(tmp_path, on_battery=False) == [300, 600, 3900, 4200, 7500, 7800]


def test_on_battery_the_modem_is_left_alone_unless_configured(tmp_path: Path) -> None:
    assert _cycles(tmp_path, on_battery=True) == []
    assert _cycles(tmp_path, on_battery=True, cycle_on_battery=True) == [300, 600, 3900, 4200, 7500, 7800]
    assert _cycles(tmp_path, on_battery=False, cycles_per_hour=1, cycle_after_s=1) == [1, 3601, 7201]
