"""The HiLink 4G dongle through the real huawei-lte-api client, against a fake stick on loopback
(holdover.lab.hilink) that speaks the part of its web API holdover uses; a stick that hangs and
one that answers errors never stall the caller."""

from __future__ import annotations

import asyncio
import time

import pytest

from holdover.lab.hilink import HiLink
from holdover.lab.netlab import BACKUP, PRIMARY, TARGET, NetLab
from holdover.lab.targets import TcpTarget
from holdover.node.dongle import Dongle, DongleError, dial, shorten
from holdover.node.failover import Failover
from holdover.settings import DongleSettings, FailoverSettings
from support import wait_for

PORT = 8443


def _dongle(stick: HiLink, **kw) -> Dongle:
    return Dongle(DongleSettings(enabled=True, url=stick.url, **{"timeout": 1.0, **kw}))


def test_state_signal_operator_and_data_used_come_from_the_stick() -> None:
    with HiLink() as stick:
        st = _dongle(stick).status()
        assert st.connected and st.connection == "connected" and st.network == "LTE"
        assert (st.operator, st.rssi, st.rsrp, st.sinr) == ("Test Telecom", "-67dBm", "-95dBm", "12dB")
        assert st.month_bytes == 4_000_000
        stick.connection = "902"
        assert _dongle(stick).status().connection == "disconnected"


def test_connect_flips_mobile_data_on_and_an_sms_is_sent_shortened() -> None:
    with HiLink() as stick:
        stick.dataswitch, stick.connection = 0, "902"
        d = _dongle(stick)
        d.connect()
        assert stick.dataswitch == 1 and d.status().connected
        long = "Mains power lost at rack1\n" + "holdover is saving 3 runs; battery runtime 9 min. " * 5
        d.send_sms(["+4915100000001", "+4915100000002"], long)
        [sms] = stick.sms
        assert sms["phones"] == ["+4915100000001", "+4915100000002"]
        assert sms["content"] == shorten(long) and len(sms["content"]) == 160 and sms["content"].endswith("…")
        assert sms["content"].startswith("Mains power lost at rack1 holdover is saving")


def test_a_stick_that_hangs_costs_the_caller_its_timeout_not_the_loop() -> None:
    with HiLink() as stick:
        stick.hang = True
        d = _dongle(stick, timeout=0.5)

        async def run() -> tuple[float, int]:
            ticks = 0

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.05)
                    ticks += 1

            t = asyncio.create_task(ticker())
            t0 = time.monotonic()
            with pytest.raises(DongleError, match="status: no answer"):
                await d.astatus()
            t.cancel()
            return time.monotonic() - t0, ticks

        took, ticks = asyncio.run(run())
        assert took < 2.5 and ticks >= 8  # the loop kept running while the stick said nothing


def test_a_stick_that_answers_errors_is_named_with_its_code() -> None:
    with HiLink() as stick:
        stick.error_code = 100003
        with pytest.raises(DongleError, match=rf"dongle at {stick.url}: status: .*100003"):
            _dongle(stick).status()
    with pytest.raises(DongleError, match="connection refused"):
        _dongle(stick).status()  # closed now: nothing listens


def test_alerts_go_out_as_sms_through_the_dongle_only_while_no_uplink_is_left(rig_factory, ntfy) -> None:
    a, b = TcpTarget(), TcpTarget()
    with HiLink() as stick:
        rig = rig_factory(
            firmware={"uplink": {"targets": [{"kind": "tcp", "host": "127.0.0.1", "port": t.port} for t in (a, b)]}},
            bridge_extra={
                "dongle": {"enabled": True, "url": stick.url, "timeout": 1.0},
                "alerts": {
                    "channels": [
                        {"name": "phone", "url": ntfy.url("phone"), "min_severity": "info"},
                        {"name": "sms", "url": "dongle-sms://+4915100000001", "when": "wan_down"},
                    ]
                },
            },
        )
        rig.wait("boot", 15)
        rig.control.send(mains=False)
        rig.wait("mains_lost", 10)
        wait_for(lambda: any("Mains power lost" in m.get("title", "") for m in ntfy.on("phone")), 10, "the app alert")
        assert stick.sms == []  # the internet is up: no SMS
        for t in (a, b):
            t.stop()  # the site's uplink dies
        rig.wait("uplink_lost", 10)
        wait_for(lambda: stick.sms, 15, "an SMS through the dongle")
        [sms] = stick.sms
        assert sms["phones"] == ["+4915100000001"] and sms["content"].startswith("Internet uplink lost at demo")
        assert len(sms["content"]) <= 160
        for t in (a, b):
            t.start()
        rig.wait("uplink_restored", 10)
        # The recovery reaches whoever heard of the problem: the SMS channel too.
        wait_for(lambda: len(stick.sms) == 2, 15, "the recovery by SMS")
        assert stick.sms[1]["content"].startswith("Internet uplink back at demo")


def test_the_dongle_is_dialled_before_traffic_is_switched_to_it(tmp_path) -> None:
    with NetLab() as lab, HiLink() as stick:
        lab.serve(PORT)
        lab.silence(BACKUP)  # not dialled: nothing answers through the stick
        stick.dataswitch, stick.connection = 0, "902"
        dialled: list[float] = []
        stick.on_dataswitch = lambda on: (dialled.append(time.monotonic()), lab.silence(BACKUP, not on))
        settings = FailoverSettings.model_validate(
            {
                "netns": lab.node_name,
                "targets": [f"{TARGET}:{PORT}"],
                "uplinks": [{"name": u["name"], "dev": u["dev"], "gateway": u["gateway"]} for u in (PRIMARY, BACKUP)],
                "dwell": 0.0,
            }
        )
        events: list[tuple[str, float]] = []

        async def run() -> None:
            fo = Failover(
                settings,
                lab.node,
                lambda k, d: events.append((k, time.monotonic())),
                prepare=dial(_dongle(stick), "usb"),
            )
            fo.start()
            try:
                await asyncio.to_thread(lab.silence, PRIMARY)
                deadline = time.monotonic() + 15
                while not events and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
            finally:
                await fo.close()

        asyncio.run(run())
        assert stick.dataswitch == 1 and len(dialled) == 1
        assert [k for k, _ in events] == ["failover"] and dialled[0] < events[0][1]
