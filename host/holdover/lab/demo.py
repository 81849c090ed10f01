"""`holdover demo`: the whole chain on this machine, a scripted power cut, and a timeline."""

from __future__ import annotations

import contextlib
import heapq
import itertools
import json
import logging
import secrets
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from rich.console import Console

from holdover import proc
from holdover.board.emulator import EmulatorError
from holdover.firmware import protocol
from holdover.journal import Journal
from holdover.lab.broker import BrokerError, free_port
from holdover.lab.controls import LabControls
from holdover.lab.rig import Rig, Seen
from holdover.lab.targets import TcpTarget
from holdover.node.rescue_ledger import RescueLedger
from holdover.settings import WebSettings
from holdover.train import ckpt, registry

HOOK = 'echo "hook ran: $HOLDOVER_EVENT from $HOLDOVER_SENTINEL, seq $HOLDOVER_SEQ"'
STYLE = {
    "demo": "bold cyan",
    "sentinel": "green",
    "bridge": "yellow",
    "hook": "magenta",
    "broker": "blue",
    "alert": "bold red",
    "ups": "bright_blue",
    "upsmon": "cyan",
    "slurm": "bright_magenta",
}


class Timeline:
    """The demo's lines in time order. The board's and the bridge's come from their own threads,
    stamped with when they happened, and may arrive after a later line (a hook's "ok" at 2.162 s
    printed after 2.163 s): each is held HOLD_S and printed in order of its stamp."""

    HOLD_S = 0.25

    def __init__(self, console: Console) -> None:
        self.console = console
        self.t0 = time.monotonic()
        self._lines: list[tuple[float, int, str]] = []  # a heap, by stamp then arrival
        self._n = itertools.count()
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._printer = threading.Thread(target=self._print_due, name="timeline", daemon=True)
        self._printer.start()

    def say(self, part: str, msg: str, at: float | None = None) -> None:
        t = (at if at is not None else time.monotonic()) - self.t0
        text = f"[dim]{t:8.3f}s[/] [{STYLE.get(part, 'white')}]{part:<9}[/] {msg}"
        with self._lock:
            heapq.heappush(self._lines, (t, next(self._n), text))

    def _print_due(self) -> None:
        while not self._done.wait(0.05):
            self._print(time.monotonic() - self.t0 - self.HOLD_S)

    def _print(self, upto: float) -> None:
        with self._lock:
            while self._lines and self._lines[0][0] <= upto:
                self.console.print(heapq.heappop(self._lines)[2], highlight=False)

    def close(self) -> None:
        """Everything said so far printed; before anything printed outside the timeline."""
        self._done.set()
        self._printer.join()
        self._print(float("inf"))

    def line(self, line: str) -> None:
        if line.startswith("# "):
            parts = line[2:].split(" ", 1)
            msg = parts[1] if len(parts) > 1 and parts[0].isdigit() else line[2:]
            self.say("sentinel", msg)

    def seen(self, s: Seen) -> None:
        if s.what.startswith("hook:"):
            out = s.info.get("output", "").strip()
            self.say("hook", f"{s.info['outcome']}: {out}", s.at)
        elif s.what.startswith("rejected:"):
            self.say("bridge", f"[red]rejected[/] ({s.what[9:]}): {s.info['detail']}", s.at)
        elif s.what.startswith("status:"):
            self.say("bridge", f"sentinel is {s.what[7:]}", s.at)
        else:
            self.say("bridge", f"accepted {s.what} (seq {s.info['seq']}), journaled", s.at)


def _attacker(rig: Rig) -> paho.Client:
    c = paho.Client(CallbackAPIVersion.VERSION2, client_id="demo-attacker-" + secrets.token_hex(3))
    c.connect(rig.broker.host, rig.broker.port)
    c.loop_start()
    return c


def api_get(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return json.load(r)


def start_trainee(tmp: Path) -> subprocess.Popen[str]:
    """The stand-in training run, registered in the demo's own registry."""
    cmd = [sys.executable, "-m", "holdover.lab.trainee", "--ckpt", str(tmp / "ckpt"), "--registry", str(tmp / "reg")]
    run = proc.spawn(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + 20
    while not registry.read_registrations(tmp / "reg")[0]:
        if run.poll() is not None or time.monotonic() > deadline:
            raise TimeoutError("the demo's training run did not register")
        time.sleep(0.05)
    return run


def verified(journal: Path, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with Journal(journal, readonly=True) as j:
            done = [s for s in RescueLedger(j).steps() if s["action"] == "verified"]
        if done:
            return done[0]
        time.sleep(0.1)
    raise TimeoutError("no verified emergency checkpoint")


def until(what: str, test: Callable[[], Any], timeout: float, every: float = 0.1) -> Any:
    """test()'s first true answer, polled every `every` s; TimeoutError naming `what` (the demo's
    failure line, a bench's) after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = test()
        if got:
            return got
        time.sleep(every)
    raise TimeoutError(what)


def verdict(console: Console, checks: dict[str, bool], listed: bool = True) -> int:
    """The scripted story judged: each check (listed), then complete, or the ones that failed."""
    failed = [name for name, good in checks.items() if not good]
    if listed:
        for name, good in checks.items():
            console.print(f"{'ok' if good else 'NOT'}: {name}")
    if not failed:
        console.print("[bold green]demo complete[/]")
        return 0
    console.print("[bold red]demo finished with surprises:[/] not as expected: " + "; ".join(failed))
    return 1


def headings(console: Console) -> Callable[[str], None]:
    def heading(title: str) -> None:  # a rule fills a terminal's width; in a pipe it would cut the title
        console.rule(title) if console.is_terminal else console.print(f"== {title} ==")

    return heading


def run_demo(debounce_ms: int = 300, hold_s: float = 0.0) -> int:
    # A line is never folded: piped or in a log, rich would cut every line at 80 columns (the
    # title, and the command to cut the mains by hand, came out in pieces).
    console = Console(soft_wrap=True)
    tl = Timeline(console)
    # The timeline already tells what the bridge did; its log lines would only repeat it.
    logging.getLogger("holdover").setLevel(logging.CRITICAL)

    heading = headings(console)
    heading("holdover demo: a power cut, an uplink loss and a forged event on an emulated sentinel")
    with tempfile.TemporaryDirectory(prefix="holdover-demo-") as tmp:
        targets = [TcpTarget(), TcpTarget()]  # the "internet", on loopback
        rig = Rig(
            Path(tmp),
            debounce_ms=debounce_ms,
            hooks=[{"events": ["mains_lost", "mains_restored"], "run": HOOK, "timeout": 10.0}],
            protect={"registry": str(Path(tmp) / "reg"), "rescue_dir": str(Path(tmp) / "rescue"), "grace": 1.0},
            firmware={
                "uplink": {"targets": [{"kind": "tcp", "host": "127.0.0.1", "port": t.port} for t in targets]},
                "battery": {"pin": 34, "load_w": 28.0},
            },
            on_line=tl.line,
            on_seen=tl.seen,
            web=WebSettings(port=free_port()),
        )
        captured: list[bytes] = []
        alerts: list[str] = []
        run = None
        try:
            run = start_trainee(Path(tmp))
            tl.say("demo", f"a training run (16 MB of weights, protected by holdover.train) is up: pid {run.pid}")
            tl.say("demo", "starting Mosquitto, the emulated ESP32 (MicroPython, an ESP32's heap) and the bridge")
            rig.start()
            tl.say("broker", f"mosquitto on {rig.broker.host}:{rig.broker.port}")
            assert rig.web is not None
            dashboard = f"http://127.0.0.1:{rig.web.port}/"
            tl.say("bridge", f"dashboard and API on {dashboard} (OpenAPI at {dashboard}docs)")
            rig.wait("boot", timeout=20)
            spy = _attacker(rig)
            spy.on_message = lambda _c, _u, m: (
                captured.append(bytes(m.payload))
                if m.topic != protocol.ALERTS
                else (alerts.append(m.payload.decode()), tl.say("alert", m.payload.decode().split("\n")[0]))
            )
            spy.subscribe([(protocol.topic(rig.sid, protocol.EVENT), 1), (protocol.ALERTS, 1)])
            time.sleep(0.3)

            tl.say("demo", 'cutting mains        -> control port {"mains": false}')
            t = time.monotonic()
            rig.control.send(mains=False)
            done = rig.wait("hook:mains_lost", since=t).at - t
            tl.say("demo", f"mains_lost hook finished {done:.3f}s after the cut (debounce {debounce_ms} ms)")
            [tile] = api_get(rig.web.port, "/api/sentinels")
            tl.say("bridge", f"GET /api/sentinels: {tile['sid']} {tile['status']}, mains {tile['mains']}")
            tl.say("demo", "after the 1 s grace, the bridge asks the run for an emergency checkpoint")
            v = verified(rig.dir / "journal.db", 30)["detail"]
            tl.say(
                "bridge",
                f"emergency checkpoint verified: step {v['step']}, {v['bytes'] / 1e6:.1f} MB at {v['mb_s']:.0f} MB/s, "
                f"{'pinned' if ckpt.pinned(v['dir']) else 'NOT pinned'}: {v['dir']}",
            )

            time.sleep(0.5)
            tl.say("demo", 'restoring mains      -> control port {"mains": true}')
            t = time.monotonic()
            rig.control.send(mains=True)
            rig.wait("hook:mains_restored", since=t)

            tl.say("demo", "the uplink dies: both probe targets stop answering")
            t = time.monotonic()
            for target in targets:
                target.stop()
            lost = rig.wait("uplink_lost", timeout=10, since=t).at - t
            tl.say("demo", f"uplink_lost {lost:.2f}s after the cut, over MQTT on the LAN")
            for target in targets:
                target.start()
            rig.wait("uplink_restored", timeout=10, since=time.monotonic())

            flicker = max(debounce_ms // 3, 20)
            tl.say("demo", f"a {flicker} ms flicker, under the {debounce_ms} ms debounce: a suspicion, a dip, no cut")
            t = time.monotonic()
            # A gap in the emulated mains of exactly that long on the board's own clock: two
            # control messages a sleep apart made it 100 ms plus their round trips (147 measured).
            rig.control.send(dip_ms=flicker)
            time.sleep(debounce_ms / 1000 * 3)
            kinds = (protocol.MAINS_SUSPECT, protocol.MAINS_DIP, protocol.MAINS_LOST)
            flickered = tuple(rig.count(k, since=t) for k in kinds)
            said = ", ".join(f"{n} {k}" for n, k in zip(flickered, kinds, strict=True))
            dips = [s.info["data"]["dip_ms"] for s in list(rig.seen) if s.what == protocol.MAINS_DIP and s.at >= t]
            measured = f" (the dip measured {dips[0]} ms)" if dips else ""
            tl.say("demo", f"the flicker raised {said}{measured}")

            tl.say("demo", "publishing a mains_lost forged with the wrong key")
            forged = protocol.encode(
                protocol.Signer(secrets.token_bytes(16)), rig.sid, "f0f0f0f0", 1, 0, None, protocol.MAINS_LOST, {}
            )
            spy.publish(protocol.topic(rig.sid, protocol.EVENT), forged, qos=1)
            rig.wait("rejected:bad_signature")
            genuine = next(p for p in captured if b'"mains_lost"' in p)
            tl.say("demo", "replaying the genuine mains_lost captured off the broker")
            spy.publish(protocol.topic(rig.sid, protocol.EVENT), genuine, qos=1)
            # Known by (boot, seq) from the journal: receipted again, journaled and hooked never twice.
            rig.wait("rejected:duplicate")
            time.sleep(0.3)  # the last alerts' MQTT copies
            spy.loop_stop()
            spy.disconnect()
            scripted = time.time()  # what is checked below ends here: cuts made by hand during --hold are the user's
            if hold_s > 0:
                hold(tl, rig, targets, dashboard, hold_s)
        except (BrokerError, EmulatorError, TimeoutError, OSError) as e:
            tl.close()
            console.print(f"[bold red]demo failed:[/] {e}")
            rig.close()
            return 1
        finally:
            if run is not None:
                proc.stop(run, grace=10)
            for target in targets:
                target.stop()
        assert rig.bridge is not None
        duplicates = rig.bridge.bridge.view(rig.sid).duplicates
        rig.close()
        with Journal(Path(tmp) / "journal.db", readonly=True) as journal:
            events = journal.events(limit=1000)
            rejected = journal.rejections()
            runs = journal.hook_runs()
            rescues = RescueLedger(journal).rescues()
        tl.close()
        heading("journal")
        console.print(f"accepted events: {', '.join(e.kind for e in reversed(events))}")
        console.print(f"rejected: {json.dumps([r['reason'] for r in rejected])}")
        console.print(f"copies of journaled events dropped (resends, replays): {duplicates}")
        console.print(f"hook runs: {', '.join(r['outcome'] for r in runs)}")
        console.print(f"emergency checkpoints: {', '.join(r['state'] for r in rescues)}")
        console.print(f"alerts (on MQTT holdover/alerts; phones get them through apprise): {len(alerts)}")
        runs = [r for r in runs if r["started"] <= scripted]
        rescues = [r for r in rescues if r["started"] <= scripted]
        checks = {
            f"the {flicker} ms flicker raised a mains_suspect and a mains_dip of its length (±15 ms), no mains_lost": (
                flickered == (1, 1, 0) and len(dips) == 1 and abs(dips[0] - flicker) <= 15
            ),
            "two hook runs (mains_lost, mains_restored), both ok": len(runs) == 2
            and all(r["outcome"] == "ok" for r in runs),
            "the forged event refused as bad_signature": [r["reason"] for r in rejected if r["rx_ts"] <= scripted]
            == ["bad_signature"],
            "the replay dropped as a copy": duplicates >= 1,
            "one emergency checkpoint, finished": [r["state"] for r in rescues] == ["finished"],
            "at least 4 alerts on MQTT": len(alerts) >= 4,
        }
        return verdict(console, checks, listed=False)


def hold(tl: Timeline, rig: Rig, targets: list[TcpTarget], dashboard: str, hold_s: float) -> None:
    """Everything kept up for a person to play with, through the demo's own control port; what
    they do is on the timeline and outside the verdict."""
    controls = LabControls(rig.control, targets, lambda said: tl.say("demo", said))
    me = sys.argv[0] if Path(sys.argv[0]).name == "holdover" else "holdover"
    try:
        tl.say("demo", f"holding everything up for {hold_s:.0f} s: open {dashboard} (Ctrl-C ends it)")
        tl.say("demo", "play with it from another shell (what you do is on this timeline, outside the verdict):")
        for cmd, what in (
            ("mains off", "a power cut (mains on: power back)"),
            ("flicker 100", "a 100 ms flicker: a suspicion and a dip, no cut"),
            *([("uplink down", "the internet beyond the LAN gone (uplink up: back)")] if targets else []),
            ("wifi off", "the sentinel's WiFi gone: MQTT silent, serial still speaks (wifi on: back)"),
        ):
            tl.say("demo", f"  {me} lab {cmd} --port {controls.port}    # {what}")
        with contextlib.suppress(KeyboardInterrupt):
            time.sleep(hold_s)
    finally:
        controls.close()
