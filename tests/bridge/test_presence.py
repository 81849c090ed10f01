"""The bridge and the broker: sentinel presence as events, reconnects, and a broker it cannot reach."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from holdover.bridge.mqtt_link import Inbound
from holdover.bridge.presence import Presence
from holdover.bridge.service import Bridge, BridgeThread
from holdover.firmware import protocol
from holdover.journal import HOST_BOOT, Journal
from holdover.lab.broker import free_port
from holdover.settings import Settings
from support import wait_for


def _host_events(rig_dir: Path, kind: str) -> list:
    with Journal(rig_dir / "journal.db", readonly=True) as j:
        return [e for e in j.events(kind=kind, limit=50) if e.boot == HOST_BOOT]


def test_a_sentinel_that_drops_off_and_comes_back_is_two_journaled_events_that_hooks_see(
    rig_factory, tmp_path: Path
) -> None:
    ran = tmp_path / "ran"
    hook = {"events": ["sentinel_offline", "sentinel_online"], "run": f"echo $HOLDOVER_EVENT >> {ran}"}
    rig = rig_factory(hooks=[hook], keepalive_s=2)
    rig.wait("boot", 15)
    assert _host_events(rig.dir, "sentinel_online") == []  # first sight of an online sentinel: nothing to say
    rig.control.send(wlan=False)  # silent, not closed: the broker's keepalive (1.5 x 2 s) fires the will
    off = wait_for(lambda: _host_events(rig.dir, "sentinel_offline"), 15, "sentinel_offline")[0]
    assert off.sid == rig.sid and off.data["was"] == "online"
    rig.control.send(wlan=True)
    wait_for(lambda: _host_events(rig.dir, "sentinel_online"), 20, "sentinel_online")
    wait_for(lambda: ran.exists() and ran.read_text().split() == ["sentinel_offline", "sentinel_online"], 10, "hooks")

    # A bridge restart reads the retained "online" again: no second sentinel_online.
    rig.bridge.stop()
    rig.start_bridge(rig.bridge.bridge.settings)
    view = lambda: rig.bridge.bridge.sentinels.get(rig.sid)  # noqa: E731
    wait_for(lambda: view() is not None and view().status == "online", 10, "the retained status again")
    time.sleep(0.5)
    assert len(_host_events(rig.dir, "sentinel_online")) == 1


def test_the_bridge_is_back_within_2s_of_the_broker(rig_factory) -> None:
    rig = rig_factory()
    rig.wait("boot", 15)
    link = rig.bridge.bridge.link
    rig.broker.stop()
    wait_for(lambda: not link.connected.is_set(), 10, "the bridge to notice")
    # 4 s down: retries capped at 2 s come at +1, +3, +5 s; paho's own growing backoff (+1, +3,
    # +7 s) would leave the bridge away 3 s after the broker is back. (bench holds longer outages.)
    time.sleep(4)
    rig.broker.start()
    t0 = time.monotonic()
    wait_for(link.connected.is_set, 10, "the bridge to reconnect")
    assert time.monotonic() - t0 < 2.5


def test_a_broker_that_refuses_is_named_in_the_log_with_the_reason(tmp_path: Path, caplog) -> None:
    port = free_port()  # nothing listens there
    s = Settings.model_validate({"mqtt": {"port": port}, "journal": {"path": str(tmp_path / "j.db")}})
    caplog.set_level(logging.INFO, logger="holdover")
    b = BridgeThread(Bridge(s)).start()
    try:
        wait_for(lambda: "cannot connect to broker" in caplog.text, 10, "the connect failure logged")
        # Two more attempts: the same reason is not repeated each time.
        wait_for(lambda: b.bridge.link is not None and b.bridge.link.connect_failures >= 3, 10, "two more attempts")
    finally:
        b.stop()
    lines = [r.getMessage() for r in caplog.records if "cannot connect" in r.getMessage()]
    assert lines[0] == f"cannot connect to broker 127.0.0.1:{port}: Connection refused (for 0 s; retrying every 2 s)"
    assert len(lines) == 1, lines


def test_an_event_that_names_a_predecessor_never_heard_is_logged_as_a_gap(tmp_path: Path, caplog) -> None:
    key = "3c9e1f7a5b2d8c4e6f0a1b3d5e7c9a2f"
    s = Settings.model_validate({"journal": {"path": str(tmp_path / "j.db")}, "sentinels": [{"id": "s1", "key": key}]})
    b = Bridge(s)
    signer = protocol.Signer(key)
    now = [100.0]
    b.gaps.clock = lambda: now[0]

    def event(seq: int, prev: int | None) -> Inbound:
        data = {"on": True, "why": "command"} | ({"prev": prev} if prev else {})
        payload = protocol.encode(signer, "s1", "b00tb00t", seq, 10, None, protocol.RELAY, data)
        return Inbound(protocol.topic("s1", protocol.EVENT), payload, False, time.time())

    caplog.set_level(logging.WARNING, logger="holdover")
    assert b.handle(event(1, None)).accepted
    assert b.handle(event(3, 1)).accepted  # seq 2 was a state message: no gap, the chain holds
    assert not b.gaps.open
    assert b.handle(event(7, 5)).accepted  # 5 was an event, and never came
    assert list(b.gaps.open) == [("s1", "b00tb00t", 5)]
    b.gaps.judge()
    assert not b.gaps.lost  # late until the sentinel's outbox has had its chance to send it again
    now[0] += b.gaps.wait_s
    b.gaps.judge()
    assert b.gaps.lost == {"s1": 1}
    assert "event gap in boot b00tb00t: seq 5, named by seq 7, not heard in 75 s: lost on the sentinel" in caplog.text


@pytest.mark.long
def test_a_sentinel_off_the_network_but_heard_on_serial_is_a_path_warning_not_unwatched(rig_factory) -> None:
    rig = rig_factory(serial=True, heartbeat_s=1, keepalive_s=2, bridge=False, emulator=False)
    cfg = rig.bridge_config()
    cfg["serial"] = [{"url": rig.serial_url, "silent_after_s": 3}]
    rig.start_bridge(Settings.model_validate(cfg))
    rig.start_emulator()
    rig.wait("boot", 15)
    rig.control.send(wlan=False)  # the will fires after 1.5 x 2 s; heartbeats still come over serial
    down = wait_for(lambda: _host_events(rig.dir, "sentinel_path_down"), 20, "sentinel_path_down")[0]
    assert down.data == {"path": "MQTT", "via": f"serial {rig.serial_url}"}
    with Journal(rig.dir / "journal.db", readonly=True) as j:
        assert j.status(rig.sid) == "serial only"
    rig.control.send(wlan=True)
    up = wait_for(lambda: _host_events(rig.dir, "sentinel_path_up"), 20, "sentinel_path_up")[0]
    assert up.data["path"] == "MQTT"
    assert _host_events(rig.dir, "sentinel_offline") == []  # never unwatched: serial carried it all along

    rig.emulator.stop()  # the board gone: its socket closes (the will) and the serial lines stop
    off = wait_for(lambda: _host_events(rig.dir, "sentinel_offline"), 20, "sentinel_offline")
    assert len(off) == 1 and sorted(off[0].data["paths"]) == sorted(["mqtt", rig.serial_url])
    assert _host_events(rig.dir, "sentinel_online") == []


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_presence_by_path_on_a_virtual_clock(tmp_path: Path) -> None:
    raised: list[tuple[str, str]] = []
    clock = _Clock()
    port = "/dev/ttyUSB0"
    with Journal(tmp_path / "j.db") as j:
        p = Presence(j, lambda sid, kind, data: raised.append((kind, data.get("path", ""))), {port: 75}, clock)
        p.status("s1", "online", retained=True)  # first sight, online: nothing to say
        p.heard("s1", port)
        p.status("s1", "offline", retained=False)
        assert raised == [("sentinel_path_down", "MQTT")]
        clock.t += 60
        p.heard("s1", port)  # a heartbeat: the serial path stays alive
        clock.t += 74
        p._settle("s1", p._get("s1"), False)
        assert raised[-1][0] == "sentinel_path_down" and len(raised) == 1
        clock.t += 2  # 76 s since the last line: no path is left
        p._settle("s1", p._get("s1"), False)
        assert raised[-1][0] == "sentinel_offline" and j.status("s1") == "offline"
        p._settle("s1", p._get("s1"), False)
        assert len(raised) == 2  # said once
        p.heard("s1", port)  # back, over serial only: and so its MQTT path is still down
        assert raised[-2:] == [("sentinel_online", ""), ("sentinel_path_down", "MQTT")]
        assert j.status("s1") == "serial only"
        p.status("s1", "online", retained=False)
        assert raised[-1] == ("sentinel_path_up", "MQTT")
        # The serial cable pulled while MQTT carries it: a warning about that path.
        clock.t += 80
        p._settle("s1", p._get("s1"), False)
        assert raised[-1] == ("sentinel_path_down", f"serial {port}") and j.status("s1") == "online"
        n = len(raised)

        # A restart: the journal's word stands, the retained online raises nothing.
        again = Presence(j, lambda sid, kind, data: raised.append((kind, "")), {port: 75}, clock)
        again.status("s1", "online", retained=True)
        assert len(raised) == n
