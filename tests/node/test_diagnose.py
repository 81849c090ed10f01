"""`holdover diagnose` in the namespace lab: every hop passes, then the primary's ISP goes silent
(the report names its gateway as the first failed hop) and its cable is pulled (no carrier)."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from pathlib import Path

import tomli_w

from holdover.lab.netlab import BACKUP, PRIMARY, TARGET, NetLab
from holdover.lab.targets import dns_answer
from holdover.node.probe import in_netns
from support import HOLDOVER

KEY = "3c9e1f7a5b2d8c4e6f0a1b3d5e7c9a2f"
PORT = 8443


def _resolver(lab: NetLab) -> socket.socket:
    """A DNS resolver on the internet side of the lab (TARGET:53)."""
    with in_netns(lab.inet_name):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((TARGET, 53))

    def serve() -> None:
        while True:
            try:
                q, peer = s.recvfrom(512)
            except OSError:
                return
            a = dns_answer(q)
            if a:
                s.sendto(a, peer)

    threading.Thread(target=serve, daemon=True).start()
    return s


def _diagnose(tmp_path: Path, lab: NetLab) -> tuple[int, dict[str, dict]]:
    cfg = {
        "journal": {"path": str(tmp_path / "j.db")},
        "sentinels": [{"id": "rack1", "key": KEY}],
        "failover": {
            "netns": lab.node_name,
            "targets": [f"{TARGET}:{PORT}"],
            "uplinks": [{"name": u["name"], "dev": u["dev"], "gateway": u["gateway"]} for u in (PRIMARY, BACKUP)],
        },
        "diagnose": {"resolvers": [TARGET], "name": "example.org"},
    }
    (tmp_path / "h.toml").write_text(tomli_w.dumps(cfg))
    r = subprocess.run(
        [HOLDOVER, "diagnose", "-c", str(tmp_path / "h.toml"), "--json"], capture_output=True, text=True, timeout=60
    )
    assert r.stdout, r.stderr
    return r.returncode, {f["check"]: f for f in json.loads(r.stdout)["findings"]}


def test_the_report_walks_each_uplink_hop_by_hop_and_names_the_first_failed_one(tmp_path: Path) -> None:
    with NetLab() as lab:
        lab.serve(PORT)
        resolver = _resolver(lab)
        try:
            rc, good = _diagnose(tmp_path, lab)
            assert rc == 0 and {f["status"] for f in good.values()} == {"pass"}, good
            assert set(good) >= {
                "wan (wan0): link",
                "wan (wan0): gateway 10.1.0.1",
                f"wan (wan0): target {TARGET}:{PORT}",
                "usb (usb0): gateway 10.2.0.1",
                f"DNS {TARGET} (example.org)",
            }
            lab.silence(PRIMARY)  # the ISP drops everything from the node; the link stays up
            rc, cut = _diagnose(tmp_path, lab)
            assert rc == 2
            assert cut["wan (wan0): link"]["status"] == "pass"
            gw = cut["wan (wan0): gateway 10.1.0.1"]
            assert gw["status"] == "fail" and "the first failed hop" in gw["detail"]
            assert f"wan (wan0): target {TARGET}:{PORT}" not in cut  # nothing past a dead hop is asked
            assert cut[f"usb (usb0): target {TARGET}:{PORT}"]["status"] == "pass"
            assert cut[f"DNS {TARGET} (example.org)"]["status"] == "fail"  # the default route is the dead one
            lab.silence(PRIMARY, False)
            lab.link(PRIMARY, False)  # the cable (the ISP's end of it) goes
            _rc, pulled = _diagnose(tmp_path, lab)
            assert (
                pulled["wan (wan0): link"]["status"] == "fail" and "no carrier" in pulled["wan (wan0): link"]["detail"]
            )
        finally:
            resolver.close()
