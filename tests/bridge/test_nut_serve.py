"""Every NUT client can follow the sentinel: NUT's own upsd and dummy-ups serve the files the bridge
keeps, with the config `holdover nut-config` wrote, to a real upsmon secondary.

A power cut on the emulated sentinel reaches the secondary's NOTIFYCMD as ONBATT, and the restore as
ONLINE; the host UPS at low battery is LB to it, and holdover's final command is FSD, on which the
secondary runs its SHUTDOWNCMD (a script that records).
"""

from __future__ import annotations

import grp
import subprocess
import time
from pathlib import Path

import pytest

from holdover.firmware.version import VERSION as FIRMWARE
from holdover.lab import nut
from holdover.lab.broker import free_port
from support import HOLDOVER, wait_for

pytestmark = pytest.mark.skipif(not nut.available(), reason="needs Debian's nut-server (scripts/ensure-system-deps.sh)")

HOST_ONLINE = {"ups.status": "OL", "battery.charge": "100", "battery.runtime": "900", "ups.load": "30"}


def _upsc(port: int, var: str) -> str:
    r = subprocess.run(["upsc", f"holdover-demo@127.0.0.1:{port}", var], capture_output=True, text=True, timeout=10)
    return r.stdout.strip()


def _nut_config(rig, conf: Path) -> str:
    """NUT's config as a user makes it (`holdover nut-config`); the MONITOR line it prints."""
    r = subprocess.run(
        [HOLDOVER, "nut-config", "-c", str(rig.dir / "holdover.toml"), "--out", str(conf), "--host", "127.0.0.1"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    return next(line.strip() for line in r.stdout.splitlines() if line.strip().startswith("MONITOR "))


def _serving(site_dir: Path, port: int) -> dict:
    return {"serve": True, "dir": str(site_dir / "served"), "listen": "127.0.0.1", "port": port, "clients": ["gpu2"]}


@pytest.mark.long
def test_a_upsmon_secondary_follows_the_sentinel_through_nuts_own_upsd(
    rig_factory, tmp_path: Path, site_dir: Path
) -> None:
    serve_port, flag = free_port(), tmp_path / "final-ran"
    with nut.NutServer(tmp_path / "host-nut", {"hostups": HOST_ONLINE}) as host_ups:
        rig = rig_factory(
            protect={"registry": str(tmp_path / "reg"), "grace": 0, "final_command": f"touch {flag}"},
            bridge_extra={
                "ups": {"nut": f"hostups@127.0.0.1:{host_ups.port}", "poll_s": 0.2},
                "nut_server": _serving(site_dir, serve_port),  # its dir read by dummy-ups, as nut
            },
        )
        rig.wait("boot", 15)
        dev = site_dir / "served" / "holdover-demo.dev"
        wait_for(lambda: dev.exists() and "ups.status: OL\n" in dev.read_text(), 10, "the served file, on line")
        assert "battery.runtime: 900\n" in dev.read_text()  # the host UPS's, not the sentinel's cell

        # NUT's config as a user makes it, then NUT's own daemons serving it, as the `nut` user.
        conf = site_dir / "nut"
        monitor = _nut_config(rig, conf)
        password = (conf / "gpu2.password").read_text().strip()
        assert monitor == f"MONITOR holdover-demo@127.0.0.1:{serve_port} 1 gpu2 {password} secondary"
        with nut.NutServer(tmp_path / "served-nut", {"holdover-demo": {}}, port=serve_port, confdir=conf):
            assert _upsc(serve_port, "ups.status") == "OL"
            assert _upsc(serve_port, "ups.id") == "demo"
            assert _upsc(serve_port, "input.voltage") == ""  # not invented
            assert _upsc(serve_port, "ups.load") == "30"  # the host UPS's
            assert _upsc(serve_port, "ups.firmware") == FIRMWARE  # what the sentinel said at its boot
            assert _upsc(serve_port, "driver.name") == "dummy-ups"
            with nut.Upsmon(tmp_path / "upsmon", monitor) as mon:
                time.sleep(2)  # upsmon's first poll sees OL: nothing to say
                rig.control.send(mains=False)
                wait_for(lambda: "ONBATT" in [k for _t, k in mon.said()], 15, "ONBATT at upsmon")
                assert _upsc(serve_port, "ups.status") == "OB DISCHRG"
                rig.control.send(mains=True)
                wait_for(lambda: "ONLINE" in [k for _t, k in mon.said()], 15, "ONLINE at upsmon")

                # The host's UPS runs low while the power is out: LB, then the final command is FSD.
                rig.control.send(mains=False)
                host_ups.set("hostups", ups_status="OB DISCHRG LB", battery_charge="8", battery_runtime="50")
                wait_for(flag.exists, 20, "holdover's final command")
                wait_for(mon.shutdown.exists, 20, "the secondary's SHUTDOWNCMD, on FSD")
                assert "FSD" in _upsc(serve_port, "ups.status").split()
                said = [k for _t, k in mon.said()]
                # A poll between LB and FSD sees OB LB, which is critical to upsmon by itself: it
                # says LOWBATT and shuts down before FSD is served. Either is the secondary told.
                told = [k for k in said if k in ("LOWBATT", "FSD")]
                assert told and said.index("ONBATT") < said.index("ONLINE") < said.index(told[0]), said

    # A re-run keeps the password the secondary already uses.
    again = subprocess.run(
        [HOLDOVER, "nut-config", "-c", str(rig.dir / "holdover.toml"), "--out", str(conf)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert again.returncode == 0 and "kept the passwords of gpu2" in again.stdout
    assert (conf / "gpu2.password").read_text().strip() == password
    nut_gid = grp.getgrnam("nut").gr_gid
    for name in ("ups.conf", "upsd.conf", "upsd.users", "nut.conf"):
        st = (conf / name).stat()
        assert (oct(st.st_mode & 0o777), st.st_uid, st.st_gid) == ("0o640", 0, nut_gid), name  # as Debian ships NUT's
    assert oct((conf / "gpu2.password").stat().st_mode & 0o777) == "0o600"
    assert (conf / "nut.conf").read_text().splitlines()[-1] == "MODE=netserver"


@pytest.mark.long
def test_a_silent_sentinel_is_a_dead_ups_to_upsmon_within_its_keepalive_and_alive_again_when_heard(
    rig_factory, tmp_path: Path, site_dir: Path
) -> None:
    serve_port, keepalive = free_port(), 2
    rig = rig_factory(keepalive_s=keepalive, bridge_extra={"nut_server": _serving(site_dir, serve_port)})
    rig.wait("boot", 15)
    dev = site_dir / "served" / "holdover-demo.dev"
    wait_for(lambda: dev.exists() and "ups.status: OL\n" in dev.read_text(), 10, "the served file, on line")
    monitor = _nut_config(rig, site_dir / "nut")
    served = nut.NutServer(tmp_path / "served-nut", {"holdover-demo": {}}, port=serve_port, confdir=site_dir / "nut")
    with served, nut.Upsmon(tmp_path / "upsmon", monitor) as mon:
        wait_for(lambda: _upsc(serve_port, "ups.status") == "OL", 10, "OL served")
        time.sleep(2)  # upsmon's first polls: OL, nothing to say
        silent_at = time.time()
        rig.control.send(wlan=False)  # a dead radio: no FIN, the broker's keepalive fires the will
        wait_for(lambda: 'ups.status: ""\n' in dev.read_text(), 30, "the served file, silent")
        served_silent = time.time() - silent_at
        wait_for(lambda: "COMMBAD" in [k for _t, k in mon.said()], 30, "COMMBAD at upsmon")
        commbad = next(t for t, k in mon.said() if k == "COMMBAD") - silent_at
        assert _upsc(serve_port, "ups.status") == ""
        # Timed in its two halves, each with its own slack, since a loaded host stretches either:
        # holdover's (the will after 1.5 keepalives, then the bridge's write) and NUT's (dummy-ups'
        # read and upsmon's poll, a second each; upsmon stamps whole seconds). 4.0 s in all alone;
        # 15.9 s once with the whole suite beside it, against one 11 s bound for both.
        assert served_silent < 1.5 * keepalive + 6, served_silent
        assert commbad - served_silent < 2 + 1 + 6, (served_silent, commbad)
        rig.control.send(wlan=True)
        wait_for(lambda: "COMMOK" in [k for _t, k in mon.said()], 30, "COMMOK at upsmon")
        assert _upsc(serve_port, "ups.status") == "OL"
        said = [k for _t, k in mon.said()]
        assert said == ["COMMBAD", "COMMOK"], said  # silent is not on battery: no ONBATT, no shutdown
    print(
        f"served silent {served_silent:.1f} s and COMMBAD {commbad:.1f} s after the radio died (keepalive {keepalive} s)"
    )
