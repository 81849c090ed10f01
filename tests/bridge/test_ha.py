"""Home Assistant: the sentinel and the node as devices, every retained discovery config checked
against Home Assistant's rules (tests/ha_rules.py), the relay the right way round for its wiring,
the node's state, availability and checkpoint button, on a real Mosquitto with the emulated board."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

import holdover
from ha_rules import check
from holdover.bridge.node_report import NodeReport
from holdover.firmware import protocol
from holdover.journal import Journal
from holdover.lab import nut
from holdover.settings import Settings
from support import Listener, wait_for

RELAY = {"relay": {"pin": 26, "min_interval_ms": 0, "cycle_after_s": 0, "cycle_ms": 400}}
BATTERY = {"battery": {"pin": 34, "interval_ms": 200, "samples": 4}}
NODE = "gpu1"


def _retained(rig, topic_filter: str, want: int, timeout: float = 20.0) -> dict[str, dict]:
    """The retained configs under a filter, as a fresh subscriber (Home Assistant starting) gets them."""
    lis = Listener(rig, [topic_filter])
    got: dict[str, dict] = {}
    try:
        deadline = time.monotonic() + timeout
        while len(got) < want and time.monotonic() < deadline:
            try:
                t, p, _r = lis.next(0.5)
            except TimeoutError:
                continue
            if p:
                got[t] = json.loads(p)
        try:  # anything more that was there
            while True:
                t, p, _r = lis.next(1.0)
                if p:
                    got[t] = json.loads(p)
        except TimeoutError:
            pass
    finally:
        lis.close()
    return got


def _publish(rig, topic: str, payload: bytes, retain: bool = False) -> None:
    c = paho.Client(CallbackAPIVersion.VERSION2)
    c.connect(rig.broker.host, rig.broker.port)
    c.loop_start()
    try:
        c.publish(topic, payload, qos=1, retain=retain).wait_for_publish(5)
    finally:
        c.disconnect()
        c.loop_stop()


def _checkpoints(rig) -> list[dict]:
    with Journal(rig.dir / "journal.db", readonly=True) as j:
        return [e.data for e in j.events(kinds=["checkpoint_requested"])]


@pytest.mark.long
def test_the_sentinel_and_the_node_are_devices_home_assistant_takes(rig_factory, tmp_path: Path) -> None:
    rig = rig_factory(
        firmware={**RELAY, **BATTERY, "ha": {"url": "http://holdover.lan:8787/"}},
        protect={"registry": str(tmp_path / "reg"), "grace": 60},
        bridge_extra={"failover": {"node": NODE}, "ha": {"url": "http://holdover.lan:8787/", "press_every_s": 30}},
    )
    rig.wait("boot", 15)
    # What was published before this release: the switch "Relay". The board empties it on connect.
    old = protocol.ha_config_topic("homeassistant", "switch", rig.sid, "relay")
    sentinel = {
        protocol.ha_config_topic("homeassistant", c, rig.sid, o)
        for c, o in [
            ("binary_sensor", "mains"),
            ("sensor", "battery_v"),
            ("sensor", "battery_pct"),
            ("sensor", "runtime"),
            ("binary_sensor", "modem_power"),
            ("button", "power_cycle"),
            ("sensor", "rssi"),
            ("sensor", "uptime"),
            ("sensor", "reset_cause"),
            ("button", "restart"),
        ]
    }
    node_id = protocol.ha_node_id(NODE)
    node = {
        protocol.ha_config_topic("homeassistant", c, node_id, o)
        for c, o in [
            ("binary_sensor", "line_power"),
            ("sensor", "rescue"),
            ("sensor", "runs_at_risk"),
            ("button", "checkpoint"),
        ]
    }
    got = _retained(rig, "homeassistant/#", len(sentinel) + len(node))
    assert set(got) == sentinel | node, sorted(got)
    assert old not in got
    problems = [p for t, c in got.items() for p in check(t, c)]
    assert problems == [], problems
    # The entity ids an automation written from the docs names are the ones asked of Home Assistant
    # (built from names it made button.holdover_demo_power_cycle_modem), and the docs' table lists
    # every one of the sentinel's.
    ids = {c["default_entity_id"] for c in got.values()}
    doc = (Path(holdover.__file__).parents[2] / "docs" / "service.md").read_text()
    documented = {
        x.replace("<sid>", rig.sid)
        for x in re.findall(r"`((?:binary_sensor|sensor|button|switch)\.holdover_<sid>_\w+)`", doc)
    }
    assert f"button.holdover_{rig.sid}_power_cycle" in ids & documented, (sorted(ids), sorted(documented))
    assert {i for i in ids if "_node_" not in i} <= documented, sorted(ids - documented)
    assert f"binary_sensor.holdover_node_{NODE}_line_power" in ids, sorted(ids)

    # The relay as what it does, on the wiring the docs give (the modem on the normally-closed contact).
    modem = got[protocol.ha_config_topic("homeassistant", "binary_sensor", rig.sid, "modem_power")]
    assert (modem["name"], modem["dev_cla"]) == ("Modem power", "power")
    assert "'OFF' if d.relay else 'ON'" in modem["val_tpl"]
    # Each device in full at least once, Home Assistant tying the rest to it by its id; the
    # sentinel's carries its MAC, as an ESPHome device's does.
    full = {c["dev"]["ids"][0]: c["dev"] for c in got.values() if "name" in c["dev"]}
    assert set(full) == {f"holdover_{rig.sid}", f"holdover_{node_id}"}, full
    assert {c["dev"]["ids"][0] for c in got.values()} == set(full)
    for d in full.values():
        assert (d["sw"], d["cu"]) == (holdover.__version__, "http://holdover.lan:8787/"), d
    assert full[f"holdover_{rig.sid}"]["cns"] == [["mac", "24:6f:28:0a:0b:0c"]]
    # What an ESPHome device shows of itself, read from the board's state.
    rssi = got[protocol.ha_config_topic("homeassistant", "sensor", rig.sid, "rssi")]
    assert (rssi["dev_cla"], rssi["unit_of_meas"], rssi["ent_cat"]) == ("signal_strength", "dBm", "diagnostic")
    state = rig.board_state()
    assert state["rssi"] == -58 and state["reset_cause"] == "power_on" and state["uptime_ms"] > 0, state

    # The node: its own device, its state, its availability.
    line = got[protocol.ha_config_topic("homeassistant", "binary_sensor", node_id, "line_power")]
    assert line["dev"]["ids"] == [f"holdover_{node_id}"] and line["dev"]["name"] == f"holdover node {NODE}"
    assert line["avty_t"] == protocol.node_topic(NODE, protocol.STATUS)
    lis = Listener(rig, [protocol.node_topic(NODE, "#")])
    try:
        seen: dict[str, bytes] = {}

        def heard(topic: str, test=lambda p: True) -> bool:
            try:
                while True:
                    t, p, _r = lis.next(0.2)
                    seen[t] = p
            except TimeoutError:
                pass
            return topic in seen and test(seen[topic])

        state_topic = protocol.node_topic(NODE, protocol.STATE)
        wait_for(lambda: heard(protocol.node_topic(NODE, protocol.STATUS), lambda p: p == b"online"), 10, "online")
        wait_for(lambda: heard(state_topic), 10, "the node's state")
        state = json.loads(seen[state_topic])
        assert (state["node"], state["on_battery"], state["rescue"], state["runs"]) == (NODE, False, "idle", {})
        since = time.monotonic()
        rig.control.send(mains=False)
        rig.wait("mains_lost", 5, since)
        # No UPS here: the node is on battery because the sentinel on its circuit lost mains.
        on_battery = lambda p: json.loads(p)["on_battery"] is True and json.loads(p)["rescue"] == "grace"  # noqa: E731
        wait_for(lambda: heard(state_topic, on_battery), 5, "the node on battery, in its grace")
        assert json.loads(seen[state_topic])["mains_lost_at"] == [rig.sid]

        # The checkpoint button, as Home Assistant presses it: once; again within press_every_s,
        # retained, or with another payload, refused.
        press = protocol.node_topic(NODE, protocol.NODE_CHECKPOINT)
        _publish(rig, press, b"PRESS")
        wait_for(lambda: len(_checkpoints(rig)) == 1, 5, "the checkpoint asked for")
        assert _checkpoints(rig) == [{"by": f"home assistant ({press})"}]
        _publish(rig, press, b"PRESS")
        _publish(rig, press, b"PRESS", retain=True)
        _publish(rig, press, b"rm -rf")
        time.sleep(1.0)
        assert len(_checkpoints(rig)) == 1
        _publish(rig, press, b"", retain=True)  # clear the retained one

        # A clean stop says offline (a crash leaves it to the last will).
        rig.bridge.stop()
        rig.bridge = None
        wait_for(lambda: heard(protocol.node_topic(NODE, protocol.STATUS), lambda p: p == b"offline"), 10, "offline")
    finally:
        lis.close()


def test_on_the_normally_open_contact_the_relay_is_a_switch_and_a_cycle_releases_the_coil(rig_factory) -> None:
    rig = rig_factory(
        firmware={"relay": {**RELAY["relay"], "wiring": "no"}, "ha": {"via": NODE}},
        bridge_extra={"failover": {"node": NODE}},
    )
    boot = rig.wait("boot", 15)
    got = _retained(rig, protocol.ha_config_topic("homeassistant", "+", rig.sid, "+"), 7)
    switch = protocol.ha_config_topic("homeassistant", "switch", rig.sid, "modem_power")
    button = protocol.ha_config_topic("homeassistant", "button", rig.sid, "power_cycle")
    assert set(got) == {
        protocol.ha_config_topic("homeassistant", "binary_sensor", rig.sid, "mains"),
        switch,
        button,
        *(protocol.ha_config_topic("homeassistant", "sensor", rig.sid, o) for o in ("rssi", "uptime", "reset_cause")),
        protocol.ha_config_topic("homeassistant", "button", rig.sid, "restart"),
    }, sorted(got)
    assert [p for t, c in got.items() for p in check(t, c)] == []
    # What a press reaches goes through this node's bridge (the board's ha.via): available only
    # while both are; a reading needs the board alone.
    both = [{"topic": protocol.topic(rig.sid, protocol.STATUS)}, {"topic": protocol.node_topic(NODE, protocol.STATUS)}]
    restart = protocol.ha_config_topic("homeassistant", "button", rig.sid, "restart")
    for t in (switch, button, restart):
        assert (got[t]["avty"], got[t]["avty_mode"], "avty_t" in got[t]) == (both, "all", False), got[t]
    mains = got[protocol.ha_config_topic("homeassistant", "binary_sensor", rig.sid, "mains")]
    assert mains["avty_t"] == protocol.topic(rig.sid, protocol.STATUS) and "avty" not in mains
    assert (got[switch]["name"], got[switch]["cmd_t"]) == ("Modem power", protocol.topic(rig.sid, "relay/set"))
    assert "'ON' if d.relay else 'OFF'" in got[switch]["val_tpl"]
    # The coil rests energised (the modem on); the button's cycle releases it, then energises it again.
    since = time.monotonic()
    _publish(rig, protocol.topic(rig.sid, protocol.RELAY_SET), b"PULSE 400")
    off = rig.wait("relay", 5, since)
    back = rig.wait("relay", 5, off.at + 1e-6)
    assert (off.info["data"]["on"], back.info["data"]["on"]) == (False, True), (off, back)
    # Journaled with who asked for it (the broker's ACL lets only Home Assistant publish there).
    with Journal(rig.dir / "journal.db", readonly=True) as j:
        [asked] = j.events(kinds=["relay_commanded"])
    want = {
        "sentinel": rig.sid,
        "op": "pulse",
        "ms": 400,
        "by": f"home assistant ({protocol.topic(rig.sid, 'relay/set')})",
    }
    assert {k: asked.data[k] for k in want} == want, asked.data
    assert boot is not None

    # The restart button, as ESPHome's: the board reboots, says it was asked (not a crash, which
    # machine.reset() is to the ESP32), and counts no crash towards safe mode.
    assert (got[restart]["pl_prs"], got[restart]["dev_cla"], got[restart]["ent_cat"]) == (
        "RESTART",
        "restart",
        "config",
    )
    since = time.monotonic()
    _publish(rig, protocol.topic(rig.sid, protocol.RELAY_SET), b"RESTART")
    again = rig.wait("boot", 20, since)
    assert (again.info["data"]["reset_cause"], again.info["data"]["crashes"]) == ("command", 0), again.info


def test_the_firmware_and_the_host_are_one_release() -> None:
    from holdover.firmware import version

    assert holdover.__version__ == version.VERSION


def test_the_rules_refuse_what_home_assistant_refuses() -> None:
    dev = {"ids": ["x"], "name": "x"}
    base = {"name": "n", "uniq_id": "u", "stat_t": "a/b", "dev": dev}
    t = "homeassistant/sensor/holdover_x/o/config"
    assert check(t, {**base, "dev_cla": "battery", "unit_of_meas": "%", "stat_cla": "measurement"}) == []
    assert "unit 'V' is not one of battery's" in check(t, {**base, "dev_cla": "battery", "unit_of_meas": "V"})[0]
    assert (
        "state_class 'measurement'" in check(t, {**base, "dev_cla": "enum", "ops": ["a"], "stat_cla": "measurement"})[0]
    )
    assert "an enum sensor needs its options" in check(t, {**base, "dev_cla": "enum"})[0]
    assert "needs state_topic" in check(t, {k: v for k, v in base.items() if k != "stat_t"})[0]
    assert "not a topic" in check(t, {**base, "stat_t": "a/+/b"})[0]
    assert "configuration_url" in check(t, {**base, "dev": {**dev, "cu": "holdover.lan"}})[0]
    assert "needs command_topic" in check("homeassistant/switch/holdover_x/o/config", {"name": "n", "uniq_id": "u"})[0]
    assert (
        "not one of Home Assistant's"
        in check("homeassistant/binary_sensor/holdover_x/o/config", {**base, "dev_cla": "mains"})[0]
    )
    assert "keys a button does not have" in check("homeassistant/button/holdover_x/o/config", {**base, "cmd_t": "c"})[0]


def test_each_run_is_an_entity_while_it_is_listed_and_leaves_when_it_is_not(tmp_path: Path) -> None:
    import os

    from holdover.bridge.service import Bridge
    from holdover.node import launch
    from holdover.settings import Settings
    from holdover.train import registry
    from support import KEY

    reg = tmp_path / "reg"
    cfg = Settings.model_validate(
        {
            "journal": {"path": str(tmp_path / "j.db")},
            "protect": {"registry": str(reg)},
            "failover": {"node": NODE},
            "sentinels": [{"id": "rack1", "key": KEY}],
        }
    )
    b = Bridge(cfg)
    sent: list[tuple[str, bytes]] = []
    b.node_report.publish = lambda t, p, _retain: sent.append((t, p))
    # Started by Slurm: the Guard keeps SLURM_JOB_ID, and the node's state names the job.
    me = registry.Registration("llama.7b", os.getpid(), "", str(tmp_path / "ckpt"), 12, [], "/", 0.0, job="4242")
    registry.write_registration(reg, me)
    state = b.node_report.report(launch.recover(reg))
    assert state["runs"] == {"llama.7b": {"state": "running", "job": "4242", "step": None, "checkpoint_age_s": None}}
    run_topics = {t for t, _ in sent if "/holdover_node_gpu1/run_" in t}
    assert run_topics == {
        "homeassistant/sensor/holdover_node_gpu1/run_llama_7b/config",
        "homeassistant/sensor/holdover_node_gpu1/run_llama_7b_checkpoint_age/config",
    }
    configs = {t: json.loads(p) for t, p in sent if t in run_topics}
    assert [p for t, c in configs.items() for p in check(t, c)] == []
    assert configs["homeassistant/sensor/holdover_node_gpu1/run_llama_7b/config"]["name"] == "Run llama.7b"
    sent.clear()
    b.node_report.report(launch.recover(reg))  # listed again: nothing announced again
    assert [t for t, _ in sent if "config" in t] == []
    b.node_report.report([])  # the run no longer listed: its entities emptied
    assert sorted((t, p) for t, p in sent if "config" in t) == sorted((t, b"") for t in run_topics)
    b.journal.close()


@pytest.mark.skipif(not nut.available(), reason="needs Debian's nut-server (scripts/ensure-system-deps.sh)")
def test_the_host_ups_is_shown_as_home_assistants_nut_integration_shows_one(rig_factory, tmp_path: Path) -> None:
    online = {"ups.status": "OL", "battery.charge": "100", "battery.runtime": "900", "ups.load": "30"}
    with nut.NutServer(tmp_path / "nut", {"hostups": online}) as ups:
        rig = rig_factory(
            emulator=False,
            protect={"registry": str(tmp_path / "reg"), "grace": 60},
            bridge_extra={"failover": {"node": NODE}, "ups": {"nut": f"hostups@127.0.0.1:{ups.port}", "poll_s": 0.2}},
        )
        node_id = protocol.ha_node_id(NODE)
        want = [
            ("sensor", "ups_status"),
            ("binary_sensor", "ups_on_battery"),
            ("binary_sensor", "ups_low_battery"),
            ("sensor", "ups_load"),
            ("sensor", "ups_runtime"),
            ("sensor", "ups_charge"),
        ]
        topics = {protocol.ha_config_topic("homeassistant", c, node_id, o): (c, o) for c, o in want}
        got = _retained(rig, protocol.ha_config_topic("homeassistant", "+", node_id, "+"), 9)
        assert set(topics) <= set(got), sorted(got)
        assert [p for t, c in got.items() for p in check(t, c)] == []
        status = got[protocol.ha_config_topic("homeassistant", "sensor", node_id, "ups_status")]
        assert (status["dev_cla"], status["ops"]) == ("enum", ["online", "on_battery", "low_battery", "stale"])
        low = got[protocol.ha_config_topic("homeassistant", "binary_sensor", node_id, "ups_low_battery")]
        assert low["dev_cla"] == "battery"  # on = low, as Home Assistant reads a battery binary sensor

        # Each state as the node's retained state carries it, read by those templates.
        lis = Listener(rig, [protocol.node_topic(NODE, protocol.STATE)])
        try:

            def reads(word: str, **ups_has: object) -> bool:
                try:
                    while True:
                        _t, p, _r = lis.next(0.2)
                        state = json.loads(p)
                        if state["ups_status"] == word and all(
                            (state["ups"] or {}).get(k) == v for k, v in ups_has.items()
                        ):
                            return True
                except TimeoutError:
                    return False

            wait_for(lambda: reads("online", load=30.0, charge=100.0), 15, "online, 30 % load")
            ups.set("hostups", **{**online, "ups.status": "OB DISCHRG", "ups.load": "55"})
            wait_for(lambda: reads("on_battery", load=55.0), 15, "on battery")
            ups.set("hostups", **{**online, "ups.status": "OB DISCHRG LB", "battery.runtime": "40"})
            wait_for(lambda: reads("low_battery"), 15, "low battery")
            ups.stop_upsd()  # NUT's server gone: the node says stale, not its last word
            wait_for(lambda: reads("stale"), 20, "stale")
        finally:
            lis.close()


def test_the_uplink_in_use_and_its_state_are_enums_of_the_nodes_own_uplinks(tmp_path: Path) -> None:
    s = Settings.model_validate(
        {
            "journal": {"path": str(tmp_path / "j.db")},
            "failover": {
                "node": NODE,
                "targets": ["192.0.2.1"],
                "uplinks": [
                    {"name": "wan", "dev": "wan0", "gateway": "192.0.2.254"},
                    {"name": "lte", "dev": "wwan0", "gateway": "198.51.100.1"},
                ],
            },
        }
    )
    seen: list[tuple[bool, str | None]] = [(False, None)]
    report = NodeReport(s, None, lambda *a: None, None, None, lambda: seen[0], None)  # type: ignore[arg-type]
    got = dict(report.discovery([]))
    node_id = protocol.ha_node_id(NODE)
    in_use = got[protocol.ha_config_topic("homeassistant", "sensor", node_id, "uplink")]
    status = got[protocol.ha_config_topic("homeassistant", "sensor", node_id, "uplink_status")]
    assert (in_use["ops"], status["ops"]) == (["wan", "lte"], ["up", "on_backup", "down"])
    assert [p for t, c in got.items() for p in check(t, c)] == []
    words = []
    for heard_active in [(False, None), (True, "wan"), (True, "lte"), (True, None)]:
        words.append(report._uplink_status(*heard_active))
    assert words == [None, "up", "on_backup", "down"]  # before failover's first word: unknown, not down
