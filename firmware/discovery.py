# Home Assistant MQTT discovery: retained config messages that point at the retained state.
#
# Imported when a connection comes up and dropped again afterwards (sentinel.py), so its
# bytecode does not sit in the heap between connects.
import json

import protocol
import version

_ENTITIES = (
    # component, object id, name, template on the state body's data, extra fields
    ("binary_sensor", "mains", "Mains", "'ON' if d.mains else 'OFF'", {"dev_cla": "power"}),
    ("binary_sensor", "uplink", "Uplink", "'OFF' if d.uplink == 'down' else 'ON'", {"dev_cla": "connectivity"}),
    # The sentinel's own cell, named so (it keeps the ESP32 alive; the host's UPS is not it) and
    # filed as the device's diagnostics, as Home Assistant files a sensor's battery.
    ("sensor", "battery_v", "Sentinel battery voltage", "d.battery_v", {"dev_cla": "voltage", "unit_of_meas": "V"}),
    ("sensor", "battery_pct", "Sentinel battery", "d.battery_pct", {"dev_cla": "battery", "unit_of_meas": "%"}),
    ("sensor", "runtime", "Sentinel battery runtime", "d.runtime_s", {"dev_cla": "duration", "unit_of_meas": "s"}),
    # The relay as what it does: the modem's power, the right way round for relay.wiring (the
    # coil energised is the modem off on the normally-closed contact, as hardware/ wires it).
    # A switch only on the normally-open contact, where ON is the modem on; on "nc", a state and
    # the button. The button is what a person wants: the modem off for the board's cycle_ms.
    ("binary_sensor", "modem_power", "Modem power", "'OFF' if d.relay else 'ON'", {"dev_cla": "power"}),
    ("switch", "modem_power", "Modem power", "'ON' if d.relay else 'OFF'", {"dev_cla": "outlet"}),
    ("button", "power_cycle", "Power-cycle modem", None, {"dev_cla": "restart"}),
)
# Entities of older releases, emptied on every connect so Home Assistant drops them: the switch
# "Relay" (ON energised the coil, which cut the modem) became the two above.
_GONE = (("switch", "relay"),)


def ha_entity_id(component, uid):
    """The entity id Home Assistant is asked to make, for the docs and automations to name: both
    keys, as object_id is all a release before 2025.10 reads and default_entity_id all one after
    2026.4 does (either way only when the entity is first registered: ids already made stay)."""
    # Home Assistant's slug: lower case, anything else an underscore (a node named gpu-01).
    slug = "".join(c if "a" <= c <= "z" or "0" <= c <= "9" else "_" for c in uid.lower())
    return {"obj_id": slug, "default_entity_id": component + "." + slug}


def messages(cfg, sid, board_name):
    """(topic, payload) for every entity this sentinel has, one at a time."""
    prefix = cfg["ha"]["prefix"]
    node = "holdover_" + sid
    device = {"ids": [node], "name": "holdover " + sid, "mf": "holdover", "mdl": board_name, "sw": version.VERSION}
    if cfg["ha"]["url"]:
        device["cu"] = cfg["ha"]["url"]
    wiring = cfg["relay"]["wiring"]
    for comp, oid, name, tpl, extra in _ENTITIES:
        if (oid.startswith("battery") or oid == "runtime") and cfg["battery"]["pin"] < 0:
            continue
        if oid in ("modem_power", "power_cycle") and cfg["relay"]["pin"] < 0:
            continue
        if oid == "modem_power" and (comp == "switch") != (wiring == "no"):
            continue
        if oid == "uplink" and not cfg["uplink"]["targets"]:
            continue
        c = {
            "name": name,
            "uniq_id": node + "_" + oid,
            "avty_t": protocol.topic(sid, protocol.STATUS),
            "dev": device,
        }
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
            c["pl_prs"] = "PULSE %d" % cfg["relay"]["cycle_ms"]
        if comp == "sensor":
            c["stat_cla"] = "measurement"  # long-term statistics in Home Assistant
            c["ent_cat"] = "diagnostic"
        c.update(extra)
        yield protocol.ha_config_topic(prefix, comp, sid, oid), json.dumps(c)
    for comp, oid in _GONE:
        yield protocol.ha_config_topic(prefix, comp, sid, oid), ""
