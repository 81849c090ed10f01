"""`holdover demo`: the whole chain on this machine, a scripted power cut, and a timeline."""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from rich.console import Console

from holdover.board.emulator import EmulatorError
from holdover.firmware import protocol
from holdover.journal import Journal
from holdover.lab.broker import BrokerError, free_port
from holdover.lab.rig import Rig, Seen
from holdover.settings import WebSettings

HOOK = 'echo "hook ran: $HOLDOVER_EVENT from $HOLDOVER_SENTINEL, seq $HOLDOVER_SEQ"'
STYLE = {"demo": "bold cyan", "sentinel": "green", "bridge": "yellow", "hook": "magenta", "broker": "blue"}


class Timeline:
    def __init__(self, console: Console) -> None:
        self.console = console
        self.t0 = time.monotonic()

    def say(self, part: str, msg: str, at: float | None = None) -> None:
        t = (at if at is not None else time.monotonic()) - self.t0
        self.console.print(f"[dim]{t:8.3f}s[/] [{STYLE.get(part, 'white')}]{part:<9}[/] {msg}", highlight=False)

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


def _api(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return json.load(r)


def run_demo(debounce_ms: int = 300, hold_s: float = 0.0) -> int:
    console = Console()
    tl = Timeline(console)
    # The timeline already tells what the bridge did; its log lines would only repeat it.
    logging.getLogger("holdover").setLevel(logging.CRITICAL)
    console.rule("holdover demo: a power cut on an emulated sentinel")
    with tempfile.TemporaryDirectory(prefix="holdover-demo-") as tmp:
        rig = Rig(
            Path(tmp),
            debounce_ms=debounce_ms,
            hooks=[{"events": ["mains_lost", "mains_restored"], "run": HOOK, "timeout": 10.0}],
            on_line=tl.line,
            on_seen=tl.seen,
            web=WebSettings(port=free_port()),
        )
        captured: list[bytes] = []
        try:
            tl.say("demo", "starting Mosquitto, the emulated ESP32 (MicroPython, an ESP32's heap) and the bridge")
            rig.start()
            tl.say("broker", f"mosquitto on {rig.broker.host}:{rig.broker.port}")
            assert rig.web is not None
            dashboard = f"http://127.0.0.1:{rig.web.port}/"
            tl.say("bridge", f"dashboard and API on {dashboard} (OpenAPI at {dashboard}docs)")
            rig.wait("boot", timeout=20)
            spy = _attacker(rig)
            spy.on_message = lambda _c, _u, m: captured.append(bytes(m.payload))
            spy.subscribe(protocol.topic(rig.sid, protocol.EVENT), qos=1)
            time.sleep(0.3)

            tl.say("demo", 'cutting mains        -> control port {"mains": false}')
            t = time.monotonic()
            rig.control.send(mains=False)
            rig.wait("hook:mains_lost", since=t)
            done = rig.wait("hook:mains_lost", since=t).at - t
            tl.say("demo", f"mains_lost hook finished {done:.3f}s after the cut (debounce {debounce_ms} ms)")
            [tile] = _api(rig.web.port, "/api/sentinels")
            tl.say("bridge", f"GET /api/sentinels: {tile['sid']} {tile['status']}, mains {tile['mains']}")

            time.sleep(1.0)
            tl.say("demo", 'restoring mains      -> control port {"mains": true}')
            t = time.monotonic()
            rig.control.send(mains=True)
            rig.wait("hook:mains_restored", since=t)

            flicker = max(debounce_ms // 3, 20)
            tl.say("demo", f"a {flicker} ms flicker, shorter than the {debounce_ms} ms debounce: nothing should fire")
            t = time.monotonic()
            rig.control.send(mains=False)
            time.sleep(flicker / 1000)
            rig.control.send(mains=True)
            time.sleep(debounce_ms / 1000 * 3)
            flickered = rig.count("mains_lost", since=t)
            tl.say("demo", f"mains events raised by the flicker: {flickered}")

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
            spy.loop_stop()
            spy.disconnect()
            if hold_s > 0:
                tl.say("demo", f"holding everything up for {hold_s:.0f} s: open {dashboard} (Ctrl-C ends it)")
                with contextlib.suppress(KeyboardInterrupt):
                    time.sleep(hold_s)
        except (BrokerError, EmulatorError, TimeoutError, OSError) as e:
            console.print(f"[bold red]demo failed:[/] {e}")
            rig.close()
            return 1
        assert rig.bridge is not None
        duplicates = rig.bridge.bridge.view(rig.sid).duplicates
        rig.close()
        with Journal(Path(tmp) / "journal.db", readonly=True) as journal:
            events = journal.events(limit=1000)
            rejected = journal.rejections()
            runs = journal.hook_runs()
        console.rule("journal")
        console.print(f"accepted events: {', '.join(e.kind for e in reversed(events))}")
        console.print(f"rejected: {json.dumps([r['reason'] for r in rejected])}")
        console.print(f"copies of journaled events dropped (resends, replays): {duplicates}")
        console.print(f"hook runs: {', '.join(r['outcome'] for r in runs)}")
        ok = (
            flickered == 0
            and len(runs) == 2
            and all(r["outcome"] == "ok" for r in runs)
            and [r["reason"] for r in rejected] == ["bad_signature"]
            and duplicates >= 1
        )
        console.print("[bold green]demo complete[/]" if ok else "[bold red]demo finished with surprises[/]")
        return 0 if ok else 1
