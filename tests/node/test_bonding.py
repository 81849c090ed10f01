"""The bonding watch from fixture /proc/net/bonding files: both slaves up, one down, one flapping,
through the bridge's own alerts."""

from __future__ import annotations

import time
from pathlib import Path

from holdover.bridge.service import Bridge, BridgeThread
from holdover.lab.broker import free_port
from holdover.node.bonding import BondWatch, read
from holdover.settings import BondingSettings, Settings
from support import wait_for

BOND = """Ethernet Channel Bonding Driver: v5.10.0

Bonding Mode: fault-tolerance (active-backup)
Currently Active Slave: eth0
MII Status: up
MII Polling Interval (ms): 100

Slave Interface: eth0
MII Status: up
Speed: 1000 Mbps
Link Failure Count: 0

Slave Interface: eth1
MII Status: {eth1}
Speed: 1000 Mbps
Link Failure Count: 3
"""


def _bond(proc: Path, eth1: str) -> None:
    f = proc / "net" / "bonding" / "bond0"
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(BOND.format(eth1=eth1))


def test_a_slave_going_down_and_back_is_one_event_each_way(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    _bond(proc, "up")
    assert read(proc) == {"bond0": {"eth0": "up", "eth1": "up"}}  # the bond's own MII line is not a slave
    got: list[tuple[str, dict]] = []
    w = BondWatch(BondingSettings(proc=proc), lambda k, d: got.append((k, d)))
    w.check()
    assert got == []  # both up: nothing to say
    _bond(proc, "down")
    w.check()
    w.check()
    assert got == [("bond_slave_down", {"bond": "bond0", "slave": "eth1", "mii": "down", "up": "eth0"})]
    _bond(proc, "up")
    w.check()
    assert [k for k, _ in got] == ["bond_slave_down", "bond_slave_up"]
    # A bond already degraded when the watch starts is news too.
    fresh: list[str] = []
    _bond(proc, "down")
    BondWatch(BondingSettings(proc=proc), lambda k, d: fresh.append(k)).check()
    assert fresh == ["bond_slave_down"]


def test_a_flapping_slave_reaches_the_phone_once_then_as_a_summary(tmp_path: Path, ntfy) -> None:
    proc = tmp_path / "proc"
    _bond(proc, "up")
    cfg = Settings.model_validate(
        {
            "mqtt": {"port": free_port()},  # no broker: the bonds and alerts need none
            "journal": {"path": str(tmp_path / "j.db")},
            "bonding": {"proc": str(proc), "interval": 0.05},
            "alerts": {
                "channels": [{"name": "phone", "url": ntfy.url("phone"), "min_severity": "info"}],
                "flap_after": 3,
                "flap_window_s": 2.0,
            },
        }
    )
    bt = BridgeThread(Bridge(cfg)).start()
    try:
        for state in ("down", "up", "down", "up", "down", "up", "down"):
            _bond(proc, state)
            time.sleep(0.2)
        wait_for(lambda: any(" flapped " in m["title"] for m in ntfy.got), 10, "the summary as it settles")
    finally:
        bt.stop()
    titles = [m["title"] for m in ntfy.got]
    assert titles[:2] == ["Bond bond0: slave eth1 is down, no redundancy left", "Bond bond0: slave eth1 is back"]
    assert "no redundancy left" in ntfy.got[0]["title"] and "traffic still flows on eth0;" in ntfy.got[0]["message"]
    assert len(titles) == 3 and titles[2].startswith("Bond slave down at node flapped 5 times in "), titles
