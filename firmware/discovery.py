# Home Assistant MQTT discovery: retained config messages that point at the retained state.
#
# Imported when a connection comes up and dropped again afterwards (sentinel.py), so its
# bytecode does not sit in the heap between connects.
import json

import protocol
import version

DIAG = "diagnostic"


def _entities(cfg):
    # (component, object id, name, template on the state body's data, extra fields) of each
    # entity this board has. Yielded, not a table: each is built as it is sent; a tuple of them
    # all held 1.7 KB more heap (unix port).
    yield ("binary_sensor", "mains", "Mains", "'ON' if d.mains else 'OFF'", {"dev_cla": "power"})
    if cfg["uplink"]["targets"]:
        yield (
            "binary_sensor",
            "uplink",
            "Uplink",
            "'OFF' if d.uplink == 'down' else 'ON'",
            {"dev_cla": "connectivity"},
        )
        # Degraded (a target losing probes) is still "connected" above: the words are here. Before
        # the first probe round it is "unknown", which Home Assistant reads as None, not an option.
        yield (
            "sensor",
            "uplink_status",
            "Uplink status",
            "d.uplink if d.uplink in ['up', 'degraded', 'down'] else None",
            {"dev_cla": "enum", "ops": ["up", "degraded", "down"]},
        )
    if cfg["battery"]["pin"] >= 0:
        # The sentinel's own cell, named so (it keeps the ESP32 alive; the host's UPS is not it)
        # and filed as the device's diagnostics, as Home Assistant files a sensor's battery.
        yield (
            "sensor",
            "battery_v",
            "Sentinel battery voltage",
            "d.battery_v",
            {"dev_cla": "voltage", "unit_of_meas": "V", "ent_cat": DIAG},
        )
        yield (
            "sensor",
            "battery_pct",
            "Sentinel battery",
            "d.battery_pct",
            {"dev_cla": "battery", "unit_of_meas": "%", "ent_cat": DIAG},
        )
        yield (
            "sensor",
            "runtime",
            "Sentinel battery runtime",
            "d.runtime_s",
            {"dev_cla": "duration", "unit_of_meas": "s", "ent_cat": DIAG},
        )
    # What an ESPHome device always shows of itself. Safe mode is said with the last reset rather
    # than as an entity of its own: the heap at a burst is the scarce thing.
    yield (
        "sensor",
        "rssi",
        "WiFi signal",
        "d.rssi",
        {"dev_cla": "signal_strength", "unit_of_meas": "dBm", "ent_cat": DIAG},
    )
    yield (
        "sensor",
        "uptime",
        "Uptime",
        "d.uptime_ms // 1000",
        {"dev_cla": "duration", "unit_of_meas": "s", "stat_cla": "total_increasing", "ent_cat": DIAG},
    )
    yield (
        "sensor",
        "reset_cause",
        "Last reset",
        "d.reset_cause ~ (', safe mode' if d.safe_mode else '')",
        {"ic": "mdi:restart-alert", "ent_cat": DIAG},
    )
    if cfg["relay"]["pin"] >= 0:
        # The relay as what it does: the modem's power, the right way round for relay.wiring (the
        # coil energised is the modem off on the normally-closed contact, as hardware/ wires it).
        # A switch only on the normally-open contact, where ON is the modem on; on "nc", a state
        # and the button. The button is what a person wants: the modem off for the board's cycle_ms.
        if cfg["relay"]["wiring"] == "no":
            yield ("switch", "modem_power", "Modem power", "'ON' if d.relay else 'OFF'", {"dev_cla": "outlet"})
        else:
            yield ("binary_sensor", "modem_power", "Modem power", "'OFF' if d.relay else 'ON'", {"dev_cla": "power"})
        yield ("button", "power_cycle", "Power-cycle modem", None, {"dev_cla": "restart"})  # fmt: skip
    yield ("button", "restart", "Restart", None, {"dev_cla": "restart", "ent_cat": "config"})


# Entities of older releases, emptied on every connect so Home Assistant drops them: the switch
# "Relay" (ON energised the coil, which cut the modem) became the two above.
_GONE = (("switch", "relay"),)


def ha_entity_id(component, uid):
    """The entity id Home Assistant is asked to make, for the docs and automations to name: both
    keys, as object_id is all a release before 2025.10 reads and default_entity_id all one after
    2026.4 does (either way only when the entity is first registered: ids already made stay)."""
    # Home Assistant's slug: lower case, anything else an underscore; a sentinel's id and the
    # object ids here hold nothing else but "-" (protocol.valid_sid).
    slug = uid.lower().replace("-", "_")
    return {"obj_id": slug, "default_entity_id": component + "." + slug}


def messages(cfg, sid, board_name, mac=None):
    """(topic, payload) for every entity this sentinel has, one at a time."""
    prefix = cfg["ha"]["prefix"]
    node = "holdover_" + sid
    device = {"ids": [node], "name": "holdover " + sid, "mf": "holdover", "mdl": board_name, "sw": version.VERSION}
    if cfg["ha"]["url"]:
        device["cu"] = cfg["ha"]["url"]
    if mac:
        device["cns"] = [["mac", mac]]  # as ESPHome's devices carry theirs: HA merges it with the router's view
    status = protocol.topic(sid, protocol.STATUS)
    via = cfg["ha"]["via"]
    for comp, oid, name, tpl, extra in _entities(cfg):
        c = {"name": name, "uniq_id": node + "_" + oid, "dev": device}
        if comp in ("switch", "button") and via:
            # A press goes through that node's bridge: with it stopped, nothing could press.
            c["avty"] = [{"topic": status}, {"topic": protocol.node_topic(via, protocol.STATUS)}]
            c["avty_mode"] = "all"
        else:
            c["avty_t"] = status
        # Else Home Assistant builds the id from the device's and the entity's names
        # (button.holdover_rack1_power_cycle_modem), which no doc can promise.
        c.update(ha_entity_id(comp, c["uniq_id"]))
        if tpl is not None:
            c["stat_t"] = protocol.topic(sid, protocol.STATE)
            c["val_tpl"] = "{% set d = value_json.body.data %}{{ " + tpl + " }}"
        if comp in ("switch", "button"):
            # HA cannot sign; the bridge turns ON/OFF/PULSE here into a signed command (docs/protocol.md).
            c["cmd_t"] = protocol.topic(sid, protocol.RELAY_SET)
        if comp == "button":
            c["pl_prs"] = "RESTART" if oid == "restart" else "PULSE %d" % cfg["relay"]["cycle_ms"]
        if "unit_of_meas" in extra:
            c["stat_cla"] = "measurement"  # long-term statistics in Home Assistant
        c.update(extra)
        yield protocol.ha_config_topic(prefix, comp, sid, oid), json.dumps(c)
        # The device in full once; Home Assistant ties the rest to it by its id, and each
        # message is that much smaller at the moment the heap is fullest.
        device = {"ids": [node]}
    for comp, oid in _GONE:
        yield protocol.ha_config_topic(prefix, comp, sid, oid), ""
