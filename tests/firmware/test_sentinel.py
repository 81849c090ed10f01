"""The complete sentinel in the MicroPython unix port, against real Mosquitto and the real bridge.

Uplink probe targets, the NTP server and the serial peer are real sockets on loopback that
the tests start and stop; nothing here is a mock of the firmware's own code.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import time
from pathlib import Path

import paho.mqtt.client as paho
import pytest
import serial
from paho.mqtt.enums import CallbackAPIVersion

from holdover.bridge import commands as command
from holdover.firmware import protocol
from holdover.journal import HOST_BOOT, Journal
from holdover.lab.rig import Rig
from holdover.lab.targets import TcpTarget, UdpServer, dns_answer
from support import HOLDOVER, Listener, wait_for

NTP_TIME = 1924992000  # 2031-01-01T00:00:00Z, far from the host clock, so its effect is visible


def ntp_answer(q: bytes) -> bytes | None:
    if len(q) < 48:
        return None
    secs = NTP_TIME + 2208988800
    return bytes([0x24]) + bytes(39) + struct.pack("!II", secs, 0)


def _uplink(targets: list[dict]) -> dict:
    return {"uplink": {"targets": targets}}


# --- uplink watch ----------------------------------------------------------------------------------


def test_one_dead_target_of_three_raises_nothing_and_all_dead_is_lost_within_3s(rig_factory) -> None:
    a, b = TcpTarget(), TcpTarget()
    dns = UdpServer(dns_answer)
    targets = [
        {"kind": "tcp", "host": "127.0.0.1", "port": a.port, "name": "a"},
        {"kind": "tcp", "host": "127.0.0.1", "port": b.port, "name": "b"},
        {"kind": "dns", "host": "127.0.0.1", "port": dns.port, "name": "dns"},
    ]
    try:
        rig = rig_factory(firmware=_uplink(targets))
        rig.wait("boot", 15)
        wait_for(lambda: rig.board_state()["uplink"] == "up", 10, "uplink up")
        assert dns.requests > 0  # the DNS target really was asked

        a.stop()  # one target of three: degraded, never lost
        st = wait_for(lambda: (st := rig.board_state())["uplink"] == "degraded" and st, 10, "uplink degraded")
        by_name = {t["name"]: t for t in st["targets"]}
        assert by_name["a"]["loss_pct"] > 0 and by_name["b"]["loss_pct"] == 0
        assert rig.count("uplink_lost") == 0

        t0 = time.monotonic()
        b.stop()
        dns.alive = False
        lost = rig.wait("uplink_lost", 10, since=t0)
        # The default budget (3 s) plus the bridge's share; the benchmark measures it properly.
        assert lost.at - t0 < 3.5, lost.at - t0
        assert lost.info["data"]["outage_ms"] >= 1000
        assert {t["name"] for t in lost.info["data"]["targets"]} == {"a", "b", "dns"}

        t1 = time.monotonic()
        b.start()  # one answering target is enough with reliability 1
        back = rig.wait("uplink_restored", 10, since=t1)
        assert back.info["data"]["outage_ms"] >= (t1 - t0) * 1000 - 1000
        assert rig.count("uplink_lost") == 1
    finally:
        a.stop()
        b.stop()
        dns.close()


def test_a_dns_target_that_answers_servfail_is_down(rig_factory) -> None:
    servfail = UdpServer(lambda q: q[:2] + b"\x81\x82" + q[4:12] + q[12:] if len(q) >= 12 else None)
    try:
        rig = rig_factory(bridge=False, firmware=_uplink([{"kind": "dns", "host": "127.0.0.1", "port": servfail.port}]))
        wait_for(lambda: rig.board_state()["uplink"] == "down", 15, "uplink down on SERVFAIL")
        assert servfail.requests >= 3
    finally:
        servfail.close()


# --- offline queue ----------------------------------------------------------------------------------


def test_event_raised_while_the_broker_is_down_arrives_once_after_restart(rig_factory) -> None:
    rig = rig_factory()
    rig.wait("boot", 15)
    rig.broker.stop()
    rig.control.send(mains=False)

    def queued() -> bool:  # raised, and on the board's flash with nowhere to go
        st = rig.board_state()
        return st["mains"] is False and st["outbox_bytes"] > 0

    wait_for(queued, 10, "mains_lost queued on the board")
    rig.broker.start()
    ev = rig.wait("mains_lost", 30)
    assert ev.info["data"]["on_battery"] is True
    time.sleep(2.0)  # anything sent twice would have come by now
    assert rig.count("mains_lost") == 1
    wait_for(lambda: rig.board_state()["outbox_bytes"] == 0, 10, "outbox drained")


def test_a_reboot_on_battery_keeps_the_queue_and_its_order(rig_factory) -> None:
    rig = rig_factory()
    first = rig.wait("boot", 15)
    rig.broker.stop()

    def mains(on: bool) -> None:  # the board has seen it (debounced) and queued its event
        wait_for(lambda: rig.board_state()["mains"] is on, 10, f"the board's mains {on}")

    rig.control.send(mains=False)
    mains(False)
    rig.control.send(mains=True)
    mains(True)
    time.sleep(1.5)  # the outbox's position saved (once a second): nothing on the board says when
    rig.control.send(mains=False)
    mains(False)
    raised = rig.board_state()
    assert raised["outbox_bytes"] > 0
    rig.control.raw(b'{"reset": true}')  # the supervisor boots it again, as the chip would
    wait_for(lambda: rig.emulator and rig.emulator.boots == 2, 15, "second boot")
    rig.control.close()
    rig.control.connect()
    rig.broker.start()
    boot_a = first.info["boot"]
    wait_for(lambda: rig.count("mains_lost") >= 3, 30, "both boots' mains_lost")
    time.sleep(1.5)
    with Journal(rig.dir / "journal.db", readonly=True) as j:
        evs = list(reversed(j.events(sid=rig.sid)))
    old = [(e.kind, e.seq) for e in evs if e.boot == boot_a]
    kinds = [k for k, _ in old]
    assert kinds.count("mains_lost") == 2 and kinds.count("mains_restored") == 1, old
    # Delivered in the order raised, and each exactly once.
    assert [s for _, s in old] == sorted(s for _, s in old)
    new = [e for e in evs if e.boot not in (boot_a, HOST_BOOT)]  # the bridge's own presence events aside
    assert new[0].kind == "boot" and new[0].data["reset_cause"] == "hard"
    assert any(e.kind == "mains_lost" and e.data.get("at_boot") for e in new)
    # The old boot's events arrived before the new boot's, as raised.
    assert max(e.id for e in evs if e.boot == boot_a) < min(e.id for e in new)
    gaps = rig.bridge.bridge.gaps if rig.bridge is not None else None
    assert gaps is not None and not gaps.open and not gaps.lost  # each named its predecessor


# --- the USB serial channel -----------------------------------------------------------------------


def _serial_open(rig: Rig) -> bool:
    """Every serial link of the bridge open; False before its loop has made them (all() of none is
    True, and the port's open drains whatever was written before it)."""
    links = rig.bridge.bridge.serial if rig.bridge else []
    return bool(links) and all(s.connected.is_set() for s in links)


def test_serial_only_delivery_with_the_wlan_down_then_deduplicated(rig_factory) -> None:
    rig = rig_factory(serial=True)
    rig.wait("boot", 15)
    # A UART keeps nothing for a reader that is not there: cut only once the bridge holds the port.
    assert rig.bridge is not None
    wait_for(lambda: _serial_open(rig), 10, "the serial port open")
    wait_for(lambda: rig.board_state()["outbox_bytes"] == 0, 15, "boot event receipted")
    rig.control.send(wlan=False)
    t0 = time.monotonic()
    rig.control.send(mains=False)
    ev = rig.wait("mains_lost", 10, since=t0)
    assert ev.info["source"] == "serial"
    assert "runtime_s" not in ev.info["data"] or ev.info["data"]["runtime_s"] > 0
    # The bridge's receipt came back by the cable: the outbox lets it go with the WLAN still down.
    wait_for(lambda: rig.board_state()["outbox_bytes"] == 0, 10, "receipted over serial")
    rig.control.send(wlan=True)  # the copy still queued for MQTT goes out now, and is a duplicate
    wait_for(lambda: rig.bridge.bridge.view(rig.sid).duplicates >= 1, 30, "the MQTT copy")
    time.sleep(1.0)
    assert rig.count("mains_lost") == 1
    assert rig.bridge is not None
    assert rig.bridge.bridge.view(rig.sid).duplicates >= 1
    with Journal(rig.dir / "journal.db", readonly=True) as j:
        assert not j.rejections("duplicate") and not j.rejections("replayed")


def test_a_garbled_serial_line_is_rejected_by_name(tmp_path: Path) -> None:
    # A fake sentinel at the far end of the cable: the bridge's real pyserial link reads it.
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    rig = Rig(tmp_path / "rig", serial=False)
    rig.serial_addr = ("127.0.0.1", port)
    rig.start(emulator=False)
    try:
        conn, _ = srv.accept()
        # Opening a port flushes its input (pyserial does, as a UART driver does): talk once it is open.
        assert rig.bridge is not None
        wait_for(lambda: _serial_open(rig), 10, "the serial port open")
        good = protocol.encode(protocol.Signer(rig.key), rig.sid, "b00t", 1, 5, None, "heartbeat", {})
        conn.sendall(b"ets Jun  8 2016 00:22:57\r\n# 12 a log line\n{garbage\n")
        conn.sendall(good[:40] + b"\x00\xff" + good[42:] + b"\n" + good + b"\n")
        rig.wait("heartbeat", 10)
        with Journal(rig.dir / "journal.db", readonly=True) as j:
            rej = wait_for(lambda: j.rejections() if len(j.rejections()) >= 2 else None, 5, "two rejections")
        assert {r["reason"] for r in rej} == {"malformed"}, rej
        assert all(r["source"] == "serial" for r in rej)
        conn.close()
    finally:
        rig.close()
        srv.close()


# --- battery and runtime ------------------------------------------------------------------------------

BATTERY = {"battery": {"pin": 34, "interval_ms": 200, "samples": 4, "low_pct": 30, "critical_pct": 10}}


def test_battery_low_and_critical_with_hysteresis_carry_the_runtime(rig_factory) -> None:
    rig = rig_factory(firmware=BATTERY)
    rig.wait("boot", 15)
    st = rig.board_state()
    assert st["battery_level"] == "ok" and st["runtime_s"] > 0
    rig.control.send(mains=False)
    on_batt = rig.wait("mains_lost", 10)
    full = on_batt.info["data"]["runtime_s"]
    assert full > 0
    rig.control.send(battery_v=3.55)  # ~20 %: low
    low = rig.wait("battery_low", 15)
    assert low.info["data"]["on_battery"] is True and 0 < low.info["data"]["runtime_s"] < full
    rig.control.send(battery_v=3.62)  # ~27 %, back above low but inside the hysteresis band: stays low
    # Judged as it is read: once the board reads 3.62 V its level has been weighed against it.
    wait_for(lambda: abs((rig.board_state()["battery_v"] or 0) - 3.62) < 0.005, 10, "the board reading 3.62 V")
    assert rig.count("battery_ok") == 0 and rig.board_state()["battery_level"] == "low"
    rig.control.send(battery_v=3.2)  # ~3 %: critical
    crit = rig.wait("battery_critical", 15)
    assert crit.info["data"]["previous"] == "low"
    rig.control.send(battery_v=4.0)
    rig.wait("battery_ok", 15)
    assert rig.count("battery_low") == 1 and rig.count("battery_critical") == 1


# --- relay commands ---------------------------------------------------------------------------------

# The minimum interval is long enough that the round trips below (each ~1 s through broker and bridge)
# all fall inside it.
RELAY_MIN_INTERVAL_S = 8
RELAY = {"relay": {"pin": 26, "min_interval_ms": RELAY_MIN_INTERVAL_S * 1000, "cycle_after_s": 0}}


def _current_boot(rig: Rig) -> str:
    lis = Listener(rig, [protocol.topic(rig.sid, protocol.STATE)])
    try:
        _t, p, _r = lis.next(10)
        return protocol.open_envelope(p, protocol.Signer(rig.key), rig.sid)["boot"]
    finally:
        lis.close()


def _publish(rig: Rig, payload: bytes, topic_leaf: str = protocol.CMD, retain: bool = False) -> None:
    c = paho.Client(CallbackAPIVersion.VERSION2)
    c.connect(rig.broker.host, rig.broker.port)
    c.loop_start()
    c.publish(protocol.topic(rig.sid, topic_leaf), payload, qos=1, retain=retain).wait_for_publish(5)
    c.loop_stop()
    c.disconnect()


def _ack(rig: Rig, cid: str, since: float, timeout: float = 10) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for s in list(rig.seen):
            if s.what == "ack" and s.at >= since and s.info.get("id") == cid:
                return s.info
        time.sleep(0.05)
    raise AssertionError(f"no ack for {cid}; saw {[x.what for x in rig.seen[-10:]]}")


@pytest.mark.long
def test_relay_commands_run_once_and_forged_replayed_retained_are_refused(rig_factory) -> None:
    rig = rig_factory(firmware=RELAY)
    rig.wait("boot", 15)
    boot = _current_boot(rig)
    relay = lambda: rig.control.send(get="relay")["relay"]  # noqa: E731

    t = time.monotonic()
    t_on = time.monotonic()
    on, cid = command.build(rig.key, rig.sid, boot, "on")
    _publish(rig, on)
    assert _ack(rig, cid, t)["ok"] is True
    assert relay() is True
    assert rig.control.send(get="relay")["pin"] == 0  # active-low module: energised = pin low
    rig.wait("relay", 5, since=t)

    t = time.monotonic()
    _publish(rig, on)  # the very same bytes again
    ack = _ack(rig, cid, t)
    assert (ack["ok"], ack["reason"]) == (False, "replayed")

    t = time.monotonic()
    off, cid = command.build(rig.key, rig.sid, boot, "off")
    _publish(rig, off)  # inside the minimum interval
    assert _ack(rig, cid, t)["reason"] == "too_soon"
    assert relay() is True

    forged, cid = command.build(b"not-the-key-0123456789", rig.sid, boot, "off")
    before = rig.board_state()["cmd_refused"]
    _publish(rig, forged)
    wait_for(lambda: rig.board_state()["cmd_refused"] > before, 5, "forged command refused")
    assert not any(s.what == "ack" and s.info.get("id") == cid for s in rig.seen)

    # A broker sets the retain flag only on delivery to a new subscription (MQTT-3.3.1-9/12), so a
    # retained command reaches the sentinel as such when it (re)subscribes: after a radio drop.
    rig.control.send(wlan=False)
    t = time.monotonic()
    retained, cid = command.build(rig.key, rig.sid, boot, "off")
    _publish(rig, retained, retain=True)
    rig.control.send(wlan=True)
    assert _ack(rig, cid, t, timeout=40)["reason"] == "retained"
    _publish(rig, b"", retain=True)  # clear it from the broker

    t = time.monotonic()
    stale, cid = command.build(rig.key, rig.sid, "0ldb00t0", "off")
    _publish(rig, stale)
    assert _ack(rig, cid, t)["reason"] == "stale_boot"
    assert relay() is True  # nothing refused ever switched it

    # Home Assistant's switch: plain OFF, signed and forwarded by the bridge, once the interval is over.
    time.sleep(max(0.0, t_on + RELAY_MIN_INTERVAL_S + 0.2 - time.monotonic()))
    t = time.monotonic()
    _publish(rig, b"OFF", topic_leaf=protocol.RELAY_SET)
    wait_for(lambda: relay() is False, 10, "relay off via Home Assistant")
    state = wait_for(lambda: _retained_state(rig), 10, "retained state")
    assert state["relay"] is False

    # Its "Power-cycle modem" button: PULSE and the board's cycle_ms, signed and forwarded.
    time.sleep(RELAY_MIN_INTERVAL_S + 0.2)
    t = time.monotonic()
    _publish(rig, b"PULSE 1500", topic_leaf=protocol.RELAY_SET)
    wait_for(lambda: relay() is True, 10, "the pulse: coil on (modem off)")
    wait_for(lambda: relay() is False and time.monotonic() - t > 1.5, 10, "the pulse over: modem back")
    _publish(rig, b"PULSE 5", topic_leaf=protocol.RELAY_SET)  # under 50 ms: refused by the bridge, by name

    def refused() -> list[dict]:
        with Journal(rig.dir / "journal.db", readonly=True) as j:
            return [r for r in j.rejections() if r["topic"] == protocol.topic(rig.sid, protocol.RELAY_SET)]

    [r] = wait_for(refused, 10, "PULSE 5 refused")
    assert (
        r["reason"] == protocol.MALFORMED and "relay/set takes ON, OFF, PULSE MS (50..600000) or RESTART" in r["detail"]
    )


def _retained_state(rig: Rig) -> dict | None:
    lis = Listener(rig, [protocol.topic(rig.sid, protocol.STATE)])
    try:
        _t, p, _r = lis.next(5)
        d = protocol.open_envelope(p, protocol.Signer(rig.key), rig.sid)["data"]
        return d if d["relay"] is False else None
    finally:
        lis.close()


def test_holdover_relay_sends_a_signed_pulse_and_prints_the_answer(rig_factory) -> None:
    rig = rig_factory(firmware=RELAY)
    rig.wait("boot", 15)
    cmd = [HOLDOVER, "relay", rig.sid, "--config", str(rig.dir / "holdover.toml")]
    t = time.monotonic()
    out = subprocess.run([*cmd[:3], "pulse", "3000", *cmd[3:]], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"{rig.sid}: pulse 3000 ms: ok (relay now on)"
    assert rig.control.send(get="relay")["relay"] is True
    rig.wait("relay", 5, since=t)
    # "off" ends the pulse early; "on" right after is inside the minimum interval: refused on the
    # board, and the reason printed.
    off = subprocess.run([*cmd[:3], "off", *cmd[3:]], capture_output=True, text=True, timeout=60)
    assert off.stdout.strip() == f"{rig.sid}: off: ok (relay now off)", off
    again = subprocess.run([*cmd[:3], "on", *cmd[3:]], capture_output=True, text=True, timeout=60)
    said = "refused: too_soon: inside the relay's min_interval_ms of its last switch (relay off)"
    assert again.returncode == 1 and said in again.stderr, again
    assert rig.control.send(get="relay")["relay"] is False
    bad = subprocess.run([*cmd[:3], "blink", *cmd[3:]], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "op: must be one of on, off, pulse" in bad.stderr, bad
    stranger = subprocess.run([HOLDOVER, "relay", "nobody", "on", *cmd[3:]], capture_output=True, text=True)
    assert stranger.returncode == 2 and "no key for 'nobody'" in stranger.stderr


def test_a_refusal_is_said_in_words_once() -> None:
    """The ack's reason with the sentinel's detail, or what the reason means when it sent none
    (it once read `refused: no_relay: no_relay`)."""
    from holdover.bridge.commands import refusal

    assert refusal({"reason": "no_relay", "detail": "no_relay"}) == (
        "no_relay: this sentinel has no relay (relay.pin in its board config)"
    )
    assert refusal({"reason": "expired", "detail": "sent at 10, the board's clock says 99"}) == (
        "expired: sent at 10, the board's clock says 99"
    )
    assert refusal({"reason": "strange"}) == "strange"


def test_a_pulse_over_the_serial_port_is_answered_there(rig_factory) -> None:
    rig = rig_factory(bridge=False, serial=True, firmware=RELAY)
    port = serial.serial_for_url(rig.serial_url, timeout=0.2)
    try:
        boot = None
        deadline = time.monotonic() + 15
        while boot is None and time.monotonic() < deadline:
            rig.control.send(mains=not rig.control.send(get="world")["world"]["mains"])  # make it talk
            for line in port.readlines():
                if line.startswith(b"{"):
                    boot = protocol.open_envelope(line.strip(), protocol.Signer(rig.key), rig.sid)["boot"]
        assert boot
        pulse, cid = command.build(rig.key, rig.sid, boot, "pulse", ms=400)
        port.write(pulse + b"\n")
        # The board says it on the same line: the ack, then the relay's own events, on and off
        # (sampling the relay from outside can miss a 400 ms pulse on a loaded machine).
        ack = None
        switched: list[bool] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (ack and switched[-1:] == [False]):
            for line in port.readlines():
                if line.startswith(b"{"):
                    body = protocol.open_envelope(line.strip(), protocol.Signer(rig.key), rig.sid)
                    if body["kind"] == "ack" and body["data"]["id"] == cid:
                        ack = body["data"]
                    elif body["kind"] == protocol.RELAY and body["data"]["why"] == "command":
                        switched.append(body["data"]["on"])
        assert ack and ack["ok"] is True and switched == [True, False], (ack, switched)
        assert rig.control.send(get="relay")["relay"] is False  # the pulse ended by itself
        port.write(b"this is not a command\n" + b"{" + b"x" * 100 + b"}\n")
        wait_for(lambda: rig.board_state()["cmd_refused"] >= 1, 5, "garbage refused")
    finally:
        port.close()


def test_the_modem_is_power_cycled_when_the_uplink_stays_down(rig_factory) -> None:
    # Live wiring only: uplink lost -> one pulse, on then off. The policy's cap and its battery
    # rule are tests/firmware/test_rules.py's, on hours of virtual time.
    tgt = TcpTarget()
    fw = {
        **_uplink([{"kind": "tcp", "host": "127.0.0.1", "port": tgt.port}]),
        "relay": {"pin": 26, "cycle_after_s": 1, "cycle_ms": 300, "cycles_per_hour": 1, "min_interval_ms": 0},
    }
    try:
        rig = rig_factory(firmware=fw)
        rig.wait("boot", 15)
        wait_for(lambda: rig.board_state()["uplink"] == "up", 10, "uplink up")
        tgt.stop()
        rig.wait("uplink_lost", 10)
        on = rig.wait("relay", 10)
        assert {k: on.info["data"][k] for k in ("on", "why")} == {"on": True, "why": "uplink_down"}
        wait_for(
            lambda: [s.info["data"]["on"] for s in rig.seen if s.what == "relay"] == [True, False], 5, "the pulse's end"
        )
    finally:
        tgt.stop()


# --- staying alive ------------------------------------------------------------------------------------


def _led_settles(rig: Rig, shown: str, period_ms: int, timeout: float) -> None:
    """The status LED shows `shown`, and its last two blinks had the pattern's period (+-15 %)."""

    def blinking() -> bool:
        if rig.board_state()["led"] != shown:
            return False
        periods = rig.control.send(get="led")["periods_ms"][-2:]
        return len(periods) == 2 and all(abs(p - period_ms) < period_ms * 0.15 for p in periods)

    wait_for(blinking, timeout, f"the LED showing {shown} with a {period_ms} ms period")


@pytest.mark.long
def test_the_status_led_says_ok_warning_and_error_by_its_blink(rig_factory) -> None:
    rig = rig_factory(firmware={"led": {"pin": 2}, "mqtt": {"keepalive_s": 2}})
    rig.wait("boot", 15)
    _led_settles(rig, "ok", 3000, 15)  # a blip every 3 s: alive and well
    rig.control.send(mains=False)
    rig.wait("mains_lost", 10)
    _led_settles(rig, "warning", 1000, 8)  # on battery: a slow blink
    # The broker out of reach: nobody hears this sentinel, which is worse than being on battery.
    rig.control.send(wlan=False)
    _led_settles(rig, "error", 200, 15)
    rig.control.send(wlan=True)
    rig.control.send(mains=True)
    # Back to ok (its blink period was measured above; two more 3 s periods would prove nothing new).
    wait_for(lambda: rig.board_state()["led"] == "ok", 30, "the LED back to ok")


def _seed_nvs(rig: Rig, crashes: int) -> None:
    d = rig.dir / "board"
    d.mkdir(parents=True, exist_ok=True)
    (d / "nvs.json").write_text(json.dumps({"crashes": crashes, "boots": 7}))


@pytest.mark.parametrize(("cause", "safe"), [("wdt", True), ("power_on", False)])
def test_safe_mode_after_crash_loops_but_never_after_power_cycles(rig_factory, cause: str, safe: bool) -> None:
    rig = rig_factory(emulator=False, reset_cause=cause, firmware={**RELAY, "safe_mode": {"after": 5}})
    _seed_nvs(rig, 4)
    rig.start_emulator()
    boot = rig.wait("boot", 15)
    assert boot.info["data"]["safe_mode"] is safe
    assert boot.info["data"]["reset_cause"] == cause and boot.info["data"]["boot_count"] == 8
    st = rig.board_state()
    assert st["safe_mode"] is safe and (st["relay"] is None) is safe
    # Safe or not, the power watch is on duty.
    rig.control.send(mains=False)
    rig.wait("mains_lost", 10)


def test_ntp_sets_the_clock_once_the_uplink_is_up(rig_factory) -> None:
    ntp = UdpServer(ntp_answer)
    try:
        rig = rig_factory(firmware={**RELAY, "ntp": {"host": "127.0.0.1", "port": ntp.port}, "heartbeat_s": 1})
        wait_for(lambda: ntp.requests, 15, "an NTP query")
        hb = rig.wait("heartbeat", 10, since=time.monotonic())

        def stamped() -> bool:
            # The query seen is not the answer applied: a heartbeat may go out between the two.
            with Journal(rig.dir / "journal.db", readonly=True) as j:
                return j.events(kind="heartbeat", limit=1)[0].ts is not None

        wait_for(stamped, 10, "a heartbeat stamped with the board's wall time")
        with Journal(rig.dir / "journal.db", readonly=True) as j:
            ev = j.events(kind="heartbeat", limit=1)[0]
            boot = j.events(kind="boot", limit=1)[0]
        assert abs(ev.ts - NTP_TIME) < 30, (ev.ts, hb)
        # Before the first sync the board has no wall time: the boot event said so, and the
        # bridge took it all the same.
        assert boot.ts is None
        # Now the board has a clock (2031, by our NTP server): a command stamped by this machine's
        # clock is years out and refused as expired; one stamped within a minute of the board's runs.
        boot_id = _current_boot(rig)
        t = time.monotonic()
        stale, cid = command.build(rig.key, rig.sid, boot_id, "on")
        _publish(rig, stale)
        ack = _ack(rig, cid, t)
        assert (ack["ok"], ack["reason"]) == (False, "expired") and ack["detail"].startswith("sent at"), ack
        fresh, cid = command.build(rig.key, rig.sid, boot_id, "on", ts=NTP_TIME + 5)
        _publish(rig, fresh)
        assert _ack(rig, cid, t)["ok"] is True
    finally:
        ntp.close()


@pytest.mark.long
def test_home_assistant_discovery_is_retained_with_availability(rig_factory) -> None:
    rig = rig_factory(bridge=False, firmware={**RELAY, **BATTERY})
    lis = Listener(rig, ["homeassistant/#"])
    try:
        got = {}
        node = f"holdover_{rig.sid}"
        # The board sends them in a fixed order and empties the entities of older releases last
        # (the switch "Relay"): that empty one says the set is complete.
        last = f"homeassistant/switch/{node}/relay/config"
        deadline = time.monotonic() + 15
        while last not in got and time.monotonic() < deadline:
            try:
                t, p, _r = lis.next(1)
            except TimeoutError:
                continue
            got[t] = json.loads(p) if p else None
        assert got.pop(last, "never") is None, got.keys()
        assert set(got) == {
            f"homeassistant/binary_sensor/{node}/mains/config",
            f"homeassistant/sensor/{node}/battery_v/config",
            f"homeassistant/sensor/{node}/battery_pct/config",
            f"homeassistant/sensor/{node}/runtime/config",
            f"homeassistant/sensor/{node}/rssi/config",
            f"homeassistant/sensor/{node}/uptime/config",
            f"homeassistant/sensor/{node}/reset_cause/config",
            f"homeassistant/binary_sensor/{node}/modem_power/config",
            f"homeassistant/button/{node}/power_cycle/config",
            f"homeassistant/button/{node}/restart/config",
        }, got.keys()  # no uplink entities: this board probes no target
        button = got[f"homeassistant/button/{node}/power_cycle/config"]
        # The button sends the board's own cycle_ms; a button has no state to read.
        assert (button["name"], button["pl_prs"], button["cmd_t"]) == (
            "Power-cycle modem",
            f"PULSE {RELAY['relay'].get('cycle_ms', 10000)}",
            protocol.topic(rig.sid, "relay/set"),
        )
        assert "stat_t" not in button
        for c in (c for t, c in got.items() if "/button/" not in t):
            assert c["avty_t"] == protocol.topic(rig.sid, protocol.STATUS)
            assert c["stat_t"] == protocol.topic(rig.sid, protocol.STATE)
        assert got[f"homeassistant/binary_sensor/{node}/mains/config"]["dev_cla"] == "power"
        # The sentinel's own cell is named as such, never as the host's UPS.
        cell = got[f"homeassistant/sensor/{node}/battery_pct/config"]
        assert (cell["name"], cell["ent_cat"], cell["stat_cla"]) == ("Sentinel battery", "diagnostic", "measurement")
        assert got[f"homeassistant/sensor/{node}/runtime/config"]["name"] == "Sentinel battery runtime"
        # The relay on the documented wiring (normally closed): a state the right way round, no switch.
        assert got[f"homeassistant/binary_sensor/{node}/modem_power/config"]["name"] == "Modem power"
    finally:
        lis.close()

    # Removed on request: every config emptied, and a fresh subscriber gets none of them back.
    bridge_cfg = rig.dir / "holdover.toml"
    assert bridge_cfg.exists()
    out = subprocess.run(
        [HOLDOVER, "ha-remove", rig.sid, "--config", str(bridge_cfg)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert sorted(line.split()[1] for line in out.stdout.splitlines() if line.startswith("removed ")) == sorted(got)
    lis = Listener(rig, ["homeassistant/#"])
    try:
        with pytest.raises(TimeoutError):
            lis.next(1.5)
    finally:
        lis.close()


# --- config: pins that break their role on an ESP32 -------------------------------------------------
