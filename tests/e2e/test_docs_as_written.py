"""The commands the docs tell a user to type, run as they stand in the markdown (a doc that drifts
from what works fails here): docs/nut.md's NUT server start, docs/service.md's broker.

Each block runs as root in a mount and pid namespace of its own: /etc/holdover, /var/lib/holdover
and the daemons' own state directories are tmpfs there, laid out as Debian's packages leave them
(Debian's own config files are read as installed), and the daemons a block starts die with the
namespace. The network is the suite's sealed one, so the well-known ports are free.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from holdover.lab import nut
from support import KEY, Cgroup, the_block

LOGIN = """
import socket, sys
ups, user, password = sys.argv[1:]
s = socket.create_connection(("127.0.0.1", 3493), timeout=5)
f = s.makefile("rw")
for line in (f"USERNAME {user}", f"PASSWORD {password}", f"LOGIN {ups}", "LOGOUT"):
    f.write(line + "\\n"); f.flush()
    print(line.split()[0], f.readline().strip())
"""


def in_namespace(script: str, cwd: Path, timeout: float = 90) -> str:
    """`script` (bash) as root in a mount and pid namespace of its own; what it printed."""
    bin_dir = Path(sys.executable).parent  # where `holdover` is, as on a user's PATH
    r = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--mount-proc", "bash", "-c", script],
        cwd=cwd,
        env={"PATH": f"{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(cwd), "LANG": "C.UTF-8"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return r.stdout + r.stderr


@pytest.mark.skipif(not nut.available(), reason="needs Debian's nut-server (scripts/ensure-system-deps.sh)")
def test_nut_md_serves_the_sentinel_as_written(tmp_path: Path) -> None:
    start = the_block("nut.md", "sh", "holdover nut-config -c holdover.toml --out /etc/holdover/nut ")
    toml = the_block("nut.md", "toml", "[nut_server]")
    (tmp_path / "holdover.toml").write_text(f'{toml}\n[[sentinels]]\nid = "rack1"\nkey = "{KEY}"\n')
    (tmp_path / "login.py").write_text(LOGIN)
    script = textwrap.dedent(f"""\
        set -e
        for d in /etc/holdover /var/lib/holdover /run/nut; do mkdir -p $d && mount -t tmpfs tmpfs $d; done
        chown root:nut /run/nut && chmod 0770 /run/nut
        # What the bridge keeps for dummy-ups once it has heard the sentinel (bridge/nut_serve.py).
        mkdir /var/lib/holdover/nut && printf 'ups.status: OL\\nups.id: rack1\\n' > /var/lib/holdover/nut/holdover-rack1.dev
        set +e
        # ---- docs/nut.md, as written
        {start}
        # ----
        echo "block exit $?"
        for i in $(seq 50); do upsc holdover-rack1@127.0.0.1 ups.status 2>/dev/null | grep -q OL && break; sleep 0.2; done
        echo "upsc: $(upsc holdover-rack1@127.0.0.1 ups.status 2>/dev/null)"
        ps -o user:20=,comm= -C upsd,dummy-ups | sed 's/^/process: /'
        for c in nas gpu2; do {sys.executable} login.py holdover-rack1 $c "$(cat /etc/holdover/nut/$c.password)"; done
        """)
    out = in_namespace(script, tmp_path)
    assert "block exit 0" in out, out
    assert "upsc: OL" in out, out
    # Both daemons as the packaged user, not root.
    assert sorted(re.findall(r"process: (\S+) +(\S+)", out)) == [("nut", "dummy-ups"), ("nut", "upsd")], out
    # Each client's upsmon would log in (upsd read the users file it wrote, as `nut`).
    assert out.count("LOGIN OK") == 2, out
    assert "ACCESS-DENIED" not in out
    assert "start NUT on it" in out and "/lib/nut/upsd" in out  # nut-config printed the line the doc gives


CONNECT = """
import sys, paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
for user, password in (("holdover-bridge", open(sys.argv[1]).read().strip()), (None, None)):
    c = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    if user:
        c.username_pw_set(user, password)
    said = []
    c.on_connect = lambda c, u, f, reason, p: said.append(str(reason))
    c.connect("127.0.0.1", 1883)
    c.loop(timeout=3)
    print(f"login {user or 'anonymous'}: {said}")
"""


def test_service_md_broker_on_debians_mosquitto_as_written(tmp_path: Path) -> None:
    unit = Path("/lib/systemd/system/mosquitto.service")
    if not unit.exists():
        pytest.skip("needs Debian's mosquitto package")
    block = the_block("service.md", "sh", "holdover broker-config")
    # mosquitto.service's own start, as systemd would run it (no systemd here).
    lines = unit.read_text().splitlines()
    pre = [line.split("=", 1)[1] for line in lines if line.startswith("ExecStartPre=")]
    (start,) = [line.split("=", 1)[1] for line in lines if line.startswith("ExecStart=")]
    (tmp_path / "connect.py").write_text(CONNECT)
    script = textwrap.dedent(f"""\
        set -e
        for d in /etc/holdover /var/lib/holdover /etc/mosquitto/conf.d /var/lib/mosquitto /var/log/mosquitto /run/mosquitto; do
          mkdir -p $d && mount -t tmpfs tmpfs $d
        done
        chown mosquitto /var/lib/mosquitto
        holdover keygen rack1 >/dev/null
        # The [mqtt] lines broker-config prints, pasted before it ever ran (its password file not there yet).
        printf '[mqtt]\\nusername = "holdover-bridge"\\npassword_file = "/etc/holdover/mosquitto/holdover-bridge.password"\\n' > /etc/holdover/holdover.toml
        printf '[[sentinels]]\\nid = "rack1"\\nkey_file = "/etc/holdover/rack1.key"\\n' >> /etc/holdover/holdover.toml
        set +e
        # ---- docs/service.md, as written
        {block}
        # ----
        echo "block exit $?"
        {" && ".join(pre)}
        {start} > /var/log/mosquitto/stderr 2>&1 &
        for i in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/1883) 2>/dev/null && break; sleep 0.1; done
        ps -o user:20=,comm= -C mosquitto | sed 's/^/process: /'
        {sys.executable} connect.py /etc/holdover/mosquitto/holdover-bridge.password
        sed 's/^/mosquitto: /' /var/log/mosquitto/stderr /var/log/mosquitto/mosquitto.log 2>/dev/null | tail -20
        """)
    out = in_namespace(script, tmp_path)
    assert "block exit 0" in out, out
    assert re.findall(r"process: (\S+) +(\S+)", out) == [("mosquitto", "mosquitto")], out
    assert "login holdover-bridge: ['Success']" in out, out
    assert "login anonymous: ['Not authorized']" in out, out


def _run_as_a_user_would(block: str, where: Path, timeout: float) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """A doc's block run by bash in `where` with the venv on PATH, inside a cgroup of its own:
    its result, and whatever it started that still runs once it has ended."""
    bin_dir = Path(sys.executable).parent
    env = {"PATH": f"{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(where), "LANG": "C.UTF-8"}
    group = Cgroup()
    try:
        r = subprocess.run(
            group.wrap(["bash", "-c", block]), cwd=where, env=env, capture_output=True, text=True, timeout=timeout
        )
        return r, group.left()
    finally:
        group.close()


@pytest.mark.long
@pytest.mark.skipif(not nut.available(), reason="needs Debian's nut-server (scripts/ensure-system-deps.sh)")
def test_nuts_try_it_here_runs_the_ups_demo_to_its_verdict_and_leaves_nothing(tmp_path: Path) -> None:
    block = the_block("nut.md", "sh", "holdover demo --ups")
    assert block.strip() == "holdover demo --ups"
    r, left = _run_as_a_user_would(block, tmp_path, 150)
    out = r.stdout + r.stderr
    assert left == [], left  # NUT's daemons, the board, the broker and the bridge's children
    assert r.returncode == 0 and out.rstrip().endswith("demo complete"), out
    for check in (
        "ok: the deadline from the UPS's runtime, not a guess",
        "ok: upsmon heard ONBATT",
        "ok: an emergency checkpoint verified",
        "ok: the final command at LB, and FSD to the secondary, which ran its shutdown",
        "ok: power back served as OL",
    ):
        assert check in out, check
    # The time left came from the UPS as it went on battery (420 s), not the guess or the OL reading.
    assert re.search(r"GET /api/outages/now: UPS hostups: 420 s left, not a guess", out), out
    heard = re.search(r"its SHUTDOWNCMD ran \(here it writes a line\); it heard (.*)\n", out)
    assert heard and heard[1].startswith("ONBATT, ") and "FSD" in heard[1].split(", "), out  # LOWBATT too, either side
    assert "/nas.password> secondary" in out, out  # the secondary's password never printed
    assert re.search(r"serves holdover-demo as OL FSD \(FSD held until the bridge restarts", out), out
    stamps = [float(x.split("s ", 1)[0]) for x in out.splitlines() if re.match(r" *\d+\.\d{3}s ", x)]
    assert stamps == sorted(stamps), stamps
    assert list(tmp_path.iterdir()) == [], "the demo left files where it was run"


def _cluster_demo_can_run() -> bool:
    from holdover.lab import demo_cluster

    return demo_cluster.missing() is None


@pytest.mark.long
@pytest.mark.skipif(
    not _cluster_demo_can_run(), reason="needs Debian's Slurm and torch (scripts/ensure-system-deps.sh)"
)
def test_clusters_try_it_here_runs_the_cluster_demo_to_its_verdict_and_leaves_nothing(tmp_path: Path) -> None:
    block = the_block("cluster.md", "sh", "holdover demo --cluster")
    assert block.strip() == "holdover demo --cluster"
    r, left = _run_as_a_user_would(block, tmp_path, 170)
    out = r.stdout + r.stderr
    assert left == [], left  # Slurm's daemons, the job's slurmstepd, srun and ranks, the board, the broker
    assert r.returncode == 0 and out.rstrip().endswith("demo complete"), out
    saved = re.search(r"USR2 to every rank; both saved step (\d+) \(2 nodes\), requeued", out)
    assert saved, out
    step = saved[1]
    for check in (
        "ok: the circuit drained",
        "ok: both ranks saved one step, each on its node's disk",
        "ok: the job requeued",
        "ok: the nodes resumed",
        f"ok: both ranks resumed from step {step}",
        "ok: a link loss: both ranks saved one step without a collective",
    ):
        assert check in out, check
    assert f"rank 0 resumed from step {step}, rank 1 from {step}" in out, out
    assert re.search(r"on n1: 198\.51\.100\.12:6818 silent [\d.]+ s: peer_lost", out), out
    stamps = [float(x.split("s ", 1)[0]) for x in out.splitlines() if re.match(r" *\d+\.\d{3}s ", x)]
    assert stamps == sorted(stamps), stamps
    assert list(tmp_path.iterdir()) == [], "the demo left files where it was run"


@pytest.mark.long
@pytest.mark.skipif(
    not _cluster_demo_can_run(), reason="needs Debian's Slurm and torch (scripts/ensure-system-deps.sh)"
)
def test_ctrl_c_in_the_middle_of_the_cluster_demo_leaves_nothing_running(tmp_path: Path) -> None:
    """Interrupted while the job trains: the job's slurmstepd (deaf to SIGTERM), srun and ranks,
    Slurm's daemons, the bridges and the board all end with it, and it says it was interrupted."""
    import os
    import signal
    import time

    holdover = str(Path(sys.executable).parent / "holdover")
    group = Cgroup()
    try:
        p = subprocess.Popen(
            group.wrap([holdover, "demo", "--cluster"]),
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert p.stdout is not None
        seen = []
        for line in p.stdout:
            seen.append(line)
            if "gloo, the Guard in each; training" in line:
                break
        else:
            raise AssertionError("".join(seen))
        running = group.left()
        assert any("slurmstepd" in x for x in running), running  # the job's steps were up
        t = time.monotonic()
        os.kill(p.pid, signal.SIGINT)
        rest = p.communicate(timeout=60)[0]
        took = time.monotonic() - t
        left = group.left()
    finally:
        group.close()
    out = "".join(seen) + rest
    assert left == [], left
    assert p.returncode != 0 and "Traceback" not in out, out
    assert "interrupted" in out, out
    print(f"Ctrl-C -> everything gone in {took:.1f} s")
