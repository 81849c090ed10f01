"""The host's UPS through apcupsd's NIS (port 3551): read as Home Assistant's client reads it,
its words put in NUT's, every failure a named error within the timeout, and the whole rescue
driven by it as by NUT.

apcupsd needs a UPS on a cable, so its NIS is a stand-in (holdover.lab.apc_nis); Debian's own
`apcaccess` reading that stand-in is what says its bytes are apcupsd's.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from holdover.bridge.service import Bridge, BridgeThread
from holdover.journal import Journal
from holdover.lab.apc_nis import NisPeer
from holdover.lab.broker import free_port
from holdover.node.doctor import Doctor
from holdover.node.nut_client import NutError
from holdover.node.rescue_ledger import RescueLedger
from holdover.node.ups import UpsReader
from holdover.settings import ConfigError, Settings, UpsSettings, load
from support import wait_for

ROOT = Path(__file__).resolve().parents[2]
APCACCESS = shutil.which("apcaccess") or str(ROOT / ".cache/apcupsd/root/sbin/apcaccess")


@pytest.fixture
def nis():
    with NisPeer() as peer:
        yield peer


def _ups(peer: NisPeer, **kw: object) -> UpsSettings:
    return UpsSettings.model_validate({"apcupsd": f"127.0.0.1:{peer.port}", "timeout_s": 0.5, **kw})


def test_debians_apcaccess_reads_the_stand_in(nis: NisPeer) -> None:
    assert Path(APCACCESS).exists(), "scripts/ensure-system-deps.sh unpacks Debian's apcaccess"
    nis.set(STATUS="ONBATT", TIMELEFT="7.5 Minutes")
    out = subprocess.run([APCACCESS, "-h", f"127.0.0.1:{nis.port}", "status"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "STATUS   : ONBATT\n" in out.stdout and "TIMELEFT : 7.5 Minutes\n" in out.stdout
    one = subprocess.run([APCACCESS, "-h", f"127.0.0.1:{nis.port}", "-p", "BCHARGE"], capture_output=True, text=True)
    assert one.stdout == "100.0 Percent\n"


def test_apcupsds_words_are_read_as_nuts(nis: NisPeer) -> None:
    r = UpsReader(_ups(nis)).read()
    assert (r.status, r.charge, r.runtime_s, r.load, r.on_battery) == (("OL",), 100, 900, 30, False)
    nis.set(
        STATUS="ONBATT LOWBATT", BCHARGE="12.0 Percent", TIMELEFT="1.5 Minutes", LOADPCT="41.0 Percent Load Capacity"
    )
    r = UpsReader(_ups(nis)).read()
    assert (r.status, r.charge, r.runtime_s, r.load) == (("OB", "LB"), 12, 90, 41)
    assert r.low(0.0)
    nis.set(STATUS="SHUTTING DOWN")
    assert UpsReader(_ups(nis)).read().status == ("FSD",)
    # A UPS that gives no TIMELEFT: absent, as with NUT, and a fixed runtime_s stands in.
    del nis.fields["TIMELEFT"]
    nis.set(STATUS="ONLINE")
    assert UpsReader(_ups(nis)).read().describe() == "OL, 12 %, no battery.runtime, load 41 %"
    assert UpsReader(_ups(nis, runtime_s=300)).read().runtime_s == 300


@pytest.mark.parametrize(
    ("fault", "said"),
    [
        ({"STATUS": "COMMLOST"}, "lost its UPS \\(COMMLOST"),
        ({"STATUS": ""}, "reports no STATUS"),
        ({"STATUS": "GIBBERISH"}, "reports a STATUS holdover does not know: 'GIBBERISH'"),
        (b"", "closed the connection before the end of its status"),
        (b"HTTP/1.1 400 Bad Request\r\n\r\n", "closed the connection before the end"),
        (b"\x00\x05hello\x00\x00", "answered garbage, not apcupsd's NAME : value records"),
        (b"\x00\x0cSTATUS: \xff\xfe\xfd\n\x00\x00", "answered garbage"),
        (b"x" * 70000, "sent no end to its status"),
        (None, "did not answer within 0.5 s"),
    ],
)
def test_each_fault_is_named_within_the_timeout(nis: NisPeer, fault: object, said: str) -> None:
    if isinstance(fault, dict):
        nis.set(**fault)
    elif fault is None:
        nis.silent = True
    else:
        nis.raw = fault  # type: ignore[assignment]
    t0 = time.monotonic()
    with pytest.raises(NutError, match=f"apcupsd at 127.0.0.1:{nis.port} {said}"):
        UpsReader(_ups(nis)).read()
    assert time.monotonic() - t0 < 1.0


def test_the_address_is_checked_and_one_source_is_named(tmp_path: Path) -> None:
    assert UpsSettings.model_validate({"apcupsd": "nas.lan"}).nis_address() == ("nas.lan", 3551)
    assert UpsSettings.model_validate({"apcupsd": "[::1]:3552"}).nis_address() == ("::1", 3552)
    bad = tmp_path / "bad.toml"
    bad.write_text('[ups]\napcupsd = "127.0.0.1:3551"\nnut = "myups@127.0.0.1"\n')
    with pytest.raises(ConfigError, match=r"ups: .*set one of nut and apcupsd"):
        load(bad)
    bad.write_text('[ups]\napcupsd = "http://nas:3551"\n')
    with pytest.raises(ConfigError, match=r"ups\.apcupsd: .*expected HOST or HOST:PORT"):
        load(bad)


def test_apcupsd_alone_runs_the_rescue_and_the_doctor_reads_it(nis: NisPeer, tmp_path: Path) -> None:
    flag = tmp_path / "final-ran"
    cfg = Settings.model_validate(
        {
            "mqtt": {"port": free_port()},
            "journal": {"path": str(tmp_path / "j.db")},
            "ups": {"apcupsd": f"127.0.0.1:{nis.port}", "poll_s": 0.2},
            "protect": {"registry": str(tmp_path / "reg"), "grace": 0, "margin": 30, "final_command": f"touch {flag}"},
        }
    )
    check = Doctor(cfg).ups()
    assert check.detail == f"apcupsd at 127.0.0.1:{nis.port}: OL, 100 %, 900 s left, load 30 %", check
    bt = BridgeThread(Bridge(cfg)).start()
    try:
        wait_for(lambda: bt.bridge.ups is not None and bt.bridge.ups.latest is not None, 10, "the first read")
        nis.set(STATUS="ONBATT", TIMELEFT="8.0 Minutes")
        with Journal(tmp_path / "j.db", readonly=True) as j:
            rescue = wait_for(lambda: RescueLedger(j).rescues(), 10, "the rescue")[0]
        assert rescue["reason"] == "ups_on_battery"
        assert abs(rescue["deadline"] - rescue["started"] - (480 - 30)) < 3, rescue
        nis.set(STATUS="ONBATT LOWBATT", TIMELEFT="1.0 Minutes")
        wait_for(flag.exists, 15, "the final command, on apcupsd's LOWBATT")
        nis.close()
        wait_for(lambda: bt.bridge.ups.problem is not None, 10, "the NIS gone")
        assert "cannot reach apcupsd at" in bt.bridge.ups.runtime(600).said
        assert bt.thread.is_alive()
    finally:
        bt.stop()
