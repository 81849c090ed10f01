# The board's config.json, validated before anything starts, with errors that name the key.
import json

import jsoncheck
import keycheck
import pins
import protocol

REQUIRED = object()


class ConfigError(ValueError):
    pass


def _sid(v):
    return None if protocol.valid_sid(v) else "must be 1-32 of A-Z a-z 0-9 _ -"


def _key(v):
    return keycheck.key_problem(v)


def _rng(lo, hi):
    def check(v):
        return None if lo <= v <= hi else "must be in %s..%s" % (lo, hi)

    return check


def _one_of(*choices):
    def check(v):
        return None if v in choices else "must be one of %s" % ", ".join(choices)

    return check


def _url(v):
    ok = v == "" or ((v.startswith("http://") or v.startswith("https://")) and " " not in v)
    return None if ok else "must be an http:// or https:// URL, or empty"


def _node(v):
    ok = len(v) <= 64 and all(c.isalpha() or c.isdigit() or c in "_.-" for c in v)
    return None if ok else "must be a node's name (A-Z a-z 0-9 _ . -, at most 64), or empty"


def _nonempty(v):
    return None if v else "must not be empty (the board would never join a network)"


def _ipv4(v):
    # An IP literal, because a DNS lookup on the board blocks the whole event loop.
    parts = v.split(".")
    if len(parts) == 4 and all(p.isdigit() and 0 <= int(p) <= 255 for p in parts):
        return None
    return "must be an IPv4 address literal (a DNS lookup would block the board)"


def _targets(v):
    if len(v) > 6:
        return "at most 6 targets"
    for i, t in enumerate(v):
        where = "[%d]" % i
        if not isinstance(t, dict):
            return where + " must be an object"
        for k in t:
            if k not in ("kind", "host", "port", "timeout_ms", "name"):
                return where + ".%s: unknown key" % k
        if t.get("kind") not in ("tcp", "dns"):
            return where + ".kind: must be tcp or dns"
        bad = _ipv4(t["host"]) if isinstance(t.get("host"), str) else "required, an IPv4 address"
        if bad:
            return where + ".host: " + bad
        port = t.get("port", 53)
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            return where + ".port: must be in 1..65535"
        tmo = t.get("timeout_ms", 0)
        if not isinstance(tmo, int) or isinstance(tmo, bool) or not 0 <= tmo <= 10000:
            return where + ".timeout_ms: must be in 0..10000"
    return None


def _curve(v):
    if len(v) < 2:
        return "needs at least two [volts, percent] points"
    last = None
    for p in v:
        if not isinstance(p, list) or len(p) != 2 or not all(isinstance(x, (int, float)) for x in p):
            return "points must be [volts, percent]"
        if not 0 <= p[1] <= 100:
            return "percent must be in 0..100"
        if last is not None and (p[0] <= last[0] or p[1] < last[1]):
            return "points must rise in volts and not fall in percent"
        last = p
    return None


# key: (type, default or REQUIRED, check) or a nested spec dict.
SPEC = {
    "sentinel_id": (str, REQUIRED, _sid),
    "key": (str, REQUIRED, _key),
    "wlan": {
        "ssid": (str, REQUIRED, _nonempty),
        "password": (str, "", None),
        "connect_timeout_ms": (int, 20000, _rng(1000, 120000)),
    },
    "mqtt": {
        # An IP literal: a DNS lookup on the board blocks the whole loop.
        "host": (str, REQUIRED, _ipv4),
        "port": (int, 1883, _rng(1, 65535)),
        "user": (str, "", None),
        "password": (str, "", None),
        "keepalive_s": (int, 30, _rng(2, 600)),
        "ack_timeout_ms": (int, 2000, _rng(100, 60000)),
        "backoff_min_ms": (int, 1000, _rng(100, 600000)),
        "backoff_max_ms": (int, 30000, _rng(100, 3600000)),
        "queue_len": (int, 64, _rng(4, 512)),
    },
    "mains": {
        "pin": (int, REQUIRED, _rng(0, 48)),
        # "level": a 5 V adapter through a divider or opto; "pulse": an AC opto module's 50/60 Hz train.
        "mode": (str, "pulse", _one_of("level", "pulse")),
        "active_low": (bool, True, None),
        # Mains must be continuously absent (or present) this long before the state flips.
        "debounce_ms": (int, 300, _rng(0, 60000)),
        # Pulse mode: an edge is mains when it closes a run of `pulse_edges` edges, each within
        # `pulse_gap_ms` of the one before (50 to 120 edges/s from a half- or full-wave opto);
        # mains is present while the newest such edge is younger than the gap. Ghost edges (a
        # few to 20 a second with WiFi on, worst on GPIO36/39) never make such a run.
        "pulse_edges": (int, 4, _rng(2, 32)),
        "pulse_gap_ms": (int, 25, _rng(12, 1000)),
        "sample_ms": (int, 5, _rng(1, 100)),
        # Pulse mode: count edges with the chip's pulse counter (machine.Counter) where the
        # firmware has it, sampled every `count_ms`; it counts through the VM's stalls. Its glitch
        # filter drops pulses narrower than `filter_ns` (the ESP32's PCNT takes up to 12787 ns);
        # an opto's pulses are milliseconds wide, interference spikes a few microseconds.
        "counter": (bool, True, None),
        "count_ms": (int, 2, _rng(1, 20)),
        "filter_ns": (int, 10000, _rng(0, 12787)),
        # false when the opto module has its own pull-up (needed on GPIO 34-39, which have none)
        "pull_up": (bool, True, None),
    },
    "uplink": {
        # Probed every interval; a round is good when `reliability` targets answer. Down after
        # `down` bad rounds in a row, up after `up` good ones (mwan3's model at sub-second pace).
        "targets": (list, [], _targets),
        "interval_ms": (int, 500, _rng(100, 60000)),
        "timeout_ms": (int, 400, _rng(50, 10000)),
        "reliability": (int, 1, _rng(1, 6)),
        "down": (int, 3, _rng(1, 100)),
        "up": (int, 3, _rng(1, 100)),
        "window": (int, 20, _rng(4, 30)),  # probes per target kept for loss and "degraded"
        "degraded_loss_pct": (int, 20, _rng(1, 100)),
    },
    "battery": {
        "pin": (int, -1, _rng(-1, 48)),  # -1: no battery sense
        "divider": (float, 2.0, _rng(1.0, 100.0)),  # (R1 + R2) / R2
        "offset_v": (float, 0.0, _rng(-2.0, 2.0)),  # calibration, added after the divider
        "samples": (int, 16, _rng(1, 64)),
        "interval_ms": (int, 1000, _rng(100, 60000)),
        "cells": (int, 1, _rng(1, 16)),  # in series; the curve is per cell
        # Per-cell resting voltage to state of charge; this default is a Li-ion 18650 at ~0.2C.
        "curve": (
            list,
            [
                [3.0, 0],
                [3.3, 5],
                [3.5, 15],
                [3.6, 25],
                [3.7, 45],
                [3.8, 65],
                [3.9, 78],
                [4.0, 88],
                [4.1, 95],
                [4.2, 100],
            ],
            _curve,
        ),
        "capacity_wh": (float, 9.6, _rng(0.1, 100000.0)),
        "load_w": (float, 1.0, _rng(0.01, 100000.0)),  # what the battery feeds while mains is out
        "low_pct": (int, 30, _rng(1, 99)),
        "critical_pct": (int, 10, _rng(0, 98)),
        "hysteresis_pct": (int, 5, _rng(1, 50)),
    },
    "relay": {
        "pin": (int, -1, _rng(-1, 48)),  # -1: no relay
        "active_low": (bool, True, None),
        # Which contact the modem's power runs through: "nc" (hardware/wiring.md) or "no".
        "wiring": (str, "nc", _one_of("nc", "no")),
        "min_interval_ms": (int, 2000, _rng(0, 3600000)),
        # Power-cycle the modem when the uplink has been down this long (0: never).
        "cycle_after_s": (int, 300, _rng(0, 86400)),
        "cycle_ms": (int, 10000, _rng(50, 600000)),
        "cycles_per_hour": (int, 2, _rng(0, 60)),
        "cycle_on_battery": (bool, False, None),
    },
    "led": {
        # A status LED (see led.py for its blink grammar); -1: none. The devkits' own LED is
        # GPIO2 on an ESP32; the S3 and C3 devkits carry an addressable RGB LED instead, which
        # this plain on/off driver cannot light: wire a LED and resistor to a free pin there.
        "pin": (int, -1, _rng(-1, 48)),
        "active_low": (bool, False, None),
    },
    "ntp": {
        "host": (str, "", None),  # an IPv4 literal (the router, the bridge host); empty: no NTP
        "port": (int, 123, _rng(1, 65535)),
        "interval_s": (int, 3600, _rng(60, 86400)),
    },
    "ha": {
        "discovery": (bool, True, None),
        "prefix": (str, protocol.HA_PREFIX, None),
        # The bridge's dashboard, linked from the sentinel's device page in Home Assistant ("": none).
        "url": (str, "", _url),
        # The node whose bridge turns Home Assistant's presses into signed commands ("": not
        # said): the button and the switch are then available only while both it and the board are.
        "via": (str, "", _node),
    },
    "safe_mode": {
        # Consecutive crash resets (watchdog, panic) before safe mode; power-on resets never count.
        "after": (int, 5, _rng(2, 100)),
        "good_after_s": (int, 60, _rng(5, 3600)),
    },
    "chip": (str, "esp32", _one_of(*pins.NAMES)),
    # A module with PSRAM (ESP32 WROVER, ESP32-S3 R8): its bus pins are taken.
    "psram": (bool, False, None),
    "heartbeat_s": (int, 30, _rng(1, 3600)),
}


def _pin_problem(role, pin, cfg):
    c = pins.CHIPS[cfg["chip"]]
    if pin in c["flash"]:
        return "GPIO%d is wired to the module's SPI flash" % pin
    if pin not in c["gpios"]:
        return "GPIO%d does not exist on an %s" % (pin, c["name"])
    if cfg["psram"] and pin in c["psram"]:
        return "GPIO%d is taken by the PSRAM (psram: true)" % pin
    if pin in c["uart0"]:
        return "GPIO%d is UART0, the USB serial channel" % pin
    if pin in c["usb"]:
        return "GPIO%d is the chip's native USB, the serial channel on boards without a UART bridge" % pin
    if pin in c["strapping"] and not (role == "status LED" and pin == c.get("onboard_led")):
        # Held by a relay driver, an opto output or a battery divider at reset, these pick the
        # boot mode or the flash voltage.
        return "GPIO%d is a strapping pin; a %s on it can stop the chip booting" % (pin, role)
    if role in ("relay", "status LED") and pin in c["input_only"]:
        return "GPIO%d is input-only" % pin
    if role == "mains input" and pin in c["input_only"] and cfg["mains"]["pull_up"]:
        return "GPIO%d has no internal pull-up; fit one and set mains.pull_up false" % pin
    if role == "battery ADC" and pin in c["adc2"]:
        return "GPIO%d is on ADC2, which the WiFi driver owns" % pin
    if role == "battery ADC" and pin not in c["adc1"]:
        return "GPIO%d has no ADC; use ADC1 (GPIO%d-%d)" % (pin, c["adc1"][0], c["adc1"][-1])
    return None


def _check_pins(cfg, errs):
    used = {}
    for key, role in (("mains", "mains input"), ("relay", "relay"), ("battery", "battery ADC"), ("led", "status LED")):
        pin = cfg[key]["pin"]
        if pin is None or pin < 0:
            continue
        problem = _pin_problem(role, pin, cfg)
        if problem:
            errs.append("%s.pin: %s, got %d" % (key, problem, pin))
        elif pin in used:
            errs.append("%s.pin: GPIO%d is already %s.pin" % (key, pin, used[pin]))
        used[pin] = key


def _type_name(t):
    return {str: "a string", int: "an integer", bool: "true or false", float: "a number", list: "a list"}[t]


def _check(spec, raw, path, errs):
    if not isinstance(raw, dict):
        errs.append("%s: must be an object" % (path[:-1] or "config"))
        raw = {}
    for k in raw:
        if k not in spec:
            errs.append("%s%s: unknown key" % (path, k))
    out = {}
    for k, rule in spec.items():
        name = path + k
        if isinstance(rule, dict):
            out[k] = _check(rule, raw.get(k, {}), name + ".", errs)
            continue
        typ, default, check = rule
        out[k] = None if default is REQUIRED else default
        if k not in raw:
            if default is REQUIRED:
                errs.append("%s: required" % name)
            continue
        v = raw[k]
        ok = isinstance(v, typ) and not (typ is int and isinstance(v, bool))
        if typ is float and isinstance(v, int) and not isinstance(v, bool):
            v, ok = float(v), True
        if not ok:
            errs.append("%s: must be %s, got %r" % (name, _type_name(typ), v))
            continue
        problem = check(v) if check else None
        if problem:
            errs.append("%s: %s, got %r" % (name, problem, v))
            continue
        out[k] = v
    return out


def problems(raw):
    """Every problem with a parsed config, each naming its key (empty: valid); and the config
    with defaults filled in. The host's `holdover check-config` prints them all."""
    errs = []
    cfg = _check(SPEC, raw, "", errs)
    if errs:
        _check_pins(cfg, errs)  # pins are checked on their own; a bad one is reported as None
        return errs, cfg  # the cross-checks below need every value to be sound
    m = cfg["mqtt"]
    if m["backoff_max_ms"] < m["backoff_min_ms"]:
        errs.append("mqtt.backoff_max_ms: must be >= mqtt.backoff_min_ms")
    b = cfg["battery"]
    if b["critical_pct"] >= b["low_pct"]:
        errs.append("battery.critical_pct: must be below battery.low_pct")
    u = cfg["uplink"]
    if u["targets"] and u["reliability"] > len(u["targets"]):
        errs.append("uplink.reliability: %d but only %d target(s)" % (u["reliability"], len(u["targets"])))
    if u["timeout_ms"] >= u["interval_ms"]:
        errs.append("uplink.timeout_ms: must be shorter than uplink.interval_ms")
    if cfg["ntp"]["host"] and _ipv4(cfg["ntp"]["host"]):
        errs.append("ntp.host: " + _ipv4(cfg["ntp"]["host"]))
    _check_pins(cfg, errs)
    return errs, cfg


def validate(raw):
    errs, cfg = problems(raw)
    if errs:
        # All of them: the board's dicts have no order, so a "first" problem would be arbitrary.
        raise ConfigError("; ".join(errs))
    return cfg


def load(path):
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise ConfigError("%s: cannot read (%s)" % (path, e))
    bad = jsoncheck.syntax_error(text)
    if bad:
        raise ConfigError("%s: not valid JSON: %s" % (path, bad))
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise ConfigError("%s: not valid JSON (%s)" % (path, e))
    return validate(raw)
