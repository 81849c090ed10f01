"""`holdover doctor` on a prepared good node and a prepared bad one: fixture files for /etc and
/proc, real processes in and out of a private tmux server, a test journal, a real broker, and the
two-uplink lab in namespaces of the test's own."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import tomli_w

from holdover.journal import Journal
from holdover.lab import nut
from holdover.lab.broker import Broker
from holdover.lab.netlab import BACKUP, PRIMARY, TARGET, NetLab
from holdover.train import registry
from support import HOLDOVER

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
KEY = "3c9e1f7a5b2d8c4e6f0a1b3d5e7c9a2f"
PORT = 8443

BOND_UP = """Ethernet Channel Bonding Driver: v5.10
Bonding Mode: fault-tolerance (active-backup)
Primary Slave: None
Currently Active Slave: eth0
MII Status: up

Slave Interface: eth0
MII Status: up
Speed: 1000 Mbps

Slave Interface: eth1
MII Status: up
Speed: 1000 Mbps
"""


def _tree(root: Path, good: bool) -> None:
    files = {
        "etc/ssh/sshd_config": "Port 22\nClientAliveInterval 60\n" if good else "Port 22\n# ClientAliveInterval 0\n",
        "proc/sys/net/ipv4/tcp_keepalive_time": "300\n" if good else "7200\n",
        "proc/sys/kernel/yama/ptrace_scope": "1\n" if good else "3\n",
        "proc/net/bonding/bond0": BOND_UP
        if good
        else BOND_UP.replace("eth1\nMII Status: up", "eth1\nMII Status: down"),
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def _run(tmp_path: Path, in_tmux: bool, nbytes: int, seconds: float) -> subprocess.Popen | None:
    """A registered 'training run': a sleep inside a private tmux server, or a bare child of ours."""
    cmd = "exec sleep 120"
    if in_tmux:
        sock = str(tmp_path / "tmux.sock")
        subprocess.run(["tmux", "-S", sock, "new-session", "-d", "-s", "train", cmd], check=True)
        out = subprocess.run(["tmux", "-S", sock, "list-panes", "-F", "#{pane_pid}"], capture_output=True, text=True)
        pid, child = int(out.stdout.split()[0]), None
    else:
        child = subprocess.Popen(["sh", "-c", cmd])
        pid = child.pid
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    save = registry.LastSave(step=100, directory=str(ckpt / "step_100"), nbytes=nbytes, seconds=seconds, at=time.time())
    reg = registry.Registration("exp1", pid, "", str(ckpt), 12, ["sleep"], str(tmp_path), time.time(), last_save=save)
    registry.write_registration(tmp_path / "registry", reg)
    return child


def _journal(path: Path, good: bool) -> None:
    with Journal(path) as j:
        j.set_status("rack1", "online" if good else "offline")
        body = {"sid": "rack1", "boot": "b1", "seq": 5, "ts": int(time.time()), "data": {"runtime_s": 600}}
        j.set_state(body)


def _doctor(
    tmp_path: Path, lab: NetLab, broker_port: int, hook: str, ups: dict | None = None, keep_days: float = 7
) -> tuple[int, dict[str, dict]]:
    cfg = {
        **({"ups": ups} if ups else {}),
        "hooks": [{"events": ["mains_lost"], "run": hook}],
        "mqtt": {"port": broker_port},
        "journal": {"path": str(tmp_path / "journal.db"), "keep_routine_days": keep_days},
        "sentinels": [{"id": "rack1", "key": KEY}],
        "protect": {"registry": str(tmp_path / "registry"), "grace": 10.0, "margin": 60.0},
        "failover": {
            "netns": lab.node_name,
            "targets": [f"{TARGET}:{PORT}"],
            "uplinks": [{"name": u["name"], "dev": u["dev"], "gateway": u["gateway"]} for u in (PRIMARY, BACKUP)],
        },
    }
    (tmp_path / "h.toml").write_text(tomli_w.dumps(cfg))
    r = subprocess.run(
        [HOLDOVER, "doctor", "-c", str(tmp_path / "h.toml"), "--root", str(tmp_path / "root"), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return r.returncode, {c["name"]: c for c in json.loads(r.stdout)}


def test_a_node_ready_for_an_outage_passes_every_check(tmp_path: Path) -> None:
    _tree(tmp_path / "root", good=True)
    _journal(tmp_path / "journal.db", good=True)
    online = {"ups.status": "OL", "battery.charge": "100", "battery.runtime": "600", "ups.load": "40"}
    with (
        NetLab() as lab,
        Broker(workdir=tmp_path / "broker") as broker,
        nut.NutServer(tmp_path / "nut", {"hostups": online}) as upsd,
    ):
        lab.serve(PORT)
        _run(tmp_path, in_tmux=True, nbytes=1_000_000, seconds=20)
        try:
            ups = {"nut": f"hostups@127.0.0.1:{upsd.port}"}
            rc, checks = _doctor(tmp_path, lab, broker.port, hook="logger -t holdover power lost", ups=ups)
        finally:
            subprocess.run(["tmux", "-S", str(tmp_path / "tmux.sock"), "kill-server"], capture_output=True)
    assert {c["status"] for c in checks.values()} <= {"pass", "skip"}, json.dumps(checks, indent=1)
    assert rc == 0
    assert len(checks) == 15 and checks["gcore can dump a run that cannot save"]["status"] == "pass"
    together = checks["a cut now saves every protected run"]["detail"]
    assert together == "with 8 min 50 s to save in (UPS hostups: 600 s left): exp1 20 s", together
    assert "MB; heartbeats and refused messages kept 7 days" in checks["the journal's size is bounded"]["detail"]
    assert checks["the host's UPS sets the deadline"]["detail"].endswith(": OL, 100 %, 600 s left, load 40 %")
    fits = checks["an emergency checkpoint of exp1 fits the UPS's runtime"]["detail"]
    assert fits == "the last took 20 s; 530 s left to save in (UPS hostups: 600 s left)"


def test_a_node_that_would_lose_its_run_fails_each_check_with_the_fix(tmp_path: Path) -> None:
    _tree(tmp_path / "root", good=False)
    _journal(tmp_path / "journal.db", good=False)
    # A port held bound but never listened on refuses every connection: a port merely found free
    # can be taken meanwhile by another test's broker (which then answers "Not authorized").
    with NetLab() as lab, socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        lab.serve(PORT)
        lab.silence(BACKUP)
        child = _run(tmp_path, in_tmux=False, nbytes=10**18, seconds=900)
        try:
            rc, checks = _doctor(
                tmp_path, lab, closed.getsockname()[1], hook="/usr/local/bin/no-such-hook --now", keep_days=0
            )
        finally:
            assert child is not None
            child.kill()
    want = {
        "runs survive a dropped SSH session": ("fail", "not inside tmux or screen: exp1"),
        "SSH sessions survive idle firewalls": ("warn", "sshd sends no keepalives"),
        "idle TCP connections are kept alive": ("warn", "tcp_keepalive_time = 7200 s"),
        "a healthy backup uplink": ("fail", "backup uplink(s) failing their probes: usb"),
        "bonded links have all their slaves": ("fail", "redundancy gone: bond0: eth1 down"),
        "room for the next checkpoint of exp1": ("fail", "the last checkpoint 1000000000.0 GB"),
        "the host's UPS sets the deadline": ("fail", "no [ups]: an emergency's deadline is [protect] runtime_default"),
        "an emergency checkpoint of exp1 fits the UPS's runtime": ("fail", "the last took 900 s; 530 s left"),
        "gcore can dump a run that cannot save": ("fail", "ptrace_scope = 3"),
        "the broker answers": ("fail", "cannot connect"),
        "every hook's program is there": ("fail", "mains_lost: /usr/local/bin/no-such-hook: no such file"),
        "sentinel rack1 is heard": ("fail", "offline (its last will)"),
        "the journal's size is bounded": ("warn", "heartbeats kept forever (~12 MB a month for 1 sentinel(s))"),
    }
    for name, (status, words) in want.items():
        assert checks[name]["status"] == status and words in checks[name]["detail"], checks[name]
        assert status == "pass" or checks[name]["fix"], checks[name]
    assert rc == 2


def test_the_fix_is_printed_whole_on_an_80_column_terminal(monkeypatch, capsys) -> None:
    from holdover.cli.common import print_checks
    from holdover.node.checks import Check

    fix = "echo 1 | sudo tee /proc/sys/kernel/yama/ptrace_scope; add kernel.yama.ptrace_scope=1 to /etc/sysctl.d/10-ptrace.conf"
    checks = [
        Check("the broker answers", "pass", "127.0.0.1:1883 in 2 ms"),
        Check("gcore can dump a run that cannot save", "fail", "ptrace_scope = 3: no process may be traced", fix),
    ]
    monkeypatch.setenv("COLUMNS", "80")
    print_checks(checks, with_fix=True)
    out = capsys.readouterr().out
    assert "…" not in out
    assert f"(1) gcore can dump a run that cannot save: {fix}\n" in out
    assert max(len(line) for line in out.splitlines() if "│" in line) <= 80  # the table fits


def test_a_second_bridge_for_the_node_is_named_in_its_log_and_by_the_doctor(tmp_path: Path) -> None:
    """A manual `holdover bridge` beside the service: same client id, so Mosquitto closes one
    connection for the other every time either reconnects, and says nothing to either of them."""
    with Broker() as broker:
        cfg = tmp_path / "h.toml"
        cfg.write_text(
            f'[mqtt]\nport = {broker.port}\n[journal]\npath = "{tmp_path / "j.db"}"\n[web]\nenabled = false\n'
            f'[[sentinels]]\nid = "rack1"\nkey = "{KEY}"\n'
        )
        logs = [tmp_path / "first.log", tmp_path / "second.log"]
        bridges = []
        try:
            for log in logs:
                with log.open("wb") as f:
                    bridges.append(subprocess.Popen([HOLDOVER, "bridge", "-c", str(cfg)], stderr=f, stdout=f))
            said = "another client connected as holdover-bridge-"
            deadline = time.monotonic() + 30
            while not any(said in log.read_text() for log in logs):
                ended = [b.poll() for b in bridges]
                assert time.monotonic() < deadline and ended == [None, None], [log.read_text()[-800:] for log in logs]
                time.sleep(0.2)
            r = subprocess.run(
                [HOLDOVER, "doctor", "-c", str(cfg), "--json"], capture_output=True, text=True, timeout=60
            )
        finally:
            for b in bridges:
                b.terminate()
                b.wait(20)
    check = {c["name"]: c for c in json.loads(r.stdout)}["one bridge runs for this node"]
    assert check["status"] == "fail", check
    assert all(f"pid {b.pid}: " in check["detail"] for b in bridges), check
    assert "2 bridges share" in check["detail"] and "client id holdover-bridge-" in check["detail"]
