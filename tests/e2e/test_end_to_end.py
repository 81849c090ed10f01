"""End to end: emulated sentinel + real Mosquitto + the `holdover bridge` command, with real hook processes."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
from pathlib import Path

import paho.mqtt.client as paho
import pytest
import tomli_w
from paho.mqtt.enums import CallbackAPIVersion

from holdover.firmware import protocol
from holdover.journal import Journal
from holdover.lab.broker import free_port
from holdover.lab.rig import Rig
from support import wait_for

# Each hook appends one JSON line of what it was told, so the test sees every run.
RECORD = (
    f"{sys.executable} -c \"import json,os,sys; open(sys.argv[1],'a').write(json.dumps("
    "{k: os.environ[k] for k in ('HOLDOVER_EVENT','HOLDOVER_SENTINEL','HOLDOVER_PAYLOAD')})+'\\n')\" "
)


def _runs(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


class ReadJournal:
    """A read-only look at the bridge's journal, closed after each query."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _q(self, name: str, *a: object) -> list:
        if not self.path.exists():
            return []
        with Journal(self.path, readonly=True) as j:
            return getattr(j, name)(*a)

    def events(self) -> list:
        return self._q("events")

    def rejections(self) -> list:
        return self._q("rejections")

    def hook_runs(self) -> list:
        return self._q("hook_runs")


class BridgeProcess:
    def __init__(self, rig: Rig, hooks: list[dict]) -> None:
        cfg = rig.bridge_config()
        cfg["hooks"] = hooks
        # `holdover bridge` serves the dashboard; two of these tests at once must not share a port
        cfg["web"] = {"port": free_port()}
        self.config = rig.dir / "bridge.toml"
        self.config.write_text(tomli_w.dumps(cfg))
        self.log = rig.dir / "bridge.log"
        self.journal_path = Path(cfg["journal"]["path"])
        with self.log.open("w") as f:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "holdover.cli", "bridge", "--config", str(self.config)], stdout=f, stderr=f
            )
        wait_for(lambda: "connected to broker" in self.log.read_text(), 20, "the bridge to connect")

    def journal(self) -> ReadJournal:
        return ReadJournal(self.journal_path)

    def stop(self) -> int:
        self.proc.terminate()
        return self.proc.wait(15)


@pytest.fixture
def e2e(tmp_path: Path):
    rig = Rig(tmp_path / "rig", debounce_ms=300).start(bridge=False, emulator=False)
    hooks_file = tmp_path / "hooks.jsonl"
    hooks = [{"events": ["mains_lost", "mains_restored"], "run": RECORD + str(hooks_file), "timeout": 10.0}]
    bridge = BridgeProcess(rig, hooks)
    rig.start_emulator()
    yield rig, bridge, hooks_file
    rc = bridge.stop()
    rig.close()
    assert rc == 0, bridge.log.read_text()


def _publisher(rig: Rig) -> paho.Client:
    c = paho.Client(CallbackAPIVersion.VERSION2, client_id="attacker-" + secrets.token_hex(3))
    c.connect(rig.broker.host, rig.broker.port)
    c.loop_start()
    return c


def test_power_cut_and_restore_run_the_hooks_once_each(e2e) -> None:
    rig, bridge, hooks_file = e2e
    wait_for(lambda: any(e.kind == "boot" for e in bridge.journal().events()), 20, "the boot event")

    rig.control.send(mains=False)
    runs = wait_for(lambda: _runs(hooks_file), 10, "the mains_lost hook")
    assert [r["HOLDOVER_EVENT"] for r in runs] == ["mains_lost"]
    assert runs[0]["HOLDOVER_SENTINEL"] == rig.sid
    payload = json.loads(runs[0]["HOLDOVER_PAYLOAD"])
    assert payload["kind"] == "mains_lost" and payload["sid"] == rig.sid and payload["seq"] >= 1

    rig.control.send(mains=True)
    runs = wait_for(lambda: len(_runs(hooks_file)) >= 2 and _runs(hooks_file), 10, "the mains_restored hook")
    assert [r["HOLDOVER_EVENT"] for r in runs] == ["mains_lost", "mains_restored"]
    assert json.loads(runs[1]["HOLDOVER_PAYLOAD"])["data"]["outage_ms"] >= 300

    # A flicker shorter than the debounce is a suspicion and a dip, never a loss: it runs nothing.
    rig.control.send(mains=False)
    time.sleep(0.1)
    rig.control.send(mains=True)
    # The dip is raised once the flicker is over: by then a loss, had there been one, was raised first.
    wait_for(lambda: any(e.kind == "mains_dip" for e in bridge.journal().events()), 10, "the dip journaled")
    time.sleep(0.3)  # a hook started for it would have run by now (they run within milliseconds)
    assert len(_runs(hooks_file)) == 2
    j = bridge.journal()
    mains = [e.kind for e in reversed(j.events()) if e.kind.startswith("mains")]
    kept = [k for k in mains if k != "mains_suspect"]
    assert kept[:3] == ["mains_lost", "mains_restored", "mains_dip"] and "mains_lost" not in kept[3:], mains
    assert mains[0] == "mains_suspect" and mains.count("mains_suspect") >= 2, mains
    assert [r["outcome"] for r in j.hook_runs()] == ["ok", "ok"]
    # Genuine traffic alone: no QoS 1 retransmit ever reached the bridge as a duplicate.
    assert j.rejections() == []
    assert rig.board_state()["glitches"] >= 1


def _cut_and_capture(rig: Rig, hooks_file: Path) -> tuple[paho.Client, bytes]:
    """Cut mains with an eavesdropper on the event topic; returns it and the genuine mains_lost bytes."""
    captured: list[bytes] = []
    spy = _publisher(rig)
    spy.on_message = lambda _c, _u, m: captured.append(bytes(m.payload))
    spy.subscribe(protocol.topic(rig.sid, protocol.EVENT), qos=1)
    time.sleep(0.5)
    rig.control.send(mains=False)
    wait_for(lambda: _runs(hooks_file), 10, "the genuine mains_lost hook")
    genuine = wait_for(lambda: [p for p in captured if b"mains_lost" in p], 5, "the captured event")[0]
    return spy, genuine


def _receipts(rig: Rig, spy_cmds: list[bytes]) -> list[tuple[str, int]]:
    """The (boot, seq) pairs the bridge has receipted on the sentinel's cmd topic, verified."""
    out = []
    for p in spy_cmds:
        body = protocol.open_envelope(p, protocol.Signer(rig.key), rig.sid)
        if body["kind"] == protocol.EVACK_KIND:
            out += [tuple(e) for e in body["data"]["events"]]
    return out


def test_a_cut_survives_the_bridge_killed_and_the_broker_forgetting_everything(e2e, tmp_path: Path) -> None:
    """kill -9 of the bridge and a broker restarted without persistence at once: the sentinel's
    outbox sends the event again until the new bridge receipts it; delivered once, hook once."""
    rig, bridge, hooks_file = e2e
    wait_for(lambda: any(e.kind == "boot" for e in bridge.journal().events()), 20, "the boot event")
    bridge.proc.kill()  # -9: no goodbye, its session stays on the broker
    bridge.proc.wait(5)
    rig.control.send(mains=False)
    time.sleep(1.0)  # raised, published, PUBACKed by the broker, queued for the dead bridge's session
    rig.broker.stop(forget=True)  # and the broker forgets it: no persistence (Mosquitto's default)
    rig.broker.start()
    again = BridgeProcess(rig, [{"events": ["*"], "run": RECORD + str(hooks_file)}])
    bridge.proc = again.proc  # the fixture stops whichever bridge is running
    runs = wait_for(lambda: _runs(hooks_file), 30, "the mains_lost hook after the outbox sent it again")
    # Receipted: the outbox sends no copy after this; one sent just before is on loopback, not later.
    st = wait_for(lambda: (s := rig.board_state())["outbox_bytes"] == 0 and s, 15, "the outbox emptied")
    assert st["outbox_resent"] >= 1  # it took a resend: PUBACK alone would have lost it
    time.sleep(0.5)
    assert [r["HOLDOVER_EVENT"] for r in _runs(hooks_file)] == ["mains_lost"], runs
    assert [e.kind for e in again.journal().events() if e.kind == "mains_lost"] == ["mains_lost"]


def test_a_signed_event_published_retained_is_refused_live(e2e) -> None:
    rig, bridge, hooks_file = e2e
    wait_for(lambda: any(e.kind == "boot" for e in bridge.journal().events()), 20, "the boot event")
    spy = _publisher(rig)
    topic = protocol.topic(rig.sid, protocol.EVENT)
    # Genuinely signed (the test holds the key), but retained: it would replay on every subscribe.
    ev = protocol.encode(protocol.Signer(rig.key), rig.sid, "feedf00d", 1, 5, None, "mains_lost", {})
    spy.publish(topic, ev, qos=1, retain=True).wait_for_publish(5)
    try:
        # MQTT 5's retain-as-published lets the bridge see the flag on live delivery, too.
        wait_for(lambda: any(r["reason"] == "retained_event" for r in bridge.journal().rejections()), 10, "refusal")
        ok = protocol.encode(protocol.Signer(rig.key), rig.sid, "feedf00d", 2, 6, None, "mains_restored", {})
        spy.publish(topic, ok, qos=1).wait_for_publish(5)  # the same, not retained: accepted
        wait_for(lambda: _runs(hooks_file), 10, "the hook for the event sent without the flag")
        assert [r["HOLDOVER_EVENT"] for r in _runs(hooks_file)] == ["mains_restored"]
    finally:
        spy.publish(topic, b"", qos=1, retain=True).wait_for_publish(5)  # clear the retained copy
        spy.loop_stop()
        spy.disconnect()


def test_forged_and_replayed_events_are_rejected_and_journaled(e2e) -> None:
    rig, bridge, hooks_file = e2e
    spy, genuine = _cut_and_capture(rig, hooks_file)

    topic = protocol.topic(rig.sid, protocol.EVENT)
    wrong_key = protocol.Signer(secrets.token_bytes(20))
    spy.publish(topic, protocol.encode(wrong_key, rig.sid, "abcdef01", 1, 5, None, "mains_restored", {}), qos=1)
    cmds: list[bytes] = []
    spy.message_callback_add(protocol.topic(rig.sid, protocol.CMD), lambda _c, _u, m: cmds.append(bytes(m.payload)))
    spy.subscribe(protocol.topic(rig.sid, protocol.CMD), qos=1)
    time.sleep(0.3)
    spy.publish(topic, genuine, qos=1)  # the same bytes again: a replay
    spy.publish(topic, b"\x00\xffgarbage", qos=1)
    spy.publish(topic, json.dumps({"kind": "mains_restored", "sid": rig.sid}).encode(), qos=1)
    spy.publish(protocol.topic("stranger", protocol.EVENT), genuine, qos=1)
    spy.publish(protocol.topic(rig.sid, protocol.STATUS), b"pwned", qos=1)
    want = {"bad_signature", "malformed", "unsigned", "unknown_sentinel"}
    wait_for(lambda: want <= {r["reason"] for r in bridge.journal().rejections()}, 10, f"rejections {want}")
    # A replay is the same event again, as the sentinel's own resends are: receipted again (so a
    # sentinel whose receipt was lost lets it go), journaled once, never run twice.
    body = json.loads(protocol.unframe(genuine)[1])
    ident = (body["boot"], body["seq"])
    wait_for(lambda: ident in _receipts(rig, cmds), 10, "the replay receipted again")
    # Nothing forged ran a hook; the bridge is still up and still accepts genuine events.
    time.sleep(0.5)
    assert [r["HOLDOVER_EVENT"] for r in _runs(hooks_file)] == ["mains_lost"]
    rig.control.send(mains=True)
    wait_for(lambda: len(_runs(hooks_file)) == 2, 10, "the genuine mains_restored hook")
    spy.loop_stop()
    spy.disconnect()


def test_a_replay_runs_nothing_after_the_bridge_restarts(e2e, tmp_path: Path) -> None:
    rig, bridge, hooks_file = e2e
    spy, genuine = _cut_and_capture(rig, hooks_file)
    assert bridge.stop() == 0
    again = BridgeProcess(rig, [{"events": ["*"], "run": RECORD + str(hooks_file)}])
    cmds: list[bytes] = []
    spy.message_callback_add(protocol.topic(rig.sid, protocol.CMD), lambda _c, _u, m: cmds.append(bytes(m.payload)))
    spy.subscribe(protocol.topic(rig.sid, protocol.CMD), qos=1)
    time.sleep(0.3)
    try:
        spy.publish(protocol.topic(rig.sid, protocol.EVENT), genuine, qos=1)
        body = json.loads(protocol.unframe(genuine)[1])
        wait_for(lambda: (body["boot"], body["seq"]) in _receipts(rig, cmds), 10, "the replay receipted")
        time.sleep(0.5)
        assert [r["HOLDOVER_EVENT"] for r in _runs(hooks_file)] == ["mains_lost"]
        assert [e.kind for e in again.journal().events() if e.kind == "mains_lost"] == ["mains_lost"]
    finally:
        bridge.proc = again.proc  # the fixture stops whichever bridge is running
        spy.loop_stop()
        spy.disconnect()


def test_a_hung_hook_is_killed_and_never_delays_the_next(tmp_path: Path) -> None:
    fast = tmp_path / "fast.jsonl"
    rig = Rig(tmp_path / "rig", debounce_ms=100).start(bridge=False, emulator=False)
    hooks = [
        {"events": ["mains_lost"], "run": "sleep 60", "timeout": 1.0},
        {"events": ["mains_lost"], "run": "exit 3"},
        {"events": ["mains_lost", "mains_restored"], "run": RECORD + str(fast)},
    ]
    bridge = BridgeProcess(rig, hooks)
    rig.start_emulator()
    try:
        rig.control.send(mains=False)
        t = time.monotonic()
        wait_for(lambda: _runs(fast), 10, "the fast hook")
        rig.control.send(mains=True)
        wait_for(lambda: len(_runs(fast)) == 2, 10, "the second fast hook")
        assert time.monotonic() - t < 5  # not held up behind the 60 s sleep
        runs = wait_for(lambda: len(bridge.journal().hook_runs()) == 4 and bridge.journal().hook_runs(), 10, "4 runs")
        outcomes = {r["hook"]: r["outcome"] for r in runs}
        assert outcomes["sleep 60"] == "timeout"
        assert outcomes["exit 3"] == "failed"
        slept = next(r for r in runs if r["hook"] == "sleep 60")
        assert 0.9 < slept["ended"] - slept["started"] < 5
    finally:
        assert bridge.stop() == 0
        rig.close()


def test_bridge_refuses_a_bad_config_listing_every_problem(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[mqtt]\nport = 99999\ncolour = "blue"\n'
        '[[sentinels]]\nid = "has space"\nkey = "short"\n'
        '[[hooks]]\nevents = ["mains_lsot"]\nrun = "true"\n'
    )
    proc = subprocess.run(
        [sys.executable, "-m", "holdover.cli", "bridge", "--config", str(bad)], capture_output=True, text=True
    )
    assert proc.returncode == 2
    for fragment in ("mqtt.port", "mqtt.colour", "sentinels.0.id", "sentinels.0", "hooks.0.events", "mains_lsot"):
        assert fragment in proc.stderr, (fragment, proc.stderr)
    garbled = tmp_path / "garbled.toml"
    garbled.write_text("[mqtt\nport=")
    proc = subprocess.run(
        [sys.executable, "-m", "holdover.cli", "bridge", "--config", str(garbled)], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "not valid TOML" in proc.stderr


def test_emu_refuses_a_bad_board_config_naming_the_key(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text('{"sentinel_id": "s", "key": "7f3a9c2e5b1d8e4f", "mqtt": {"host": "127.0.0.1"}, "mains": {}}')
    proc = subprocess.run(
        [sys.executable, "-m", "holdover.cli", "emu", "--config", str(cfg), "--state", str(tmp_path / "st")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "mains.pin: required" in proc.stdout + proc.stderr
