"""WiFi that drops and comes back: the emulated WLAN behaves as the esp32 port, and the sentinel
drives it the way the port needs (firmware/wifi.py)."""

from __future__ import annotations

import json
import time

import pytest

from support import run_micropython, wait_for


def test_the_emulated_wlan_behaves_as_the_esp32_port() -> None:
    out = json.loads(run_micropython("emu_wlan.py"))
    assert out == {
        "status_after_connect": 1001,  # STAT_CONNECTING
        "second_connect": "Wifi Internal Error",
        "joined": True,
        "status_after_drop": 1001,  # reconnecting by itself, nobody asked it to
        "connect_after_drop": "Wifi Internal Error",
        "status_no_ap": 201,  # STAT_NO_AP_FOUND, then at once...
        "status_retrying": 1001,  # ...connecting again
        "rejoined_by_itself": True,
    }


@pytest.mark.long
def test_the_access_point_drops_ten_times_and_the_sentinel_never_resets(rig_factory) -> None:
    rig = rig_factory()
    rig.wait("boot", 15)
    wait_for(lambda: rig.board_state()["wlan_joins"] == 1, 10, "first join")
    cut_at = None
    for i in range(10):
        rig.control.send(wlan=False)
        time.sleep(1.0 if i % 2 else 2.0)  # short drops, and ones long enough for a failed scan (1.5 s)
        if i == 5:
            # Mains goes while the radio is down: the watch must be sampling all along.
            cut_at = rig.control.send(mains=False)["uptime_ms"]
            time.sleep(0.6)
        rig.control.send(wlan=True)
        wait_for(lambda n=i: rig.board_state()["wlan_joins"] == n + 2, 15, f"rejoin {i + 1}")
    st = rig.board_state()
    assert st["wlan_errors"] == 0, st  # not one WLAN call raised: no connect() into a connecting driver
    assert st["boot_count"] == 1 and rig.emulator is not None and rig.emulator.boots == 1
    assert not [line for line in rig.lines if "Traceback" in line or "died" in line], rig.lines
    ev = rig.wait("mains_lost", 20)
    assert cut_at is not None and 0 <= ev.info["ms"] - cut_at <= rig.debounce_ms + 50
    assert rig.count("boot") == 1
