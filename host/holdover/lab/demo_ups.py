"""`holdover demo --ups`: the host's UPS through NUT, and a NUT client following the sentinel.

Debian's own NUT, as its packages run it (lab/nut.py: upsd and dummy-ups dropping to `nut`): one
upsd serves the host's UPS (dummy-ups reading a file this demo writes, as a real driver reads the
UPS), the bridge reads it as `[ups] nut` says; a second upsd serves the sentinel as a UPS from the
files the bridge keeps (`[nut_server]`, its config as `holdover nut-config` writes it), and a real
upsmon secondary follows it as any other machine in the lab would. Its SHUTDOWNCMD and holdover's
final command only write a line here.
"""

from __future__ import annotations

import contextlib
import grp
import logging
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from holdover import proc
from holdover.bridge import nut_config
from holdover.errors import HoldoverError
from holdover.lab import nut
from holdover.lab.broker import BrokerError, free_port
from holdover.lab.demo import Timeline, api_get, headings, hold, start_trainee, until, verdict, verified
from holdover.lab.rig import Rig
from holdover.settings import NutServerSettings, WebSettings

ONLINE = {"ups.status": "OL", "battery.charge": "100", "battery.runtime": "900", "ups.load": "30"}
CLIENT = "nas"  # the machine that follows the sentinel, as a lab names it in [nut_server] clients


def missing() -> str | None:
    """What this machine lacks for the UPS demo, in words, or None."""
    if not nut.available() or not (nut.NUT_BIN / "upsmon").exists():
        return (
            "the UPS demo runs Debian's own NUT: sudo apt-get install nut-server nut-client "
            "(their services need not run: the demo starts its own on loopback)"
        )
    try:
        grp.getgrnam("nut")
    except KeyError:
        return "the UPS demo runs NUT as its packaged user `nut`, and there is none: reinstall nut-server"
    return None


def run_ups_demo(hold_s: float = 0.0) -> int:
    console = Console(soft_wrap=True)
    heading = headings(console)
    logging.getLogger("holdover").setLevel(logging.CRITICAL)
    lacking = missing()
    if lacking:
        console.print(f"[bold red]demo --ups cannot run here:[/] {lacking}")
        return 2
    tl = Timeline(console)
    heading("holdover demo --ups: the host's UPS through NUT, and a NUT client following the sentinel")
    checks: dict[str, bool] = {}
    with tempfile.TemporaryDirectory(prefix="holdover-demo-") as tmp_s:
        tmp = Path(tmp_s)
        # Where NUT's daemons read and write: root:nut, as Debian lays out /etc/nut and /run/nut;
        # the demo's own directory is root's, which `nut` cannot enter.
        served = nut.nut_dir("holdover-demo-served-", nut_writes=True)
        conf = nut.nut_dir("holdover-demo-nutconf-")
        final = served / "final-command-ran"
        serve_port = free_port()
        host_ups = nut.NutServer(tmp / "host-nut", {"hostups": ONLINE})
        rig: Rig | None = None
        run: subprocess.Popen[str] | None = None
        follower: nut.NutServer | None = None
        mon: nut.Upsmon | None = None
        try:
            host_ups.start()
            tl.say(
                "ups",
                f"the host's UPS: NUT's upsd and dummy-ups (as nut) serve hostups@127.0.0.1:{host_ups.port}: "
                "OL, 100 %, 15 min left at 30 % load",
            )
            run = start_trainee(tmp)
            tl.say("demo", f"a training run (16 MB of weights, protected by holdover.train) is up: pid {run.pid}")
            nut_server = {"serve": True, "dir": str(served), "listen": "127.0.0.1", "port": serve_port}
            rig = Rig(
                tmp,
                protect={
                    "registry": str(tmp / "reg"),
                    "rescue_dir": str(tmp / "rescue"),
                    "grace": 1.0,
                    "final_command": f"echo ran > {final}",
                },
                bridge_extra={
                    "ups": {"nut": f"hostups@127.0.0.1:{host_ups.port}", "poll_s": 0.5},
                    "nut_server": {**nut_server, "clients": [CLIENT]},
                },
                on_line=tl.line,
                on_seen=tl.seen,
                web=WebSettings(port=free_port()),
            )
            rig.start()
            dashboard = f"http://127.0.0.1:{rig.web.port}/" if rig.web else ""
            tl.say("bridge", f"reads the host's UPS through upsd; dashboard and API on {dashboard}")
            rig.wait("boot", timeout=20)

            # NUT's config for serving the sentinel, as `holdover nut-config` writes it.
            s = NutServerSettings.model_validate({**nut_server, "clients": [CLIENT]})
            written = nut_config.write(s, [rig.sid], conf)
            monitor = nut_config.monitor_line(s, rig.sid, CLIENT, written.passwords[CLIENT], "127.0.0.1")
            ups = f"{s.prefix}{rig.sid}"
            until("the bridge's served file", lambda: (served / f"{ups}.dev").exists(), 15)
            follower = nut.NutServer(tmp / "served-nut", {ups: {}}, port=serve_port, confdir=conf).start()
            mon = nut.Upsmon(tmp / "upsmon", monitor).start()
            tl.say(
                "bridge",
                f"serves the sentinel as a UPS, {ups}@127.0.0.1:{serve_port}, through NUT's own upsd: "
                f"{follower.read(ups).get('ups.status')}",
            )
            shown = monitor.replace(written.passwords[CLIENT], f"<{conf / (CLIENT + '.password')}>")
            tl.say("upsmon", f"a NUT secondary ({CLIENT}, as nut) follows it: {shown}")
            time.sleep(2)  # its first poll: OL, nothing to say

            tl.say("demo", "cutting mains: the sentinel sees it, and the host UPS goes on battery (7 min left)")
            t = time.monotonic()
            rig.control.send(mains=False)
            host_ups.set("hostups", ups_status="OB DISCHRG", battery_charge="85", battery_runtime="420")
            rig.wait("mains_lost", since=t)
            port = rig.web.port if rig.web else 0

            def read_left() -> dict[str, Any] | None:
                if not api_get(port, "/api/ups").get("on_battery"):
                    return None  # the bridge polls the UPS every 0.5 s
                left = api_get(port, "/api/outages/now").get("time_left") or {}
                return left if left.get("runtime_s") and not left.get("guess") else None

            left = until("the banner's time left, from the UPS", read_left, 10)
            checks["the deadline from the UPS's runtime, not a guess"] = True
            tl.say("bridge", f"GET /api/outages/now: {left['from']}, not a guess (the dashboard counts it down)")
            until("ONBATT at upsmon", lambda: "ONBATT" in [k for _t, k in mon.said()], 15)
            tl.say("upsmon", "ONBATT: its NOTIFYCMD ran")
            checks["upsmon heard ONBATT"] = True
            v = verified(rig.dir / "journal.db", 30)["detail"]
            tl.say(
                "bridge",
                f"emergency checkpoint verified: step {v['step']}, {v['mb_s']:.0f} MB/s, inside the UPS's time",
            )
            checks["an emergency checkpoint verified"] = True

            tl.say("demo", "the host UPS runs low: LB, 50 s left")
            host_ups.set("hostups", ups_status="OB DISCHRG LB", battery_charge="8", battery_runtime="50")
            until("holdover's final command", final.exists, 20)
            tl.say(
                "bridge",
                "the host's UPS is low: holdover's final command ran (here it writes a line; a site's shuts down)",
            )
            until("FSD at upsmon", lambda: mon.shutdown.exists(), 20)
            # upsmon runs its NOTIFYCMD for FSD in a child of its own, which may write its line after
            # the SHUTDOWNCMD has run: a slow machine showed the shutdown with no FSD heard yet.
            with contextlib.suppress(TimeoutError):
                until("FSD heard by upsmon", lambda: "FSD" in [k for _t, k in mon.said()], 5)
            said = [k for _t, k in mon.said()]
            tl.say(
                "upsmon",
                f"FSD: its SHUTDOWNCMD ran (here it writes a line); it heard {', '.join(said)}",
            )
            checks["the final command at LB, and FSD to the secondary, which ran its shutdown"] = "FSD" in said

            tl.say("demo", "power back: mains on, the host UPS on line")
            t = time.monotonic()
            rig.control.send(mains=True)
            host_ups.set("hostups", **{k.replace(".", "_"): v for k, v in ONLINE.items()})
            rig.wait("mains_restored", since=t)
            # On line from the sentinel, and not low once the bridge has polled the UPS again.
            served_status = lambda: follower.read(ups).get("ups.status", "")  # noqa: E731
            until("OL served", lambda: served_status() in ("OL", "OL FSD"), 15)
            status = served_status()
            # FSD stays, as NUT's primary holds it until it powers off: the bridge that ran the final
            # command is meant to go down with its host, and a secondary booting meanwhile must not
            # take a dying site for a healthy one.
            held = " (FSD held until the bridge restarts, as NUT's primary holds it until it powers off)"
            tl.say("bridge", f"serves {ups} as {status}{held if 'FSD' in status else ''}")
            checks["power back served as OL"] = status.startswith("OL")
            if hold_s > 0:
                hold(tl, rig, [], dashboard, hold_s)
        except (BrokerError, HoldoverError, TimeoutError, OSError) as e:
            tl.close()
            console.print(f"[bold red]demo failed:[/] {e}")
            return 1
        finally:
            if run is not None:
                proc.stop(run, grace=10)
            for daemon in (mon, follower):
                if daemon is not None:
                    daemon.stop()
            if rig is not None:
                rig.close()
            host_ups.stop()
            shutil.rmtree(served, ignore_errors=True)
            shutil.rmtree(conf, ignore_errors=True)
    tl.close()
    heading("verdict")
    return verdict(console, checks)
