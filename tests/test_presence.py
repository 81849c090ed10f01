"""The bridge and the broker: sentinel presence as events, reconnects, and a broker it cannot reach."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from holdover.bridge.mqtt_link import Inbound
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
    rig = rig_factory(hooks=[hook])
    rig.wait("boot", 15)
    assert _host_events(rig.dir, "sentinel_online") == []  # first sight of an online sentinel: nothing to say
    rig.control.send(wlan=False)  # silent, not closed: the broker's keepalive (1.5 x 5 s) fires the will
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

    def event(seq: int, prev: int | None) -> Inbound:
        data = {"on": True, "why": "command"} | ({"prev": prev} if prev else {})
        payload = protocol.encode(signer, "s1", "b00tb00t", seq, 10, None, protocol.RELAY, data)
        return Inbound(protocol.topic("s1", protocol.EVENT), payload, False, time.time())

    caplog.set_level(logging.WARNING, logger="holdover")
    assert b.handle(event(1, None)).accepted
    assert b.handle(event(3, 1)).accepted  # seq 2 was a state message: no gap, the chain holds
    assert b.view("s1").gaps == 0
    assert b.handle(event(7, 5)).accepted  # 5 was an event, and never came
    assert b.view("s1").gaps == 1
    assert "event gap in boot b00tb00t: seq 7 came before seq 5 was heard" in caplog.text
