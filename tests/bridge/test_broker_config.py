"""`holdover broker-config` against the real Mosquitto: every client with its own password, each
sentinel confined to its own topics, the real firmware and bridge working through it."""

from __future__ import annotations

import json
import logging
import re
import socket
import subprocess
import time
import tomllib
from pathlib import Path

import pytest
import tomli_w

from holdover.bridge import Bridge, BridgeThread
from holdover.bridge import broker_config as bc
from holdover.firmware import protocol
from holdover.lab.broker import Broker, BrokerError
from holdover.settings import Settings
from support import HOLDOVER, Mqtt5, wait_for

KEYS = {"demo": "3c9e1f7a5b2d8c4e6f0a1b3d5e7c9a2f", "rack2": "5e0b8d2f7a4c9e1b3f6a8d0c2e5b7f9a"}


def _generate(tmp_path: Path, site: Path) -> tuple[bc.Written, str]:
    cfg = tmp_path / "h.toml"
    cfg.write_text("".join(f'[[sentinels]]\nid = "{s}"\nkey = "{k}"\n' for s, k in KEYS.items()))
    out = site / "mosquitto"  # read by mosquitto as its own user
    r = subprocess.run(
        [HOLDOVER, "broker-config", "-c", str(cfg), "--out", str(out), "--lan-address", "192.168.1.10"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    passwords = {u: (out / f"{u}.password").read_text().strip() for u in (bc.BRIDGE_USER, *KEYS)}
    w = bc.Written(out, out / "mosquitto.conf", out / "passwd", out / "acl", out / "holdover.conf", passwords)
    assert all((out / f"{u}.password").stat().st_mode & 0o777 == 0o600 for u in passwords)
    assert w.passwd.stat().st_mode & 0o777 == 0o600 and w.acl.stat().st_mode & 0o777 == 0o600
    assert "listener 1883 0.0.0.0" in w.conf.read_text() and "allow_anonymous false" in w.conf.read_text()
    return w, r.stdout


def test_broker_config_prints_configs_that_match_what_it_wrote(tmp_path: Path, site_dir: Path) -> None:
    w, out = _generate(tmp_path, site_dir)
    assert f'username = "{bc.BRIDGE_USER}"' in out and f"{bc.BRIDGE_USER}.password" in out
    for sid in KEYS:
        line = re.search(rf'sentinel {sid}, in its config.json:\n  "mqtt": (.*)', out)
        assert line, out
        assert json.loads(line.group(1)) == {
            "host": "192.168.1.10",
            "port": 1883,
            "user": sid,
            "password": w.passwords[sid],
        }
    # Hashed by mosquitto_passwd, never the password itself.
    passwd = w.passwd.read_text()
    assert all(p not in passwd for p in w.passwords.values()) and passwd.count("$7$") == 3


def test_a_sentinel_speaks_only_for_itself_through_the_generated_broker(
    tmp_path: Path, site_dir: Path, rig_factory
) -> None:
    w, _out = _generate(tmp_path, site_dir)
    rig = rig_factory(
        broker_auth=bc.auth(w.dir),
        firmware={"mqtt": {"user": "demo", "password": w.passwords["demo"]}},
        bridge_mqtt={"username": bc.BRIDGE_USER, "password_file": str(w.dir / f"{bc.BRIDGE_USER}.password")},
    )
    # The real firmware and the bridge both log in and the firmware's own topics pass the ACL.
    rig.wait("boot", 20)
    rig.control.send(mains=False)
    rig.wait("mains_lost", 10)
    port = rig.broker.port

    spy = Mqtt5(port, bc.BRIDGE_USER, w.passwords[bc.BRIDGE_USER])
    spy.c.subscribe("holdover/#", qos=1)
    demo = Mqtt5(port, "demo", w.passwords["demo"])
    assert not demo.connack.is_failure
    forged = protocol.topic("rack2", protocol.EVENT)
    assert demo.ack(demo.c.publish(forged, b"{}", qos=1).mid).value == 0x87  # Not authorized
    assert demo.ack(demo.c.publish(protocol.topic("demo", protocol.CMD), b"{}", qos=1).mid).value == 0x87
    ok = demo.c.publish(protocol.topic("demo", protocol.STATE), b"{}", qos=1)
    assert demo.ack(ok.mid).value == 0
    wait_for(lambda: protocol.topic("demo", protocol.STATE) in spy.got, 5, "its own topic to pass")
    assert forged not in spy.got
    # Mosquitto grants any subscription and filters at delivery: another's commands never arrive.
    demo.ack(demo.c.subscribe("holdover/+/cmd", qos=1)[1])
    for sid in ("rack2", "demo"):
        spy.ack(spy.c.publish(protocol.topic(sid, protocol.CMD), b"{}", qos=1).mid)
    wait_for(lambda: protocol.topic("demo", protocol.CMD) in demo.got, 5, "its own command")
    assert protocol.topic("rack2", protocol.CMD) not in demo.got
    for user, password in ((None, None), ("demo", "wrong"), ("rack2", w.passwords["demo"])):
        c = Mqtt5(port, user, password)
        assert c.connack.is_failure, (user, c.connack)
        c.close()
    demo.close()
    spy.close()

    # A command-line client with the wrong password is told the broker refused it, by name, at
    # once; not "no state on the broker" (which blamed the sentinel).
    bad = tmp_path / "wrong.toml"
    cfg = tomllib.loads((rig.dir / "holdover.toml").read_text())
    cfg["mqtt"] = {"host": rig.broker.host, "port": port, "username": bc.BRIDGE_USER, "password": "wrong"}
    bad.write_text(tomli_w.dumps(cfg))
    for argv in (["relay", "demo", "on"], ["ha-remove", "demo"]):
        r = subprocess.run([HOLDOVER, *argv, "-c", str(bad)], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
        assert f"{rig.broker.host}:{port}" in r.stderr and "refused: Not authorized" in r.stderr, r.stderr


def test_a_rerun_keeps_every_password_and_rotates_only_on_purpose(tmp_path: Path) -> None:
    cfg = tmp_path / "h.toml"
    out = tmp_path / "mosquitto"

    def run(sids: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
        cfg.write_text("".join(f'[[sentinels]]\nid = "{s}"\nkey = "{k}"\n' for s, k in sids.items()))
        argv = [HOLDOVER, "broker-config", "-c", str(cfg), "--out", str(out), *extra]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60)

    def pw(user: str) -> str:
        return (out / f"{user}.password").read_text().strip()

    first = dict(list(KEYS.items())[:1])
    assert run(first).returncode == 0
    before = {u: pw(u) for u in (bc.BRIDGE_USER, *first)}
    # A second sentinel added later: the deployed board's password and the bridge's stay as they were.
    r = run(KEYS)
    assert r.returncode == 0, r.stderr
    assert {u: pw(u) for u in before} == before
    added = [s for s in KEYS if s not in first]
    assert f"new passwords for {', '.join(added)}" in r.stdout and "ROTATED" not in r.stdout
    # On purpose, one client: only its password changes, and the output says what must follow it.
    sid = next(iter(first))
    r = run(KEYS, "--rotate", sid)
    assert r.returncode == 0, r.stderr
    assert pw(sid) != before[sid] and pw(bc.BRIDGE_USER) == before[bc.BRIDGE_USER]
    assert f"ROTATED {sid}" in r.stdout and f"board config.json of {sid}" in r.stdout
    assert all(f'"password": "{pw(s)}"' in r.stdout for s in KEYS)  # the lines to paste, current
    r = run(KEYS, "--rotate", "nobody")
    assert r.returncode == 1 and "--rotate nobody: no such client" in r.stderr and "Traceback" not in r.stderr


def test_a_node_speaks_only_for_itself_and_presses_no_button(tmp_path: Path, site_dir: Path, caplog) -> None:
    """Every node's bridge its own login: one node's credentials cannot publish another node's state
    (what the Slurm controller acts on), press any node's checkpoint button or a sentinel's relay,
    or command a sentinel; the sentinels' bridge cannot speak for another node either."""
    cfg = tmp_path / "h.toml"
    cfg.write_text(
        '[failover]\nnode = "head"\n' + "".join(f'[[sentinels]]\nid = "{s}"\nkey = "{k}"\n' for s, k in KEYS.items())
    )
    out = site_dir / "mosquitto"
    r = subprocess.run(
        [HOLDOVER, "broker-config", "-c", str(cfg), "--out", str(out), "--ha", "--node", "gpu1", "--node", "gpu2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "node gpu1: copy" in r.stdout and 'username = "holdover-node-gpu1"' in r.stdout
    pw = {
        u: (out / f"{u}.password").read_text().strip()
        for u in ("holdover-bridge", "homeassistant", "holdover-node-gpu1")
    }
    with Broker(auth=bc.auth(out)) as broker:
        spy = Mqtt5(broker.port, bc.BRIDGE_USER, pw[bc.BRIDGE_USER])
        spy.ack(spy.c.subscribe("holdover/#", qos=1)[1])
        gpu1 = Mqtt5(broker.port, "holdover-node-gpu1", pw["holdover-node-gpu1"])
        head = Mqtt5(broker.port, bc.BRIDGE_USER, pw[bc.BRIDGE_USER])
        ha = Mqtt5(broker.port, bc.HA_USER, pw[bc.HA_USER])

        def answer(c: Mqtt5, topic: str, retain: bool = False) -> int:
            return c.ack(c.c.publish(topic, b'{"forged": true}', qos=1, retain=retain).mid).value

        node = protocol.node_topic
        refused = [
            (gpu1, node("gpu2", protocol.STATE)),  # "gpu2's job is saved": what would requeue it
            (gpu1, node("gpu2", protocol.STATUS)),
            (gpu1, node("gpu2", protocol.NODE_CHECKPOINT)),
            (gpu1, node("gpu1", protocol.NODE_CHECKPOINT)),  # even its own: the press says "home assistant"
            (gpu1, protocol.topic("demo", protocol.RELAY_SET)),
            (gpu1, protocol.topic("demo", protocol.CMD)),
            (head, node("gpu1", protocol.STATE)),
            (head, node("gpu1", protocol.NODE_CHECKPOINT)),
            (ha, node("gpu1", protocol.STATE)),
        ]
        for c, topic in refused:
            assert answer(c, topic, retain=True) == 0x87, topic  # Not authorized
        allowed = [
            (gpu1, node("gpu1", protocol.STATE)),
            (gpu1, node("gpu1", protocol.UPLINK)),
            (head, node("head", protocol.STATE)),
            (head, protocol.topic("demo", protocol.CMD)),
            (ha, node("gpu1", protocol.NODE_CHECKPOINT)),
            (ha, protocol.topic("demo", protocol.RELAY_SET)),
        ]
        for c, topic in allowed:
            assert answer(c, topic) == 0, topic
        wait_for(lambda: all(t in spy.got for _c, t in allowed), 5, "every allowed publish delivered")
        assert sorted(spy.got) == sorted(t for _c, t in allowed)  # and nothing refused, as it was sent
        late = Mqtt5(broker.port, bc.BRIDGE_USER, pw[bc.BRIDGE_USER])  # a controller starting now
        late.ack(late.c.subscribe("holdover/#", qos=1)[1])
        time.sleep(0.5)
        assert late.got == [], "a refused retained message was kept"
        for c in (spy, gpu1, head, ha, late):
            c.close()

        # A node's bridge set up under the wrong name publishes nothing; its log says why.
        settings = Settings.model_validate(
            {
                "mqtt": {"port": broker.port, "username": "holdover-node-gpu1", "password": pw["holdover-node-gpu1"]},
                "failover": {"node": "gpu9"},
                "journal": {"path": str(tmp_path / "j.db")},
                "web": {"enabled": False},
            }
        )
        with caplog.at_level(logging.ERROR, logger="holdover.mqtt"):
            bt = BridgeThread(Bridge(settings)).start()
            try:
                wait_for(
                    lambda: "refused holdover/node/gpu9/state from holdover-node-gpu1" in caplog.text, 10, "the refusal"
                )
            finally:
                bt.stop()
        assert "is [failover] node the name `holdover broker-config --node` made this login for?" in caplog.text


def test_the_labs_broker_never_answers_for_a_port_another_process_took(tmp_path: Path, monkeypatch) -> None:
    """free_port() lets its port go before mosquitto binds it; under a parallel run another process
    may bind it first. A connect alone then met that process, and a rig's bridge and sentinel talked
    to it and heard nothing ("no 'boot' within 30s; saw []", once at the end of a fresh clone's run)."""
    from holdover.lab import broker as lab_broker

    squatter = socket.create_server(("127.0.0.1", 0))
    taken = squatter.getsockname()[1]
    with squatter:
        ports = iter([taken])  # free_port() hands out the port the squatter then bound
        real = lab_broker.free_port
        monkeypatch.setattr(lab_broker, "free_port", lambda host="127.0.0.1": next(ports, None) or real(host))
        with Broker(workdir=tmp_path / "chosen") as b:
            assert b.port != taken and f"listener {b.port} " in b.conf.read_text()
            client = Mqtt5(b.port, None, None)  # a real MQTT broker answers there: ours
            assert client.connack is not None and client.connack.value == 0, client.connack
            client.close()
        # A port the user gave is never moved: its clients were told it.
        with pytest.raises(BrokerError, match="in use"):
            Broker(port=taken, workdir=tmp_path / "given").start()
