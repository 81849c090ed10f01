"""The host's UPS through NUT's own upsd and dummy-ups (Debian's nut-server): the rescue's clock.

A dummy-ups UPS stands in for the host's: OL -> OB with battery.runtime 480 starts the rescue with
a deadline of 480 - margin (not the sentinel's cell), a falling runtime pulls it in, LB runs the
final command, a sentinel's battery_critical does not; a cut both sources see runs one rescue; a
UPS that stays OL while a sentinel says mains lost is a disagreement; upsd gone, a UPS that does
not exist, a missing variable and a garbage answer are each named, and the bridge goes on.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from holdover import events
from holdover.bridge.service import Bridge, BridgeThread
from holdover.firmware import protocol
from holdover.journal import Event, Journal
from holdover.lab import nut
from holdover.lab.broker import free_port
from holdover.node.nut_client import NutClient, NutError
from holdover.node.rescue import Rescuer
from holdover.node.rescue_ledger import RescueLedger
from holdover.node.ups import Runtime, UpsReader, UpsWatch
from holdover.settings import ProtectSettings, Settings, UpsSettings
from support import HOLDOVER, wait_for

pytestmark = pytest.mark.skipif(not nut.available(), reason="needs Debian's nut-server (scripts/ensure-system-deps.sh)")

ONLINE = {"ups.status": "OL", "battery.charge": "100", "battery.runtime": "900", "ups.load": "30"}


@pytest.fixture
def upsd(tmp_path: Path):
    with nut.NutServer(tmp_path / "nut", {"hostups": ONLINE, "bare": {"ups.status": "OL"}}) as server:
        yield server


def _ups(server: nut.NutServer, name: str = "hostups", **kw: Any) -> UpsSettings:
    return UpsSettings.model_validate({"nut": f"{name}@127.0.0.1:{server.port}", **kw})


def test_the_ups_is_read_from_a_real_upsd_and_each_failure_is_named(upsd: nut.NutServer) -> None:
    r = UpsReader(_ups(upsd)).read()
    assert (r.status, r.charge, r.runtime_s, r.load, r.on_battery) == (("OL",), 100, 900, 30, False)
    bare = UpsReader(_ups(upsd, "bare")).read()
    assert bare.runtime_s is None and bare.describe() == "OL, no battery.runtime"
    with pytest.raises(NutError, match=rf"UPS nosuch@127.0.0.1:{upsd.port}: upsd at .* has no UPS 'nosuch'"):
        UpsReader(_ups(upsd, "nosuch")).read()
    upsd.stop_upsd()
    with pytest.raises(NutError, match=rf"cannot reach upsd at 127.0.0.1:{upsd.port}: Connection refused"):
        UpsReader(_ups(upsd)).read()


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (b"", "closed the connection"),
        (b"HTTP/1.1 400 Bad Request\r\n\r\n", "answered garbage to LIST: 'HTTP/1.1 400 Bad Request'"),
        (b"BEGIN LIST VAR hostups\nVAR hostups ups.status OL\n", "answered garbage to LIST VAR hostups"),
        (b"x" * 5000, "sent a line longer than 4096 bytes"),
        (None, "did not answer within 0.5 s"),
    ],
)
def test_a_server_that_is_not_upsd_is_an_error_never_a_hang(answer: bytes | None, said: str) -> None:
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = srv.accept()
        conn.recv(100)
        if answer is not None:
            conn.sendall(answer)
            conn.close()
        else:
            time.sleep(1.5)  # silent: the client's timeout must end it
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    client = NutClient("127.0.0.1", srv.getsockname()[1], timeout=0.5)
    client.connect()
    t0 = time.monotonic()
    with pytest.raises(NutError, match=said.replace("(", r"\(").replace(")", r"\)")):
        client.list_vars("hostups")
    assert time.monotonic() - t0 < 1.0
    srv.close()


def _kinds(path: Path) -> list[Event]:
    with Journal(path, readonly=True) as j:
        return [e for e in reversed(j.events(limit=200)) if e.boot == "host"]


def test_the_host_ups_sets_the_deadline_and_its_low_battery_runs_the_final_command(
    upsd: nut.NutServer, tmp_path: Path
) -> None:
    flag = tmp_path / "final-ran"
    cfg = Settings.model_validate(
        {
            "mqtt": {"port": free_port()},  # no broker, no sentinel: a UPS alone protects the runs
            "journal": {"path": str(tmp_path / "j.db")},
            "ups": {"nut": f"hostups@127.0.0.1:{upsd.port}", "poll_s": 0.2},
            "protect": {
                "registry": str(tmp_path / "reg"),
                "grace": 0,
                "margin": 30,
                "final_command": f"echo bye > {flag}",
            },
        }
    )
    bt = BridgeThread(Bridge(cfg)).start()
    journal = tmp_path / "j.db"
    try:
        wait_for(lambda: bt.bridge.ups is not None and bt.bridge.ups.latest is not None, 10, "the first read")
        assert bt.bridge.ups.runtime(600).seconds == 900
        upsd.set("hostups", ups_status="OB DISCHRG", battery_charge="90", battery_runtime="480", ups_load="30")
        wait_for(lambda: any(e.kind == "ups_on_battery" for e in _kinds(journal)), 10, "ups_on_battery")
        with Journal(journal, readonly=True) as j:
            rescue = wait_for(lambda: RescueLedger(j).rescues(), 10, "the rescue")[0]
        assert rescue["reason"] == "ups_on_battery" and not rescue["critical"]
        assert abs(rescue["deadline"] - rescue["started"] - (480 - 30)) < 3, rescue
        assert not flag.exists()

        upsd.set("hostups", ups_status="OB DISCHRG LB", battery_charge="10", battery_runtime="60")
        wait_for(flag.exists, 15, "the final command, on the UPS's low battery")
        low = [e for e in _kinds(journal) if e.kind == "ups_low_battery"]
        assert len(low) == 1 and low[0].data["runtime_s"] == 60 and low[0].data["ups"] == "hostups"

        upsd.set("hostups", **{k.replace(".", "_"): v for k, v in ONLINE.items()})
        wait_for(lambda: any(e.kind == "ups_online" for e in _kinds(journal)), 10, "ups_online")
        upsd.stop_upsd()
        wait_for(lambda: any(e.kind == "ups_unreadable" for e in _kinds(journal)), 10, "ups_unreadable")
        rt = bt.bridge.ups.runtime(600)
        assert not rt.read and f"cannot reach upsd at 127.0.0.1:{upsd.port}" in rt.said, rt
        assert rt.said.startswith("[protect] runtime_default 600 s, a guess (") and rt.seconds == 600
        assert bt.thread.is_alive()
    finally:
        bt.stop()
    with Journal(journal, readonly=True) as j:
        assert [r["reason"] for r in RescueLedger(j).rescues()] == ["ups_on_battery", "ups_low_battery"]


def _event(j: Journal, kind: str, sid: str = "rack1", **data: object) -> Event:
    (seq,) = j.db.execute("SELECT COUNT(*) + 1 FROM events").fetchone()
    body = {"sid": sid, "boot": "b1", "seq": seq, "kind": kind, "ms": 0, "ts": None, "data": data}
    ev = j.accept("mqtt", body)
    assert ev is not None
    return ev


def _protect(tmp: Path, **kw: object) -> ProtectSettings:
    base = {"registry": tmp / "reg", "rescue_dir": tmp / "rescue", "grace": 0, "margin": 5, "gcore": False, "shm": []}
    return ProtectSettings.model_validate({**base, **kw})


def test_one_cut_seen_by_both_sources_is_one_rescue_and_the_sentinels_cell_sets_nothing(tmp_path: Path) -> None:
    flag = tmp_path / "final-ran"
    with Journal(tmp_path / "j.db") as j:

        async def go() -> None:
            r = Rescuer(
                _protect(tmp_path, grace=0.5, final_command=f"touch {flag}"),
                j,
                runtime=lambda _d: Runtime(300, "UPS", False, True),
            )
            # The sentinel's own cell: never a rescue, never the final command.
            r.on_event(_event(j, protocol.BATTERY_CRITICAL, runtime_s=90, on_battery=True))
            r.on_event(_event(j, protocol.MAINS_LOST, runtime_s=40000))  # the sentinel, first
            r.on_event(_event(j, events.UPS_ON_BATTERY, sid="node", ups="hostups", runtime_s=300))  # then the UPS
            await r.wait_idle()
            # After that rescue ended, the other source's word on the same cut still starts nothing.
            r.on_event(_event(j, events.UPS_ON_BATTERY, sid="node", ups="hostups", runtime_s=290))
            await r.wait_idle()
            r.on_event(_event(j, events.UPS_ONLINE, sid="node", ups="hostups"))
            r.on_event(_event(j, events.UPS_ON_BATTERY, sid="node", ups="hostups", runtime_s=280))  # a new cut
            await r.wait_idle()

        asyncio.run(go())
        rescues = RescueLedger(j).rescues()
    assert [x["reason"] for x in rescues] == [protocol.MAINS_LOST, events.UPS_ON_BATTERY]
    # The first: the UPS's runtime now (300 s), not the sentinel's 40000 s, less the 5 s margin.
    assert abs(rescues[0]["deadline"] - rescues[0]["started"] - 295) < 2, rescues[0]
    assert not flag.exists()


HUNG = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # asked to save, it never does: the rescue waits\n"
    "from pathlib import Path\n"
    "from holdover.train.registry import Registration, write_registration\n"
    "write_registration(Path(sys.argv[1]), Registration('hung', os.getpid(), '', sys.argv[2], 12, [], '/', time.time()))\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def test_a_runtime_that_falls_while_saving_pulls_the_deadline_in(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", HUNG, str(tmp_path / "reg"), str(tmp_path / "ckpt")], stdout=subprocess.PIPE, text=True
    )
    left = [600.0]
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        with Journal(tmp_path / "j.db") as j:

            async def go() -> None:
                r = Rescuer(
                    _protect(tmp_path, hang_after=30),
                    j,
                    runtime=lambda _d: Runtime(left[0], "UPS hostups", False, True),
                )
                r.on_event(_event(j, events.UPS_ON_BATTERY, sid="node", ups="hostups", runtime_s=600))
                await asyncio.sleep(1.5)
                left[0] = 200.0  # the load went up: the UPS says so
                await asyncio.sleep(2.0)
                await r.close()

            asyncio.run(go())
            rescue = RescueLedger(j).rescues()[0]
        assert abs(rescue["deadline"] - rescue["started"] - (200 - 5)) < 5, rescue
    finally:
        proc.kill()
        proc.wait()


def test_a_sentinel_cut_the_ups_never_sees_is_a_disagreement(upsd: nut.NutServer) -> None:
    raised: list[tuple[str, dict]] = []
    watch = UpsWatch(_ups(upsd, disagree_after_s=0.3), lambda kind, data: raised.append((kind, data)))  # type: ignore[arg-type,return-value]

    async def go() -> None:
        await watch.look()
        lost = Event(1, time.time(), "mqtt", "rack1", "b1", 5, protocol.MAINS_LOST, 0, None, {})
        watch.on_event(lost)
        await watch.look()
        assert raised == []  # not yet: a second source may be slower
        await asyncio.sleep(0.4)
        await watch.look()
        await watch.look()  # said once
        await watch.close()

    asyncio.run(go())
    assert raised == [(events.POWER_DISAGREE, {"sentinel": "rack1", "ups": "hostups", "after_s": 0})]


def test_status_reads_the_ups_now_and_names_what_is_wrong(upsd: nut.NutServer, tmp_path: Path) -> None:
    cfg = tmp_path / "h.toml"
    cfg.write_text(
        f'[journal]\npath = "{tmp_path / "j.db"}"\n[ups]\nnut = "hostups@127.0.0.1:{upsd.port}"\n'
        f'[protect]\nregistry = "{tmp_path / "reg"}"\n'
    )
    # No journal: the bridge never ran. A UPS-only box's status shows the UPS anyway (it exited 2).

    def status(*extra: str) -> subprocess.CompletedProcess[str]:
        cmd = [HOLDOVER, "status", "-c", str(cfg), *extra]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})

    upsd.set("hostups", ups_status="OB DISCHRG", battery_charge="90", battery_runtime="460", ups_load="30")
    time.sleep(1.0)  # dummy-ups reads its file again within half a second
    r = status("--json")
    assert r.returncode == 0, r.stderr
    u = json.loads(r.stdout)["ups"]
    assert (u["name"], u["status"], u["on_battery"], u["runtime_s"], u["guess"]) == (
        "hostups",
        "OB DISCHRG",  # in NUT's order, as upsc prints it
        True,
        460,
        False,
    )
    assert u["deadline_from"] == "UPS hostups: 460 s left"
    r = status()
    assert f"host UPS hostups (hostups@127.0.0.1:{upsd.port}): OB DISCHRG, 90 %, 460 s left, load 30 %" in r.stdout
    assert "journal: none yet: the bridge has not run with this config" in r.stdout, r.stdout
    assert not (tmp_path / "j.db").exists()  # a reader makes nothing
    upsd.stop_upsd()
    r = status()
    assert r.returncode == 0, r.stderr
    assert f"host UPS hostups: UPS hostups@127.0.0.1:{upsd.port}: cannot reach upsd" in r.stdout
    assert "an emergency's deadline: [protect] runtime_default 600 s, a guess (UPS hostups@" in r.stdout
    # `get`, as upsc does: nothing on stdout, the reason on stderr, exit 1 (a script must not read
    # an empty line as a status); and with the UPS there, the status in NUT's order.
    get = [HOLDOVER, "get", "ups", "status", "-c", str(cfg)]
    r = subprocess.run(get, capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout) == (1, ""), (r.returncode, r.stdout, r.stderr)
    assert f"holdover: UPS hostups@127.0.0.1:{upsd.port}: cannot reach upsd" in r.stderr, r.stderr


def test_changes_within_one_second_all_reach_nut(upsd: nut.NutServer) -> None:
    # dummy-ups re-reads its file only when the mtime moves in whole seconds: a blip (OB, then OL
    # within the second) once left every client at OB for good. write_dev moves the mtime on.
    def served() -> str:
        with NutClient("127.0.0.1", upsd.port) as c:
            c.connect()
            return c.list_vars("hostups")["ups.status"]

    while time.time() % 1 > 0.05:  # at the start of a second, so that dummy-ups reads it within it
        time.sleep(0.005)
    upsd.set("hostups", ups_status="OB DISCHRG")
    wait_for(lambda: served() == "OB DISCHRG", 3, "the cut")
    upsd.set("hostups", ups_status="OL CHRG")  # most often within the same second as the cut
    wait_for(lambda: served() == "OL CHRG", 3, "the blip's end, written within the second of its start")
    path = upsd.dev("hostups")  # and whatever the timing: each write moves the whole-second mtime
    upsd.set("hostups", ups_status="OB DISCHRG")
    first = int(path.stat().st_mtime)
    upsd.set("hostups", ups_status="OL")
    assert int(path.stat().st_mtime) > first
