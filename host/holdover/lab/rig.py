"""The whole chain on one machine: private Mosquitto, emulated sentinel, bridge.

Used by `holdover demo`, the end-to-end tests and the benchmarks, so all three exercise
exactly the same wiring. Everything binds to loopback.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from holdover import settings as settings_mod
from holdover.board.emulator import DEFAULT_HEAP, Control, Emulator, EmulatorError
from holdover.bridge import Bridge, BridgeThread
from holdover.bridge.gate import Verdict
from holdover.lab.broker import Broker, free_port
from holdover.settings import WebSettings
from holdover.web.server import serving


@dataclass
class Seen:
    at: float  # time.monotonic()
    what: str  # event kind, rejection reason, or "hook:<kind>"
    info: dict[str, Any] = field(default_factory=dict)


class Rig:
    def __init__(
        self,
        workdir: Path,
        sid: str = "demo",
        debounce_ms: int = 300,
        mode: str = "pulse",
        keepalive_s: int = 5,
        heartbeat_s: int = 30,
        heap: str = DEFAULT_HEAP,
        hooks: list[dict[str, Any]] | None = None,
        protect: dict[str, Any] | None = None,
        firmware: dict[str, Any] | None = None,
        serial: bool = False,
        reset_cause: str = "power_on",
        ticks_start: int = 0,
        counter: bool = True,
        world: dict[str, Any] | None = None,
        on_line: Callable[[str], None] | None = None,
        on_seen: Callable[[Seen], None] | None = None,
        web: WebSettings | None = None,
        broker_auth: str = "",
        bridge_mqtt: dict[str, Any] | None = None,
        bridge_extra: dict[str, Any] | None = None,
    ) -> None:
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.sid = sid
        self.key = secrets.token_hex(16)
        self.debounce_ms = debounce_ms
        self.mode = mode
        self.keepalive_s = keepalive_s
        self.heartbeat_s = heartbeat_s
        self.heap = heap
        self.hooks = hooks or []
        self.protect = protect
        self.reset_cause = reset_cause
        self.ticks_start = ticks_start
        self.counter = counter  # False: the emulated port has no machine.Counter
        self.world = world or {}  # the emulated world as the board first finds it ({"hz": 60})
        self.firmware_extra = firmware or {}  # sections merged over the defaults below
        self.serial_addr = ("127.0.0.1", free_port()) if serial else None
        self.on_line = on_line or (lambda line: None)
        self.on_seen = on_seen or (lambda s: None)
        self.web = web  # the API and dashboard served on the bridge's loop, as `holdover bridge` does
        self.seen: list[Seen] = []
        self._cv = threading.Condition()
        self.broker = Broker(workdir=self.dir / "broker", auth=broker_auth)  # auth: broker_config's lines
        self.bridge_mqtt = bridge_mqtt or {}  # merged over the bridge's [mqtt]: its user and password
        self.bridge_extra = bridge_extra or {}  # more sections of the bridge's config ([alerts], [dongle])
        self.control_addr = ("127.0.0.1", free_port())
        self.emulator: Emulator | None = None
        self.bridge: BridgeThread | None = None
        self.control = Control(*self.control_addr)
        self.lines: list[str] = []

    # --- configuration, as a user would write it -----------------------------------------

    def firmware_config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            "sentinel_id": self.sid,
            "key": self.key,
            "wlan": {"ssid": "emulated-ap"},
            "mqtt": {"host": self.broker.host, "port": self.broker.port, "keepalive_s": self.keepalive_s},
            "mains": {"pin": 27, "mode": self.mode, "active_low": True, "debounce_ms": self.debounce_ms},
            "heartbeat_s": self.heartbeat_s,
        }
        for k, v in self.firmware_extra.items():
            cfg[k] = {**cfg[k], **v} if isinstance(v, dict) and isinstance(cfg.get(k), dict) else v
        return cfg

    def bridge_config(self) -> dict[str, Any]:
        return {
            "mqtt": {
                "host": self.broker.host,
                "port": self.broker.port,
                "client_id": f"holdover-bridge-{self.sid}",
                **self.bridge_mqtt,
            },
            "journal": {"path": str(self.dir / "journal.db")},
            "sentinels": [{"id": self.sid, "key": self.key}],
            "serial": [{"url": self.serial_url}] if self.serial_addr else [],
            "hooks": self.hooks,
            **({"protect": self.protect} if self.protect is not None else {}),
            **self.bridge_extra,
        }

    @property
    def serial_url(self) -> str:
        assert self.serial_addr is not None
        return f"socket://{self.serial_addr[0]}:{self.serial_addr[1]}"

    def write_configs(self) -> tuple[Path, Path]:
        fw = self.dir / "config.json"
        fw.write_text(json.dumps(self.firmware_config(), indent=2))
        br = self.dir / "holdover.toml"
        br.write_text(tomli_w.dumps(self.bridge_config()))
        return fw, br

    # --- parts -----------------------------------------------------------------------------

    def start(self, bridge: bool = True, emulator: bool = True) -> Rig:
        """Broker first, then the bridge, then the sentinel, so the bridge hears the boot event."""
        self.broker.start()
        _fw, br = self.write_configs()
        if bridge:
            self.start_bridge(settings_mod.load(br))
        if emulator:
            self.start_emulator()
        return self

    def start_emulator(self) -> None:
        fw = self.dir / "config.json"
        if self.world:
            (self.dir / "board").mkdir(exist_ok=True)
            world = {"mains": True, "battery_v": 4.1, "wlan": True, **self.world}
            (self.dir / "board" / "world.json").write_text(json.dumps(world))
        for attempt in range(3):
            try:
                self._boot(fw)
                return
            except EmulatorError:
                # free_port() freed the port it found; under a parallel test run another process
                # may take it before the board binds it. Only that is retried, on a fresh port.
                if attempt == 2 or not any("in use by another process" in line for line in self.lines[-8:]):
                    raise
                assert self.emulator is not None
                self.emulator.stop()
                self.control.close()
                self.control_addr = ("127.0.0.1", free_port())
                self.control = Control(*self.control_addr)

    def _boot(self, fw: Path) -> None:
        self.emulator = Emulator(
            fw,
            self.control_addr,
            heap=self.heap,
            state_dir=self.dir / "board",
            on_line=self._line,
            serial=self.serial_addr,
            reset_cause=self.reset_cause,
            ticks_start=self.ticks_start,
            counter=self.counter,
        )
        running = self.emulator.start_thread()
        try:
            self.control.connect(alive=running.is_alive)
        except EmulatorError as e:
            # What the board said last: why it never listened (or is still booting).
            raise EmulatorError(f"{e}; its last lines: {self.lines[-8:]}") from None

    def start_bridge(self, cfg: settings_mod.Settings) -> None:
        b = Bridge(cfg, on_verdict=self._verdict, on_hook=self._hook)
        web = self.web
        self.bridge = BridgeThread(b, (lambda running: serving(running, web)) if web else None).start()

    def close(self) -> None:
        self.control.close()
        if self.emulator:
            self.emulator.stop()
        if self.bridge:
            self.bridge.stop()
        self.broker.close()

    def __enter__(self) -> Rig:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- what happened -----------------------------------------------------------------------

    def _add(self, s: Seen) -> None:
        with self._cv:
            self.seen.append(s)
            self._cv.notify_all()
        self.on_seen(s)

    def _line(self, line: str) -> None:
        self.lines.append(line)
        self.on_line(line)

    def _verdict(self, v: Verdict) -> None:
        now = time.monotonic()
        if v.event is not None:
            info = {
                "seq": v.event.seq,
                "ms": v.event.ms,
                "data": v.event.data,
                "boot": v.event.boot,
                "source": v.event.source,
            }
            self._add(Seen(now, v.event.kind, info))
        elif v.ack is not None:
            self._add(Seen(now, "ack", v.ack["data"]))
        elif not v.accepted:
            self._add(Seen(now, f"rejected:{v.reason}", {"detail": v.detail}))
        elif v.status is not None:
            self._add(Seen(now, f"status:{v.status}"))

    def _hook(self, info: dict[str, Any]) -> None:
        self._add(Seen(time.monotonic(), f"hook:{info['event']}", info))

    def board_state(self) -> dict[str, Any]:
        """The firmware's own state (its watchers' readings and counters), asked on the control port."""
        return self.control.send(get="state")["state"]

    def wait_board(self, ok: Callable[[dict[str, Any]], bool], timeout: float, what: str) -> dict[str, Any]:
        """The board's state once `ok` holds for it; TimeoutError naming `what` and the last state."""
        deadline = time.monotonic() + timeout
        while True:
            st = self.board_state()
            if ok(st):
                return st
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within {timeout}s; the board's state: {st}")
            time.sleep(0.05)

    def learned_hz(self, hz: int | str, timeout: float = 15.0) -> dict[str, Any]:
        """Waits until the mains watch has learned the line's frequency (what a cut is timed against)."""
        return self.wait_board(lambda st: st["mains_hz"] == hz, timeout, f"the line learned as {hz} Hz")

    def count(self, what: str, since: float = 0.0) -> int:
        with self._cv:
            return sum(1 for s in self.seen if s.what == what and s.at >= since)

    def wait(self, what: str, timeout: float = 10.0, since: float = 0.0) -> Seen:
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                for s in self.seen:
                    if s.what == what and s.at >= since:
                        return s
                left = deadline - time.monotonic()
                if left <= 0:
                    # What the board said last: "saw []" alone (seen twice under the full suite, its
                    # control port up, never on the broker) cannot tell a board stuck joining the
                    # network from one that never booted.
                    said = [line[:200] for line in self.lines[-8:]]
                    raise TimeoutError(
                        f"no {what!r} within {timeout}s; saw {[x.what for x in self.seen[-10:]]}; "
                        f"the board's last lines: {said}"
                    )
                self._cv.wait(left)
