"""Home Assistant's MQTT discovery rules, as its MQTT integration applies them to a config payload,
written out for the components holdover announces (binary_sensor, sensor, button, switch).

From Home Assistant's own sources (homeassistant/components/mqtt: abbreviations.py, the platform
schemas; sensor/const.py's DEVICE_CLASS_UNITS and DEVICE_CLASS_STATE_CLASSES; the binary_sensor,
button and switch device classes), restated here rather than installed: the package pulls in
hundreds of dependencies for one check. A config breaking one of these is refused by Home
Assistant with a log line, and the entity never appears; `check` names the rule instead.
"""

from __future__ import annotations

import re
from typing import Any

# Abbreviations holdover uses (HA expands each to its full key before validating).
ABBREVIATIONS = {
    "avty": "availability",
    "avty_mode": "availability_mode",
    "avty_t": "availability_topic",
    "cmd_t": "command_topic",
    "dev": "device",
    "dev_cla": "device_class",
    "ent_cat": "entity_category",
    "ic": "icon",
    "json_attr_t": "json_attributes_topic",
    "json_attr_tpl": "json_attributes_template",
    "obj_id": "object_id",
    "ops": "options",
    "pl_off": "payload_off",
    "pl_on": "payload_on",
    "pl_prs": "payload_press",
    "stat_cla": "state_class",
    "stat_t": "state_topic",
    "uniq_id": "unique_id",
    "unit_of_meas": "unit_of_measurement",
    "val_tpl": "value_template",
}
DEVICE_ABBREVIATIONS = {
    "cns": "connections",
    "ids": "identifiers",
    "mf": "manufacturer",
    "mdl": "model",
    "sw": "sw_version",
    "cu": "configuration_url",
}

COMMON = {
    "name",
    "unique_id",
    "object_id",
    "default_entity_id",
    "availability_topic",
    "availability",
    "availability_mode",
    "device",
    "entity_category",
    "icon",
    "json_attributes_topic",
    "json_attributes_template",
    "device_class",
}
KEYS = {
    "binary_sensor": COMMON | {"state_topic", "value_template", "payload_on", "payload_off"},
    "sensor": COMMON | {"state_topic", "value_template", "unit_of_measurement", "state_class", "options"},
    "button": COMMON | {"command_topic", "payload_press"},
    "switch": COMMON | {"command_topic", "state_topic", "value_template", "payload_on", "payload_off"},
}
REQUIRED = {
    "binary_sensor": {"state_topic"},
    "sensor": {"state_topic"},
    "button": {"command_topic"},
    "switch": {"command_topic"},
}
DEVICE_CLASSES = {
    "binary_sensor": {
        "battery",
        "battery_charging",
        "carbon_monoxide",
        "cold",
        "connectivity",
        "door",
        "garage_door",
        "gas",
        "heat",
        "light",
        "lock",
        "moisture",
        "motion",
        "moving",
        "occupancy",
        "opening",
        "plug",
        "power",
        "presence",
        "problem",
        "running",
        "safety",
        "smoke",
        "sound",
        "tamper",
        "update",
        "vibration",
        "window",
    },
    "button": {"identify", "restart", "update"},
    "switch": {"outlet", "switch"},
}
# A sensor's device class: the units it takes and the state classes it allows. Only the classes
# holdover uses; a new one fails the check until its rule is written here.
SENSOR_CLASSES: dict[str | None, tuple[set[str | None], set[str]]] = {
    None: ({None, "%", "s", "min", "h", "d", "ms", "V"}, {"measurement", "total", "total_increasing"}),
    "battery": ({"%"}, {"measurement"}),
    "voltage": ({"V", "mV", "µV", "kV", "MV"}, {"measurement"}),
    "duration": ({"d", "h", "min", "s", "ms", "µs"}, {"measurement", "total", "total_increasing"}),
    "signal_strength": ({"dB", "dBm"}, {"measurement"}),
    "enum": ({None}, set()),
}
ENTITY_CATEGORIES = {"config", "diagnostic"}
TOPIC_RE = re.compile(r"^[^#+\x00]+$")
OBJECT_ID_RE = re.compile(r"^[a-zA-Z0-9_-]+$")
CONFIG_TOPIC_RE = re.compile(r"^(?P<prefix>[^/]+)/(?P<component>[^/]+)/(?P<node>[a-zA-Z0-9_-]+)/(?P<oid>[^/]+)/config$")


def expand(config: dict[str, Any]) -> dict[str, Any]:
    out = {ABBREVIATIONS.get(k, k): v for k, v in config.items()}
    if isinstance(out.get("device"), dict):
        out["device"] = {DEVICE_ABBREVIATIONS.get(k, k): v for k, v in out["device"].items()}
    return out


def check(topic: str, config: dict[str, Any]) -> list[str]:
    """What Home Assistant would refuse in one discovery message (empty: it takes it)."""
    m = CONFIG_TOPIC_RE.match(topic)
    if not m:
        return [f"{topic}: not <prefix>/<component>/<node_id>/<object_id>/config"]
    component, oid = m["component"], m["oid"]
    if component not in KEYS:
        return [f"{topic}: holdover announces no {component}"]
    problems = []
    if not OBJECT_ID_RE.match(oid):
        problems.append(f"object id {oid!r} has characters outside [a-zA-Z0-9_-]")
    c = expand(config)
    unknown = set(c) - KEYS[component]
    if unknown:
        problems.append(f"keys a {component} does not have: {sorted(unknown)}")
    problems += [f"{component} needs {k}" for k in REQUIRED[component] - set(c)]
    for k in ("state_topic", "command_topic", "availability_topic", "json_attributes_topic"):
        if k in c and not (isinstance(c[k], str) and TOPIC_RE.match(c[k])):
            problems.append(f"{k} {c.get(k)!r} is not a topic to publish to (no wildcards)")
    # availability_topic and an availability list exclude each other (vol.Exclusive); each item of
    # the list is a topic, and the mode is one of three.
    if "availability" in c:
        if "availability_topic" in c:
            problems.append("availability and availability_topic cannot both be given")
        items = c["availability"]
        if not isinstance(items, list) or not items:
            problems.append("availability must be a non-empty list")
        else:
            for item in items:
                t = item.get("topic") if isinstance(item, dict) else None
                if not (isinstance(t, str) and TOPIC_RE.match(t)) or set(item) - {
                    "topic",
                    "payload_available",
                    "payload_not_available",
                    "value_template",
                }:
                    problems.append(f"availability item {item!r} is not {{topic: ...}}")
    if "availability_mode" in c and c["availability_mode"] not in ("all", "any", "latest"):
        problems.append(f"availability_mode {c['availability_mode']!r} is not all, any or latest")
    if "device" in c:
        d = c["device"]
        if not d.get("identifiers") and not d.get("connections"):
            problems.append("device needs identifiers or connections")
        for pair in d.get("connections") or []:
            if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
                problems.append(f"device connection {pair!r} is not [type, value]")
        url = d.get("configuration_url")
        if url is not None and not re.match(r"^(https?|homeassistant)://\S+$", str(url)):
            problems.append(f"device configuration_url {url!r} is not an http(s) or homeassistant:// URL")
        if "unique_id" not in c:
            problems.append("an entity with a device needs a unique_id")
    # An entity id is <component>.<object id>, lower case, digits and underscores (HA slugifies
    # anything else, and the id a doc promised is not the one made).
    if "object_id" in c and not re.fullmatch(r"[a-z0-9_]+", str(c["object_id"])):
        problems.append(f"object_id {c['object_id']!r} is not an entity id's slug ([a-z0-9_])")
    if "default_entity_id" in c and c["default_entity_id"] != f"{component}.{c.get('object_id')}":
        problems.append(f"default_entity_id {c['default_entity_id']!r} is not {component}.<object_id>")
    if c.get("entity_category") is not None and c["entity_category"] not in ENTITY_CATEGORIES:
        problems.append(f"entity_category {c['entity_category']!r}")
    if component == "sensor" and c.get("entity_category") == "config":
        problems.append("a sensor cannot be a config entity")
    cls = c.get("device_class")
    if component == "sensor":
        if cls not in SENSOR_CLASSES:
            problems.append(f"sensor device_class {cls!r} has no rule here (add Home Assistant's)")
        else:
            units, state_classes = SENSOR_CLASSES[cls]
            unit = c.get("unit_of_measurement")
            if unit not in units:
                problems.append(f"unit {unit!r} is not one of {cls}'s {sorted(u for u in units if u)}")
            sc = c.get("state_class")
            if sc is not None and sc not in state_classes:
                problems.append(f"state_class {sc!r} is not allowed for device_class {cls!r}")
            if cls == "enum" and not (isinstance(c.get("options"), list) and c["options"]):
                problems.append("an enum sensor needs its options")
            if cls != "enum" and "options" in c:
                problems.append("options belong to an enum sensor only")
    elif cls is not None and cls not in DEVICE_CLASSES.get(component, set()):
        problems.append(f"{component} device_class {cls!r} is not one of Home Assistant's")
    return [f"{topic}: {p}" for p in problems]
