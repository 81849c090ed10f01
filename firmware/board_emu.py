# Emulated board for the MicroPython unix port: the same interface as board_esp32.
#
# It stands in for the physical world too: mains presence (a level, or a 50 Hz edge
# train delivered to the pin's IRQ handler, as an AC optocoupler gives), the battery
# voltage, and the WLAN. A control port takes newline-delimited JSON to change them.
# Cutting the WLAN silences every open connection without closing it, as a dead radio
# does, so the firmware's keepalive and the broker's last will are what notice.
import asyncio
import gc
import json
import os
import sys
import time
from random import getrandbits

import line

EXIT_CONFIG = 2
EXIT_RESET = 42
EXIT_WDT = 43
EHOSTUNREACH = 113
ETIMEDOUT = 110
HALF_CYCLE_MS = 10  # 50 Hz mains: the opto output falls once per half-cycle
# The ESP32's ticks_ms wraps at 2^30 ms (~12.4 days; ticks_diff is valid within +-2^29), the
# unix port's only at 2^62: the board's clock wraps like the chip's, and can start near the wrap.
TICKS_PERIOD = 1 << 30
_TICKS_HALF = TICKS_PERIOD >> 1
CONTROL_LINE_MAX = 512  # bytes; the longest legitimate control command is ~40
SERIAL_BACKLOG = 64  # lines waiting for a slow serial reader; older ones go, as a UART's FIFO overflows


def _usage(msg):
    print("# emu: " + msg)
    print("# usage: emu_main.py --config FILE --control HOST:PORT --state DIR")
    print("#        [--serial HOST:PORT] [--reset-cause CAUSE] [--ticks-start MS]")
    sys.exit(EXIT_CONFIG)


def _split_hostport(v):
    i = v.rfind(":")
    if i <= 0:
        _usage("bad HOST:PORT %r" % v)
    return v[:i], int(v[i + 1 :])


def _write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps(obj))
    os.rename(tmp, path)


def _read_json(path, default):
    try:
        with open(path) as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return default


class _Input:
    def __init__(self, level):
        self.level = level
        self.handler = None

    def value(self):
        return self.level

    def irq(self, handler):
        self.handler = handler


class _Output:
    def __init__(self, value):
        self.level = value

    def value(self, v=None):
        if v is None:
            return self.level
        self.level = 1 if v else 0


class _ADC:
    # The battery sense pin sits behind the 100k/100k divider of hardware/README.md.
    DIVIDER = 2.0

    def __init__(self, board):
        self.board = board

    def read_uv(self):
        # The ESP32's ADC is noisy (tens of mV a reading); "adc_noise_v" puts that much on each.
        v = self.board.world["battery_v"]
        noise = self.board.world.get("adc_noise_v") or 0
        if noise:
            v += noise * (getrandbits(16) / 32767.5 - 1)
        return max(0, int(v / self.DIVIDER * 1000000))


class _Relay:
    """The relay driver pin; the coil's state is part of the world, so tests can see it."""

    def __init__(self, board, active_low):
        self.board = board
        self.active_low = active_low
        self.value(0)

    def value(self, v=None):
        if v is None:
            return 1 if self.board.world.get("relay") else 0
        # The pin level a real driver would see, recorded beside the coil state.
        self.board.world["relay_pin"] = (0 if v else 1) if self.active_low else (1 if v else 0)
        self.board._set("relay", bool(v))


class _Led:
    """The status LED: its level and the times it last changed, for a test to read the blink."""

    def __init__(self, board):
        self.board = board
        self.on = False
        self.changes = []  # ticks of the last few switches on

    def value(self, v):
        on = bool(v)
        if on and not self.on:
            self.changes = self.changes[-7:] + [self.board.ticks_ms()]
        self.on = on


class _WDT:
    def __init__(self, board, timeout_ms):
        self.board = board
        self.timeout = timeout_ms
        self.fed = time.ticks_ms()

    def feed(self):
        self.fed = time.ticks_ms()


class _Link:
    """A real TCP stream that goes silent, not closed, when the emulated radio drops."""

    def __init__(self, board, stream):
        self.board = board
        self.s = stream
        self.cut = False
        self._dead = asyncio.Event()

    async def readexactly(self, n):
        data = await self.s.readexactly(n)
        if self.cut:
            await self._dead.wait()
            raise OSError(ETIMEDOUT)
        return data

    def write(self, data):
        if not self.cut:
            self.s.write(data)

    async def drain(self):
        if not self.cut:
            await self.s.drain()

    def close(self):
        self._dead.set()
        if self in self.board._links:
            self.board._links.remove(self)

    async def wait_closed(self):
        if self.cut:
            # A dead radio sends no FIN: the broker must find out by keepalive, as with a
            # real board. The socket is really closed once the emulated WLAN is back.
            self.board._zombies.append(self.s)
        else:
            self.s.close()
            await self.s.wait_closed()


class _WLAN:
    """network.WLAN(STA_IF) as the esp32 port drives it, with the access point as part of the world.

    Faithful where it hurts (ports/esp32/network_wlan.c): connect() sets "connect requested"
    and the driver then reconnects by itself after every drop; a connect() while it is
    connecting raises OSError("Wifi Internal Error"); status() gives the port's codes.
    """

    IDLE, CONNECTING, GOT_IP = 1000, 1001, 1010
    BEACON_TIMEOUT, NO_AP_FOUND = 200, 201
    JOIN_MS = 300  # association and DHCP, when the AP is there
    SCAN_MS = 1500  # one failed attempt, when it is not

    def __init__(self, board):
        self.board = board
        self._active = False
        self._requested = False
        self._status = self.IDLE
        self._t = 0
        self.internal_errors = 0

    def active(self, v=None):
        if v is None:
            return self._active
        self._active = bool(v)
        if not v:
            self._requested = False
            self._status = self.IDLE

    def connect(self, ssid=None, key=None):
        if not self._active:
            raise OSError("Wifi Not Started")
        if self._status == self.CONNECTING:
            # What ESP-IDF answers ("sta is connecting, return error"), as the port raises it.
            self.internal_errors += 1
            raise OSError("Wifi Internal Error")
        self._requested = True
        self._status = self.CONNECTING
        self._t = time.ticks_ms()

    def disconnect(self):
        self._requested = False
        self._status = self.IDLE

    def isconnected(self):
        return self._status == self.GOT_IP

    def status(self):
        return self._status

    def ifconfig(self):
        return ("127.0.0.1", "255.0.0.0", "127.0.0.1", "127.0.0.1")

    def tick(self, now):
        """The driver's event handler, run by the board's radio task."""
        ap = self.board.world["wlan"]
        st = self._status
        if st == self.GOT_IP and not ap:
            self._status = self.BEACON_TIMEOUT
            st = self._status
            self._t = now
        if st in (self.BEACON_TIMEOUT, self.NO_AP_FOUND) and self._requested:
            # STA_DISCONNECTED: the port calls esp_wifi_connect() again at once.
            self._status = self.CONNECTING
            self._t = now
        elif st == self.CONNECTING:
            took = time.ticks_diff(now, self._t)
            if ap and took >= self.JOIN_MS:
                self._status = self.GOT_IP
            elif not ap and took >= self.SCAN_MS:
                self._status = self.NO_AP_FOUND
                self._t = now


class Board:
    name = "emu"

    def __init__(self, argv):
        opts = {}
        i = 1
        while i < len(argv):
            a = argv[i]
            if not a.startswith("--") or i + 1 >= len(argv):
                _usage("bad argument %r" % a)
            opts[a[2:]] = argv[i + 1]
            i += 2
        for k in ("config", "control", "state"):
            if k not in opts:
                _usage("--%s is required" % k)
        self.config_path = opts["config"]
        self.control = _split_hostport(opts["control"])
        self.serial = _split_hostport(opts["serial"]) if "serial" in opts else None
        self.state_dir = opts["state"]
        self._cause = opts.get("reset-cause", "power_on")
        try:
            os.mkdir(self.state_dir)
        except OSError:
            pass
        self._world_path = self.state_dir + "/world.json"
        self._nvs_path = self.state_dir + "/nvs.json"
        self.outbox_path = self.state_dir + "/outbox.jsonl"
        # The physical world outlives a reboot of the chip; a rebooted board sees it as it was.
        self.world = _read_json(self._world_path, {"mains": True, "battery_v": 4.1, "wlan": True})
        self._nvs = _read_json(self._nvs_path, {})
        self._inputs = {}
        self._wlan = _WLAN(self)
        self._links = []
        self._zombies = []
        self._wdt = None
        self._led = None
        self._mains_cfg = None
        self.app = None
        self._clock = 0  # seconds added by NTP's set_time
        self._synced = False
        self._serial_clients = []
        self._lines = line.Lines(SERIAL_BACKLOG)
        self._tick0 = time.ticks_ms()
        self._tick_start = int(opts.get("ticks-start", "0")) % TICKS_PERIOD

    # --- clock, identity, reset ---------------------------------------------------------

    def ticks_ms(self):
        return (time.ticks_diff(time.ticks_ms(), self._tick0) + self._tick_start) & (TICKS_PERIOD - 1)

    def ticks_diff(self, a, b):
        return ((a - b + _TICKS_HALF) & (TICKS_PERIOD - 1)) - _TICKS_HALF

    def now_unix(self):
        # As on the chip (board_esp32): no wall time until NTP has set the clock, so events
        # carry ts: null until then, and the bridge must cope with both.
        if not self._synced:
            return None
        return int(time.time()) + self._clock

    def set_time(self, unix):
        # The host's clock is the emulator's RTC; NTP's answer only shifts it.
        self._clock = unix - int(time.time())
        self._synced = True

    def console(self, line):
        print(line)
        self.serial_out(line)

    def unique_id(self):
        return "emu0"

    def reset_cause(self):
        return self._cause

    def reset(self):
        print("# emu: machine.reset()")
        raise SystemExit(EXIT_RESET)

    async def _reset_soon(self):
        await asyncio.sleep_ms(50)  # the control reply goes out first
        self.reset()

    def halt(self, msg):
        sys.exit(EXIT_CONFIG)

    def configure(self, cfg):
        self._mains_cfg = cfg["mains"]

    # --- pins, ADC, watchdog -------------------------------------------------------------

    def input(self, num, pull_up=False):
        p = _Input(1 if pull_up else 0)
        self._inputs[num] = p
        self._apply_mains()
        return p

    def output(self, num, value=0):
        return _Output(value)

    def relay(self, num, active_low):
        return _Relay(self, active_low)

    def led(self, num, active_low):
        self._led = _Led(self)
        return self._led

    def adc(self, num):
        return _ADC(self)

    def wdt(self, timeout_ms):
        self._wdt = _WDT(self, timeout_ms)
        return self._wdt

    # --- persistent storage (esp32.NVS on the chip) ----------------------------------------

    def nvs_get(self, key, default=None):
        return self._nvs.get(key, default)

    def nvs_set(self, key, value):
        self._nvs[key] = value
        _write_json(self._nvs_path, self._nvs)

    # --- network -------------------------------------------------------------------------

    def wlan(self):
        return self._wlan

    def net_up(self):
        return self._wlan.isconnected()

    async def _radio(self):
        while True:
            self._wlan.tick(time.ticks_ms())
            await asyncio.sleep_ms(50)

    async def open_connection(self, host, port):
        if not self._wlan.isconnected():
            raise OSError(EHOSTUNREACH)
        r, _w = await asyncio.open_connection(host, port)
        link = _Link(self, r)
        self._links.append(link)
        return link, link

    # --- the physical world ----------------------------------------------------------------

    def _apply_mains(self):
        c = self._mains_cfg
        if c is None or c["pin"] not in self._inputs or c["mode"] != "level":
            return
        present = self.world["mains"]
        self._inputs[c["pin"]].level = (0 if present else 1) if c["active_low"] else (1 if present else 0)

    async def _pulses(self):
        c = self._mains_cfg
        pin = self._inputs.get(c["pin"]) if c else None
        if pin is None or c["mode"] != "pulse":
            return
        while True:
            if self.world["mains"] and pin.handler is not None:
                pin.handler(pin)
            await asyncio.sleep_ms(HALF_CYCLE_MS)

    async def _ghosts(self):
        c = self._mains_cfg
        pin = self._inputs.get(c["pin"]) if c else None
        if pin is None or c["mode"] != "pulse":
            return
        while True:
            hz = self.world.get("ghost_hz") or 0
            if not hz:
                await asyncio.sleep_ms(50)
                continue
            # Irregular, as interference is: each gap 50..150 % of the mean.
            mean = 1000 / hz
            await asyncio.sleep_ms(int(mean * (0.5 + getrandbits(8) / 255)))
            if (self.world.get("ghost_hz") or 0) and pin.handler is not None:
                pin.handler(pin)

    async def _discharge(self):
        step_ms = 100
        while True:
            await asyncio.sleep_ms(step_ms)
            rate = self.world.get("discharge_v_per_s") or 0
            if rate:
                # Straight into the world, not through _set: ten file writes a second buy nothing.
                self.world["battery_v"] = max(0.0, self.world["battery_v"] - rate * step_ms / 1000)

    async def _watchdog(self):
        while True:
            await asyncio.sleep_ms(200)
            w = self._wdt
            if w is not None and time.ticks_diff(time.ticks_ms(), w.fed) > w.timeout:
                print("# emu: watchdog expired, resetting")
                raise SystemExit(EXIT_WDT)

    def _set(self, key, value):
        self.world[key] = value
        _write_json(self._world_path, self.world)
        if key == "mains":
            self._apply_mains()
        elif key == "wlan" and not value:
            for link in self._links:
                link.cut = True
        elif key == "wlan":
            for s in self._zombies:
                s.s.close()
            self._zombies = []

    def command(self, line):
        try:
            cmd = json.loads(line)
        except ValueError:
            return {"ok": False, "error": "not JSON: %r" % line[:80]}
        if not isinstance(cmd, dict) or len(cmd) != 1:
            return {"ok": False, "error": "expected an object with exactly one key"}
        k = list(cmd)[0]
        v = cmd[k]
        if k in ("mains", "wlan"):
            if not isinstance(v, bool):
                return {"ok": False, "error": "%s: expected true or false" % k}
            self._set(k, v)
            # The firmware's own clock at the change, so a test can time what follows on the board.
            return {"ok": True, k: v, "uptime_ms": self.app.uptime_ms() if self.app else None}
        if k == "ghost_hz":
            # Spurious edges on the mains pin, as GPIO36/39 see with WiFi on: with or without mains.
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 200:
                return {"ok": False, "error": "ghost_hz: expected edges per second 0..200"}
            self._set(k, v)
            return {"ok": True, k: v}
        if k == "battery_v":
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 30:
                return {"ok": False, "error": "battery_v: expected a voltage 0..30"}
            self._set("discharge_v_per_s", 0)  # a set voltage ends a running discharge
            self._set(k, float(v))
            return {"ok": True, k: float(v)}
        if k in ("discharge_v_per_s", "adc_noise_v"):
            # A discharge runs the battery voltage down at this rate until 0 or a set battery_v.
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 5:
                return {"ok": False, "error": "%s: expected volts 0..5" % k}
            self._set(k, float(v))
            return {"ok": True, k: float(v)}
        if k == "reset":
            # The reset button: the supervisor boots the firmware again with cause "hard".
            self._tasks.append(asyncio.create_task(self._reset_soon()))
            return {"ok": True, "reset": True}
        if k == "get":
            if v == "state":
                return {"ok": True, "state": self.app.snapshot() if self.app else None}
            if v == "world":
                return {"ok": True, "world": self.world}
            if v == "ticks":
                return {"ok": True, "ticks_ms": self.ticks_ms()}
            if v == "adc":
                return {"ok": True, "adc_uv": _ADC(self).read_uv()}
            if v == "mem":
                gc.collect()
                return {
                    "ok": True,
                    "mem": {
                        "free": gc.mem_free(),
                        "alloc": gc.mem_alloc(),
                        "hwm": self.app.heap_hwm if self.app else 0,
                    },
                }
            if v == "relay":
                return {"ok": True, "relay": bool(self.world.get("relay")), "pin": self.world.get("relay_pin")}
            if v == "raised":
                # Events raised in this boot, by kind: what a soak compares the journal with.
                return {"ok": True, "raised": self.app.raised if self.app else {}}
            if v == "led":
                if self._led is None:
                    return {"ok": False, "error": "get: this board config has no status LED"}
                d = self._led_periods()
                return {"ok": True, "led": self._led.on, "periods_ms": d}
            return {"ok": False, "error": "get: expected state, world, ticks, adc, mem, relay, led or raised"}
        return {"ok": False, "error": "unknown command %r" % k}

    def _led_periods(self):
        c = self._led.changes
        return [self.ticks_diff(c[i + 1], c[i]) for i in range(len(c) - 1)]  # no itertools on the board

    def _reply(self, line):
        try:
            text = line.decode()
        except UnicodeError:
            return {"ok": False, "error": "not UTF-8"}
        return self.command(text.strip())

    async def _client(self, r, w):
        # Read in bounded chunks, never readline(): a peer that sends a megabyte without a newline
        # must cost 2 x CONTROL_LINE_MAX of heap, not a megabyte.
        buf = b""
        skipping = False
        try:
            while True:
                chunk = await r.read(256)
                if not chunk:
                    break
                buf += chunk
                while True:
                    i = buf.find(b"\n")
                    if i < 0:
                        break
                    line = buf[:i]
                    buf = buf[i + 1 :]
                    if skipping or len(line) > CONTROL_LINE_MAX:
                        skipping = False
                        resp = {"ok": False, "error": "line too long"}
                    else:
                        resp = self._reply(line)
                    w.write(json.dumps(resp).encode() + b"\n")
                    await w.drain()
                if len(buf) > CONTROL_LINE_MAX:
                    skipping = True
                    buf = b""
        except Exception as e:  # one bad control client must not disturb the firmware
            print("# emu: control client error", repr(e))
        # MicroPython's Stream.close() does nothing; wait_closed() is what closes the socket.
        w.close()
        try:
            await w.wait_closed()
        except OSError:
            pass

    # --- the USB serial port, as a TCP port (pyserial opens it as socket://HOST:PORT) -------

    def serial_out(self, text):
        if self._serial_clients:  # nobody on the other end of the cable: the bytes go nowhere
            self._lines.put(text)

    async def _serial_writer(self):
        while True:
            out = await self._lines.get()
            for w in list(self._serial_clients):
                try:
                    w.write(out + b"\n")
                    await asyncio.wait_for_ms(w.drain(), 2000)
                except Exception:  # a stuck or gone reader is unplugged, the board carries on
                    self._serial_clients.remove(w)

    async def _serial_client(self, r, w):
        self._serial_clients.append(w)
        try:
            while True:
                got = await r.readline()
                if not got:
                    break
                self._lines.received(got, self.app, self.console)
        except Exception as e:
            print("# emu: serial client error", repr(e))
        if w in self._serial_clients:
            self._serial_clients.remove(w)
        w.close()
        await w.wait_closed()

    async def serve(self, app):
        self.app = app
        host, port = self.control
        await asyncio.start_server(self._client, host, port)
        self._tasks = [
            asyncio.create_task(self._pulses()),
            asyncio.create_task(self._ghosts()),
            asyncio.create_task(self._discharge()),
            asyncio.create_task(self._radio()),
            asyncio.create_task(self._watchdog()),
        ]
        print("# emu: control on %s:%d" % (host, port))
        if self.serial:
            await asyncio.start_server(self._serial_client, self.serial[0], self.serial[1])
            self._tasks.append(asyncio.create_task(self._serial_writer()))
            print("# emu: serial on %s:%d" % self.serial)
