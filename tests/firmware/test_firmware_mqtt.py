"""The firmware's own MQTT client, in the MicroPython unix port under an ESP32's heap, against real Mosquitto."""

from __future__ import annotations

import contextlib
import time

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from holdover.board import mpy_build
from holdover.board.emulator import CHIP_HEAP_KB, HEAP_RATIO_64_TO_32, layer_bytes
from holdover.bridge import discovery
from holdover.firmware import protocol
from holdover.lab.rig import Rig
from support import Listener, wait_for


def _event_kind(rig: Rig, payload: bytes) -> str:
    return protocol.open_envelope(payload, protocol.Signer(rig.key), rig.sid)["kind"]


def test_last_will_fires_when_the_board_network_is_cut(rig_factory) -> None:
    rig = rig_factory(bridge=False, keepalive_s=2)
    status = protocol.topic(rig.sid, protocol.STATUS)
    lis = Listener(rig, [status])
    try:
        lis.next(15, lambda t, p, r: p == b"online")
        t = time.monotonic()
        rig.control.send(wlan=False)
        lis.next(10, lambda t, p, r: p == b"offline")
        # The broker notices a silent client within 1.5 keepalives; the firmware may give up sooner.
        # Mosquitto checks keepalives about once a second, so allow a few seconds over 1.5 keepalives.
        assert time.monotonic() - t < 2 * 1.5 + 4
        # The radio comes back: the firmware reconnects by itself and is born again.
        rig.control.send(wlan=True)
        lis.next(15, lambda t, p, r: p == b"online")
    finally:
        lis.close()


def test_retained_state_is_there_for_a_late_subscriber(rig_factory) -> None:
    rig = rig_factory(bridge=False)
    rig.control.send(mains=False)
    time.sleep(rig.debounce_ms / 1000 + 0.5)
    # Late: only once the sentinel has joined WiFi, reached the broker and delivered everything.
    wait_for(lambda: rig.board_state()["queued"] == 0, 15, "the sentinel's queue to drain")
    lis = Listener(rig, [protocol.topic(rig.sid, protocol.STATE), protocol.topic(rig.sid, protocol.STATUS)])
    try:
        _t, payload, retained = lis.next(10, lambda t, p, r: t.endswith("/state"))
        assert retained
        body = protocol.open_envelope(payload, protocol.Signer(rig.key), rig.sid)
        assert body["kind"] == protocol.STATE_KIND
        assert body["data"]["mains"] is False
        _t, status, retained = lis.next(5, lambda t, p, r: t.endswith("/status"))
        assert (status, retained) == (b"online", True), rig.lines
    finally:
        lis.close()


def test_qos1_event_raised_while_mosquitto_restarts_still_arrives(rig_factory) -> None:
    rig = rig_factory(bridge=False, emulator=False)
    events = protocol.topic(rig.sid, protocol.EVENT)
    # A persistent session, so the broker keeps what arrives for it while it is away.
    lis = Listener(rig, [events], client_id="test-listener", persistent=True)
    assert lis.subscribed.wait(10)
    rig.start_emulator()  # only now: the boot event must not go out before anyone listens
    try:
        lis.next(15, lambda t, p, r: _event_kind(rig, p) == "boot")
        lis.close()  # away: from here on only the broker's stored session can hear for it
        rig.broker.stop()
        rig.control.send(mains=False)
        time.sleep(rig.debounce_ms / 1000 + 1.0)  # raised, queued, unsent: there is no broker
        state = rig.board_state()
        assert state["mains"] is False and state["queued"] >= 1
        rig.broker.start()
        wait_for(lambda: rig.board_state()["queued"] == 0, 30, "the sentinel's queue to drain")
        # Back after the restart, without subscribing again: the session survived the restart.
        lis = Listener(rig, [events], client_id="test-listener", persistent=True)
        _t, payload, _r = lis.next(30, lambda t, p, r: _event_kind(rig, p) == "mains_lost")
        assert lis.session_present is True
        body = protocol.open_envelope(payload, protocol.Signer(rig.key), rig.sid)
        # The event keeps the time it was raised, not the time it was finally delivered.
        assert body["ms"] < rig.board_state()["uptime_ms"] - 500
    finally:
        lis.close()


def test_the_test_broker_keeps_a_session_across_its_restart(rig_factory) -> None:
    """A QoS 1 message published while the subscriber is away is delivered after the broker restarts."""
    rig = rig_factory(bridge=False, emulator=False)
    lis = Listener(rig, ["probe/#"], client_id="away", persistent=True)
    assert lis.subscribed.wait(10)
    lis.close()
    pub = paho.Client(CallbackAPIVersion.VERSION2)
    pub.connect(rig.broker.host, rig.broker.port)
    pub.loop_start()
    pub.publish("probe/x", b"kept", qos=1).wait_for_publish(10)
    pub.loop_stop()
    pub.disconnect()
    rig.broker.restart()
    lis = Listener(rig, ["probe/#"], client_id="away", persistent=True)
    try:
        assert lis.next(10)[1] == b"kept", rig.broker.log.read_text()
        assert lis.session_present is True
    finally:
        lis.close()


@pytest.mark.long
def test_firmware_fits_an_esp32_heap(rig_factory) -> None:
    # Every feature on: battery, relay, three probe targets, discovery, NTP.
    targets = [{"kind": "tcp", "host": "127.0.0.1", "port": 9}, {"kind": "dns", "host": "127.0.0.1", "port": 9}]
    fw = {
        "battery": {"pin": 34},
        "relay": {"pin": 26},
        "uplink": {"targets": [*targets, {"kind": "tcp", "host": "127.0.0.1", "port": 10}]},
        "ntp": {"host": "127.0.0.1", "port": 9},
    }
    rig = rig_factory(bridge=False, firmware=fw)
    for _ in range(5):
        rig.control.send(mains=False)
        time.sleep(0.4)
        rig.control.send(mains=True)
        time.sleep(0.4)
    # The moment the heap is fullest: a radio drop with events piling up, then the reconnect
    # (birth, state, the backlog, Home Assistant's discovery) all at once.
    rig.control.send(wlan=False)
    # Home Assistant's configs as they are sent again after the reconnect (live, not retained).
    status = protocol.topic(rig.sid, protocol.STATUS)
    disco = Listener(rig, [discovery.node_filter(rig.sid), status])
    for _ in range(4):
        rig.control.send(mains=False)
        time.sleep(0.4)
        rig.control.send(mains=True)
        time.sleep(0.4)
    rig.control.send(wlan=True)
    wait_for(lambda: rig.board_state()["queued"] == 0, 30, "the backlog delivered")
    sent: set[str] = set()
    at: dict[str, float] = {}
    # The entities of older releases are emptied last: that one says the set is complete.
    last = protocol.ha_config_topic(protocol.HA_PREFIX, "switch", rig.sid, "relay")

    def all_configs_sent() -> bool:
        with contextlib.suppress(TimeoutError):
            while True:
                topic, payload, retained = disco.next(0.05)
                if topic == status:
                    if not retained:  # the birth after the reconnect, not the one held from before
                        at.setdefault(payload.decode(), time.monotonic())
                elif not retained:
                    sent.add(topic)
                    at[topic] = time.monotonic()
        return last in sent

    try:
        wait_for(all_configs_sent, 20, "the discovery configs after the reconnect")
    finally:
        disco.close()
    # mains, uplink and its status, the cell's volts, % and runtime, WiFi signal, uptime, last
    # reset, the modem's power, the power-cycle and restart buttons, and the emptied relay switch.
    assert len(sent) == 13, sorted(sent)
    # All of them within a second of the board's birth, the backlog delivered first, so a fresh
    # Home Assistant never holds part of the set (they went one a second: 13 s).
    burst = at[last] - at["online"]
    print(f"discovery: {len(sent)} configs, the last {burst * 1000:.0f} ms after the birth")
    assert burst < 1.0, burst
    # Even when the burst runs the heap out, the firmware skips telemetry (state); it never loses
    # an event or dies.
    assert not [line for line in rig.lines if "LOST" in line or "Traceback" in line or "died" in line], rig.lines
    assert rig.control.send(get="world")["world"]["mains"] is True
    mem = rig.control.send(get="mem")["mem"]
    total = mem["free"] + mem["alloc"]
    assert total <= 1.01 * CHIP_HEAP_KB * HEAP_RATIO_64_TO_32 * 1024
    assert 0 < mem["hwm"] < total
    # In the chip's terms (the measured 64-to-32-bit ratio): room left after a collection for a
    # burst of events and a reconnect, beside WiFi's own buffers, which live outside this heap; the
    # fullest moment includes Home Assistant's discovery burst, measured as it runs.
    # A bound on what the emulator measures as its own world and control port at their import, so
    # firmware can never hide in it: edges, ghosts, jitter, timed dips, the WLAN; about 17 KB.
    assert 0 < mem["emu_only"] < 20 * 1024, mem
    # What is not on a chip: board_emu with its world and control port, in place of board_esp32's
    # code, each imported after the firmware in a fresh interpreter (33 against 6 KB here).
    build = mpy_build.build()
    emu, esp32 = layer_bytes(build, "board_emu"), layer_bytes(build, "board_esp32")
    assert 0 < esp32 < emu < 40 * 1024, (emu, esp32)
    chip_live_kb = (mem["hwm"] - (emu - esp32)) / HEAP_RATIO_64_TO_32 / 1024
    layers = f"board_esp32 {esp32 / 1024:.1f} KB in place of board_emu and its world {emu / 1024:.1f} KB, this port"
    print(f"the chip's live heap at its fullest: {chip_live_kb:.1f} KB of {CHIP_HEAP_KB} ({layers})")
    assert CHIP_HEAP_KB - chip_live_kb > 30, (chip_live_kb, mem)
