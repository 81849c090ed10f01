# The board's config.json, validated before anything starts, with errors that name the key.
import json

import protocol

REQUIRED = object()


class ConfigError(ValueError):
    pass


def _sid(v):
    return None if protocol.valid_sid(v) else "must be 1-32 of A-Z a-z 0-9 _ -"


def _key(v):
    return None if len(v) >= 16 else "must be at least 16 characters"


def _rng(lo, hi):
    def check(v):
        return None if lo <= v <= hi else "must be in %s..%s" % (lo, hi)

    return check


def _one_of(*choices):
    def check(v):
        return None if v in choices else "must be one of %s" % ", ".join(choices)

    return check


# key: (type, default or REQUIRED, check) or a nested spec dict.
SPEC = {
    "sentinel_id": (str, REQUIRED, _sid),
    "key": (str, REQUIRED, _key),
    "wlan": {
        "ssid": (str, "", None),
        "password": (str, "", None),
        "connect_timeout_ms": (int, 20000, _rng(1000, 120000)),
    },
    "mqtt": {
        # An IP literal: a DNS lookup on the board blocks the whole loop.
        "host": (str, REQUIRED, None),
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
        # Pulse mode: mains is present while the last edge is younger than this (>1 cycle at 50 Hz).
        "pulse_gap_ms": (int, 30, _rng(12, 1000)),
        "sample_ms": (int, 5, _rng(1, 100)),
    },
    "heartbeat_s": (int, 30, _rng(1, 3600)),
}


def _type_name(t):
    return {str: "a string", int: "an integer", bool: "true or false", float: "a number"}[t]


def _check(spec, raw, path):
    if not isinstance(raw, dict):
        raise ConfigError("%s: must be an object" % (path or "config"))
    for k in raw:
        if k not in spec:
            raise ConfigError("%s%s: unknown key" % (path, k))
    out = {}
    for k, rule in spec.items():
        name = path + k
        if isinstance(rule, dict):
            out[k] = _check(rule, raw.get(k, {}), name + ".")
            continue
        typ, default, check = rule
        if k not in raw:
            if default is REQUIRED:
                raise ConfigError("%s: required" % name)
            out[k] = default
            continue
        v = raw[k]
        ok = isinstance(v, typ) and not (typ is int and isinstance(v, bool))
        if typ is float and isinstance(v, int) and not isinstance(v, bool):
            v, ok = float(v), True
        if not ok:
            raise ConfigError("%s: must be %s, got %r" % (name, _type_name(typ), v))
        problem = check(v) if check else None
        if problem:
            raise ConfigError("%s: %s, got %r" % (name, problem, v))
        out[k] = v
    return out


def validate(raw):
    cfg = _check(SPEC, raw, "")
    m = cfg["mqtt"]
    if m["backoff_max_ms"] < m["backoff_min_ms"]:
        raise ConfigError("mqtt.backoff_max_ms: must be >= mqtt.backoff_min_ms")
    return cfg


def load(path):
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise ConfigError("%s: cannot read (%s)" % (path, e))
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise ConfigError("%s: not valid JSON (%s)" % (path, e))
    return validate(raw)
