# Runs inside MicroPython: the firmware's own decision rules (uplink judge, battery hysteresis,
# the modem power-cycle cap) on a virtual clock that wraps as the chip's does, with seeded noise
# and loss. Minutes and hours of simulated time in well under a second, the same every run; the
# live soaks of the same rules are in bench/ (uplink_detect.py, firmware_soak.py).
# argv[1]: a JSON file {"rule": ..., ...}; prints one JSON line of what happened.
import json
import random
import sys

import battery
import config
import relay
import uplink

TICKS_PERIOD = 1 << 30  # as board_emu: the ESP32's ticks_ms wraps here
_HALF = TICKS_PERIOD >> 1


class Board:
    def __init__(self, start):
        self.now = start % TICKS_PERIOD
        self.volts = 4.0
        self.noise = 0.0
        self.pins = []

    def advance(self, ms):
        self.now = (self.now + ms) % TICKS_PERIOD

    def ticks_ms(self):
        return self.now

    def ticks_diff(self, a, b):
        return ((a - b + _HALF) & (TICKS_PERIOD - 1)) - _HALF

    def adc(self, _pin):
        return self

    def read_uv(self):
        v = self.volts + self.noise * (random.getrandbits(16) / 32767.5 - 1)
        return max(0, int(v / 2.0 * 1000000))

    def relay(self, _pin, _active_low):
        return self

    def value(self, v):
        self.pins.append(v)


def cfg_of(section, extra):
    raw = {"sentinel_id": "r", "key": "5e0b8d2f7a4c9e1b3f6a8d0c2e5b7f9a", "wlan": {"ssid": "x"}}
    raw["mqtt"] = {"host": "10.0.0.1"}
    raw["mains"] = {"pin": 27}
    raw[section] = extra
    errs, cfg = config.problems(raw)
    assert not errs, errs
    return cfg[section]


def uplink_rule(a):
    """`rounds` probe rounds at the configured interval, each target losing a probe with `loss`."""
    cfg = cfg_of("uplink", a["uplink"])
    board = Board(a["start"])
    flips = []
    w = uplink.UplinkWatch(board, cfg, lambda up, ms: flips.append([up, ms]))
    random.seed(a["seed"])
    lost = sent = 0
    for r in range(a["rounds"]):
        dead = r >= a.get("dead_from", a["rounds"])
        results = []
        for _t in w.targets:
            ok = not dead and random.getrandbits(16) >= a["loss"] * 65536
            results.append(12 if ok else None)
            lost += not ok
            sent += 1
        w.judge(results, board.now)
        board.advance(cfg["interval_ms"])
    return {"flips": flips, "lost": lost, "sent": sent, "status": w.status(), "rounds": w.rounds}


def battery_rule(a):
    """Each step: (volts, seconds, discharge V/s), read every interval_ms with noise on each sample."""
    cfg = cfg_of("battery", a["battery"])
    board = Board(a["start"])
    board.noise = a["noise_v"]
    said = []
    b = battery.Battery(board, cfg, lambda level, prev: said.append([level, prev, b.runtime_s()]))
    random.seed(a["seed"])
    marks = []
    for volts, seconds, slope in a["steps"]:
        board.volts = volts
        for _ in range(int(seconds * 1000 // cfg["interval_ms"])):
            board.advance(cfg["interval_ms"])
            board.volts -= slope * cfg["interval_ms"] / 1000
            b.read()
            b.judge()
        marks.append(len(said))
    return {"said": said, "marks": marks}


def relay_rule(a):
    """The uplink down from t=0 for `hours`, the policy asked once a second as the sentinel asks it."""
    cfg = cfg_of("relay", a["relay"])
    board = Board(a["start"])
    r = relay.Relay(board, cfg, lambda on, why: None)
    down_since = board.now
    cycles = []
    for s in range(int(a["hours"] * 3600)):
        board.advance(1000)
        if r.pulsing is not None:  # no event loop here: the pulse ends when the next second comes
            r.pulsing = None
            r._switch(False, "uplink_down")
        if r.tick(board.ticks_diff(board.now, down_since), a["on_battery"]):
            cycles.append(s + 1)
    return {"cycles": cycles, "pins": r.out is board and board.pins.count(1)}


with open(sys.argv[1]) as f:
    arg = json.load(f)
print(json.dumps({"uplink": uplink_rule, "battery": battery_rule, "relay": relay_rule}[arg["rule"]](arg)))
