"""Alerts through real apprise to an ntfy-style HTTP receiver on loopback, and on MQTT."""

from __future__ import annotations

import asyncio
import subprocess
import time
from types import SimpleNamespace
from typing import Any

import pytest

from holdover.bridge.alert_outbox import AlertOutbox
from holdover.bridge.alerts import Alerts
from holdover.bridge.service import NODE, Bridge, BridgeThread
from holdover.firmware import protocol
from holdover.journal import Journal
from holdover.lab.broker import Broker, free_port
from holdover.settings import AlertSettings, ConfigError, Settings, load
from support import HOLDOVER, Listener, Ntfy, until, wait_for


def _settings(ntfy: Ntfy, **kw: Any) -> AlertSettings:
    channels = kw.pop("channels", [{"name": "phone", "url": ntfy.url("phone"), "min_severity": "info"}])
    return AlertSettings.model_validate({"channels": channels, **kw})


def _event(j: Journal, kind: str, sid: str = "ups1", **data: Any):
    (seq,) = j.db.execute("SELECT COUNT(*) + 1 FROM events").fetchone()
    body = {"sid": sid, "boot": "b1", "seq": seq, "kind": kind, "ms": seq, "ts": int(time.time()), "data": data}
    return j.accept("mqtt", body)


def _run(alerts: Alerts, scenario) -> None:
    async def main() -> None:
        alerts.start()
        try:
            await scenario()
        finally:
            await alerts.close()

    asyncio.run(main())


def test_severity_routes_each_alert_and_a_recovery_closes_its_problem_everywhere(tmp_path, ntfy) -> None:
    channels = [
        {"name": "team", "url": ntfy.url("team"), "min_severity": "info"},
        {"name": "oncall", "url": ntfy.url("oncall"), "min_severity": "critical"},
    ]
    with Journal(tmp_path / "j.db") as j:
        alerts = Alerts(_settings(ntfy, channels=channels), j)

        async def scenario() -> None:
            alerts.on_event(_event(j, protocol.MAINS_LOST, runtime_s=1500, on_battery=True))
            alerts.on_event(_event(j, protocol.UPLINK_LOST))
            await until(lambda: len(ntfy.got) == 3, 10, "three messages")
            alerts.on_event(_event(j, protocol.MAINS_RESTORED))
            await until(lambda: len(ntfy.got) == 5, 10, "the recovery on both")
            # The receiver has a message before the sender hears its 200 and marks it sent.
            await until(lambda: all(a["sent"] for a in AlertOutbox(j).alerts()), 10, "all five marked sent")

        _run(alerts, scenario)
        assert len(AlertOutbox(j).alerts()) == 5
    assert [m["title"] for m in ntfy.on("oncall")] == ["Mains power lost at ups1", "Mains power back at ups1"]
    team = ntfy.on("team")
    assert [m["title"] for m in team] == [
        "Mains power lost at ups1",
        "Internet uplink lost at ups1",
        "Mains power back at ups1",
    ]
    lost = team[0]["message"]
    assert lost.startswith("CRITICAL · ups1 · ")
    assert "emergency checkpoint" in lost and "sentinel battery: about 25 min 0 s left" in lost
    assert "closes: Mains power lost at ups1 (after " in team[2]["message"]


class _Clock:
    def __init__(self) -> None:
        self.t = time.time()

    def __call__(self) -> float:
        return self.t


def test_two_cuts_four_minutes_apart_are_two_cuts_on_the_defaults(tmp_path, ntfy) -> None:
    clock = _Clock()
    with Journal(tmp_path / "j.db") as j:
        alerts = Alerts(_settings(ntfy), j, clock=clock)

        async def scenario() -> None:
            for _ in range(2):
                alerts.on_event(_event(j, protocol.MAINS_LOST))
                clock.t += 19  # past the grace: a real cut
                alerts.on_event(_event(j, protocol.MAINS_RESTORED))
                clock.t += 221
            await until(lambda: len(ntfy.got) == 4, 10, "both cuts, each way")
            await asyncio.sleep(1.5)  # the summary task looks once a second: nothing more to say

        _run(alerts, scenario)
    titles = [m["title"] for m in ntfy.got]
    assert titles == ["Mains power lost at ups1", "Mains power back at ups1"] * 2
    assert all(m["message"].startswith("CRITICAL · ") for m in ntfy.got[::2])  # both cuts at critical


def test_twelve_changes_in_a_minute_are_the_first_cut_then_one_summary_at_the_end_state(tmp_path, ntfy) -> None:
    clock = _Clock()
    channels = [
        {"name": "team", "url": ntfy.url("team"), "min_severity": "info"},
        {"name": "oncall", "url": ntfy.url("oncall"), "min_severity": "critical"},
    ]
    with Journal(tmp_path / "j.db") as j:
        alerts = Alerts(_settings(ntfy, channels=channels), j, clock=clock)

        async def scenario() -> None:
            for i in range(12):
                alerts.on_event(_event(j, protocol.MAINS_RESTORED if i % 2 else protocol.MAINS_LOST))
                clock.t += 4
            alerts.on_event(_event(j, protocol.MAINS_LOST))  # the 13th change: it ends with the power out
            alerts.on_event(_event(j, protocol.BATTERY_LOW, sid="ups2", runtime_s=300))
            alerts.on_event(_event(j, protocol.BATTERY_LOW, sid="ups2", runtime_s=280))  # the same again
            await until(lambda: len(ntfy.got) == 5, 10, "the first cut each way on both, the battery")
            await asyncio.sleep(1.5)
            assert len(ntfy.got) == 5  # a storm: held
            clock.t += 61  # quiet for a window: it is over
            await until(lambda: any(" flapped " in m["title"] for m in ntfy.got), 10, "the summary")
            alerts.on_event(_event(j, protocol.MAINS_RESTORED))  # after the storm: news again
            await until(lambda: len(ntfy.on("oncall")) == 4, 10, "the recovery to oncall")

        _run(alerts, scenario)
    titles = [m["title"] for m in ntfy.on("team")]
    assert titles[:2] == ["Mains power lost at ups1", "Mains power back at ups1"]
    assert titles.count("Sentinel ups2's own battery low: 300 s left") == 1 and not any("280" in t for t in titles)
    summary = [m for m in ntfy.got if " flapped " in m["title"]]
    assert len(summary) == 2  # once per channel: it ended on a critical state
    assert summary[0]["title"] == "Mains lost at ups1 flapped 11 times in 40 s"
    assert summary[0]["message"].startswith("CRITICAL · ups1 · over:")
    assert summary[0]["message"].endswith("now: Mains power lost at ups1")
    assert [m["title"] for m in ntfy.on("oncall") if "ups1" in m["title"]] == [
        "Mains power lost at ups1",
        "Mains power back at ups1",
        "Mains lost at ups1 flapped 11 times in 40 s",
        "Mains power back at ups1",
    ]
    # The storm's summary opened the problem: the recovery closes it, on the channels it went to.
    assert "closes: Mains power lost at ups1 (after 0 s)" in ntfy.on("oncall")[-1]["message"]


def test_a_storm_that_goes_on_is_summarised_every_flap_summary_s(tmp_path, ntfy) -> None:
    clock = _Clock()
    with Journal(tmp_path / "j.db") as j:
        alerts = Alerts(_settings(ntfy, flap_summary_s=120), j, clock=clock)

        async def scenario() -> None:
            for i in range(40):  # one change every 5 s for 200 s
                alerts.on_event(_event(j, protocol.MAINS_RESTORED if i % 2 else protocol.MAINS_LOST))
                clock.t += 5
                if i == 30:  # the summary is due (at +130 s): the task sees it on its next look
                    await until(lambda: any("is flapping" in m["title"] for m in ntfy.got), 10, "the summary")

        _run(alerts, scenario)
    titles = [m["title"] for m in ntfy.got]
    assert titles[:2] == ["Mains power lost at ups1", "Mains power back at ups1"]
    assert titles[2] == "Mains lost at ups1 is flapping: 29 changes in 2 min 25 s"
    assert len(titles) == 3 and ntfy.got[2]["message"].startswith("WARNING · ")


def test_a_channel_over_its_rate_gets_one_merged_message_and_nothing_is_lost(tmp_path, ntfy) -> None:
    channels = [{"name": "phone", "url": ntfy.url("phone"), "min_severity": "warning", "per_hour": 2}]
    with Journal(tmp_path / "j.db") as j:
        alerts = Alerts(_settings(ntfy, channels=channels), j)

        async def scenario() -> None:
            alerts.on_event(_event(j, protocol.UPLINK_LOST, sid="s0"))
            await until(lambda: len(ntfy.got) == 1, 10, "the first")
            for i in range(1, 6):
                alerts.on_event(_event(j, protocol.UPLINK_LOST, sid=f"s{i}"))
            await until(lambda: len(ntfy.got) == 2, 10, "the merged one")
            await asyncio.sleep(1.5)  # and nothing more: the hour's two messages are spent
            alerts.on_event(_event(j, protocol.UPLINK_LOST, sid="s6"))
            await asyncio.sleep(1.5)

        _run(alerts, scenario)
        rows = AlertOutbox(j).alerts()
    assert len(ntfy.got) == 2
    merged = ntfy.got[1]
    assert merged["title"] == "5 holdover alerts (rate limit: merged)"
    assert all(f"Internet uplink lost at s{i}" in merged["message"] for i in range(1, 6))
    held = [r for r in rows if r["sent"] is None]
    assert [r["sid"] for r in held] == ["s6"] and held[0]["error"] == "rate limit: held"


def test_an_alert_the_receiver_missed_is_kept_and_sent_once_after_a_bridge_restart(tmp_path) -> None:
    down = Ntfy()  # not started: connection refused
    with Journal(tmp_path / "j.db") as j:
        alerts = Alerts(_settings(down), j)

        async def first() -> None:
            alerts.on_event(_event(j, protocol.MAINS_LOST))
            await until(lambda: AlertOutbox(j).alerts()[0]["attempts"] == 1, 10, "a failed try")

        _run(alerts, first)
        [row] = AlertOutbox(j).alerts()
        assert row["sent"] is None and "Connection error" in row["error"]
    up = Ntfy(down.port).start()
    try:
        for _restart in range(2):  # the restarted bridge delivers it; the one after sends nothing
            with Journal(tmp_path / "j.db") as j:
                again = Alerts(_settings(up), j)
                j.db.execute("UPDATE alert_outbox SET next_try = 0")  # due now, not after its backoff

                async def resume(again=again) -> None:
                    await asyncio.sleep(1.5)

                _run(again, resume)
        assert [m["title"] for m in up.got] == ["Mains power lost at ups1"]
    finally:
        up.stop()


def test_the_bridge_alerts_on_its_own_events_and_mqtt_subscribers_read_them(tmp_path, ntfy) -> None:
    with Broker(workdir=tmp_path / "broker") as broker:
        s = Settings.model_validate(
            {
                "mqtt": {"port": broker.port},
                "journal": {"path": str(tmp_path / "j.db")},
                "alerts": {"channels": [{"name": "phone", "url": ntfy.url("phone")}]},
            }
        )
        phone_app = Listener(SimpleNamespace(broker=broker), [protocol.ALERTS])
        b = BridgeThread(Bridge(s)).start()
        try:
            assert phone_app.subscribed.wait(5)
            wait_for(lambda: b.bridge.link and b.bridge.link.connected.is_set(), 5, "the bridge on the broker")
            data = {"uplink": "usb", "why": "wan down"}
            b.loop.call_soon_threadsafe(b.bridge.node_event, "failover", data)
            _t, text, retained = phone_app.next(5)
            wait_for(lambda: ntfy.got, 10, "the alert on the phone")
        finally:
            phone_app.close()
            b.stop()
    assert not retained
    assert text.decode().splitlines()[0] == "Traffic moved to the backup uplink usb"
    assert "holdover: wan down" in text.decode() and f"WARNING · {NODE}" in text.decode()
    assert [m["title"] for m in ntfy.got] == ["Traffic moved to the backup uplink usb"]


def test_test_alert_reports_each_channel_and_a_bad_url_is_refused_by_name(tmp_path, ntfy) -> None:
    cfg = tmp_path / "h.toml"
    dead = f"ntfy://127.0.0.1:{free_port()}/x"
    cfg.write_text(
        f'[[alerts.channels]]\nname = "phone"\nurl = "{ntfy.url("phone")}"\n'
        f'[[alerts.channels]]\nname = "dead"\nurl = "{dead}"\n'
    )
    r = subprocess.run([HOLDOVER, "test-alert", "-c", str(cfg)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "phone: sent"
    assert lines[1].startswith("dead: FAILED: ") and "Connection error" in lines[1]
    assert [m["title"] for m in ntfy.got] == ["holdover test alert"]
    cfg.write_text('[[alerts.channels]]\nname = "phone"\nurl = "nosuch://x"\n')
    with pytest.raises(ConfigError, match=r"alerts\.channels\.0\.url.*apprise cannot use this URL"):
        load(cfg)


def test_a_bridge_stopping_as_an_alert_is_raised_stops_at_once(tmp_path) -> None:
    # The alert nudges the sender in the same step as close() cancels it: asyncio.wait_for on
    # 3.11 swallowed that cancel and the bridge hung in close() (15 s per rig test).
    with Journal(tmp_path / "j.db") as j:
        alerts = Alerts(AlertSettings(), j)

        async def main() -> None:
            alerts.start()
            await asyncio.sleep(0.2)
            alerts.on_event(_event(j, protocol.MAINS_LOST))
            t0 = time.monotonic()
            await asyncio.wait_for(alerts.close(), 3)
            assert time.monotonic() - t0 < 1.0

        asyncio.run(main())


def test_bridges_of_one_site_alert_a_sentinel_once_each_its_own_node_and_the_next_takes_over(tmp_path, ntfy) -> None:
    """Two nodes' bridges on one broker: each journals the sentinel's event, the lowest-named
    online one alerts it; each alerts its own node's events; when it goes, the other alerts."""
    with Broker(workdir=tmp_path / "broker") as broker:

        def bridge(node: str) -> BridgeThread:
            s = Settings.model_validate(
                {
                    "mqtt": {"port": broker.port},
                    "journal": {"path": str(tmp_path / f"{node}.db")},
                    "failover": {"node": node},
                    "alerts": {"channels": [{"name": "phone", "url": ntfy.url(node)}]},
                }
            )
            return BridgeThread(Bridge(s)).start()

        a, b = bridge("gpu-a"), bridge("gpu-b")
        try:
            for x in (a, b):
                assert x.bridge.site is not None
                wait_for(lambda x=x: len([n for n, p in x.bridge.site.peers.items() if p.online and p.alerts]) == 1,
                         10, "each bridge hears the other")  # fmt: skip
            assert a.bridge.site.alerting() == b.bridge.site.alerting() == "gpu-a"

            def offline(x: BridgeThread, sid: str = "ups1") -> None:
                x.loop.call_soon_threadsafe(x.bridge._host_event, sid, "sentinel_offline", {})

            for x in (a, b):
                offline(x)
                x.loop.call_soon_threadsafe(x.bridge.node_event, "failover", {"uplink": "usb", "why": "wan down"})
            wait_for(lambda: len(ntfy.got) >= 3, 10, "three alerts")
            time.sleep(0.5)  # nothing more arrives
            titles = {t: sorted(m["title"] for m in ntfy.on(t)) for t in ("gpu-a", "gpu-b")}
            moved = "Traffic moved to the backup uplink usb"
            assert titles["gpu-b"] == [moved], titles  # its own node's, not the sentinel's
            assert len(titles["gpu-a"]) == 2 and moved in titles["gpu-a"], titles
            for x in (a, b):  # both journaled it
                with Journal(x.bridge.settings.journal.path, readonly=True) as j:
                    assert [e.sid for e in j.events(kinds=["sentinel_offline"])] == ["ups1"]

            a.stop()  # its last word on the broker: offline
            wait_for(lambda: b.bridge.site.alerting() == "gpu-b", 10, "gpu-b the alerting bridge")
            offline(b, "ups2")
            wait_for(lambda: len(ntfy.on("gpu-b")) == 2, 10, "gpu-b alerts the sentinel now")
        finally:
            a.stop()
            b.stop()


def test_an_alert_with_no_channel_says_whether_anyone_hears_it(tmp_path, caplog) -> None:
    # The log said "to no channel (MQTT only)" while the broker was unreachable: nobody heard it.
    caplog.set_level("INFO", logger="holdover.alerts")
    broker_up: list[bool] = []
    with Journal(tmp_path / "j.db") as j:
        for mqtt, up in ((True, True), (True, False), (False, True)):
            caplog.clear()
            broker_up[:] = [up]
            settings = AlertSettings.model_validate({"channels": [], "mqtt": mqtt})
            Alerts(settings, j, publish=lambda _text: broker_up[0]).on_event(_event(j, protocol.MAINS_LOST))
            [said] = [r.getMessage() for r in caplog.records]
            if mqtt and up:
                assert said == "alert 'Mains power lost at ups1' on MQTT holdover/alerts only (no channel for it)"
            elif mqtt:
                assert said.startswith("alert 'Mains power lost at ups1' reaches nobody yet: no channel for it, and ")
                assert "the broker is unreachable (queued for MQTT holdover/alerts until it is back)" in said
            else:
                assert said.endswith("reaches nobody: no channel for it and [alerts] mqtt is off"), said
