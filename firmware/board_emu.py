# Emulated board for the MicroPython unix port: the same interface as board_esp32.
#
# The physical world it sits in (mains, battery, access point) is emu_world.py's; the control
# port that changes it is emu_control.py's. Cutting the WLAN silences every open connection
# without closing it, as a dead radio does, so the firmware's keepalive and the broker's last
# will are what notice.
import asyncio
import gc
import os
import sys
import time

import line

# The world and the control port exist only here, never on a chip: what they hold of the heap is
# measured once, so `{"get": "mem"}` can say how much of the heap is the emulator's own.
gc.collect()
_before = gc.mem_alloc()
import emu_control  # noqa: E402
from emu_world import WLAN, Counter, World, read_json, write_json  # noqa: E402

gc.collect()
EMU_ONLY_BYTES = gc.mem_alloc() - _before
del _before

EXIT_CONFIG = 2
EXIT_RESET = 42
EXIT_WDT = 43
EHOSTUNREACH = 113
EADDRINUSE = 98
ETIMEDOUT = 110
# The ESP32's ticks_ms wraps at 2^30 ms (~12.4 days; ticks_diff is valid within +-2^29), the
# unix port's only at 2^62: the board's clock wraps like the chip's, and can start near the wrap.
TICKS_PERIOD = 1 << 30
_TICKS_HALF = TICKS_PERIOD >> 1
SERIAL_BACKLOG = 64  # lines waiting for a slow serial reader; older ones go, as a UART's FIFO overflows


def _usage(msg):
    print("# emu: " + msg)
    print("# usage: emu_main.py --config FILE --control HOST:PORT --state DIR")
    print("#        [--serial HOST:PORT] [--reset-cause CAUSE] [--ticks-start MS] [--no-counter 1]")
    sys.exit(EXIT_CONFIG)


def _split_hostport(v):
    i = v.rfind(":")
    if i <= 0:
        _usage("bad HOST:PORT %r" % v)
    return v[:i], int(v[i + 1 :])


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
        return max(0, int(self.board.world.adc_volts() / self.DIVIDER * 1000000))


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
        self.board.world.state["relay_pin"] = (0 if v else 1) if self.active_low else (1 if v else 0)
        self.board.world.set("relay", bool(v))


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


class Board:
    name = "emu"
    EMU_ONLY = EMU_ONLY_BYTES

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
        self._no_counter = opts.get("no-counter") == "1"
        try:
            os.mkdir(self.state_dir)
        except OSError:
            pass
        self._world_path = self.state_dir + "/world.json"
        self._nvs_path = self.state_dir + "/nvs.json"
        self.outbox_path = self.state_dir + "/outbox.jsonl"
        # The physical world outlives a reboot of the chip; a rebooted board sees it as it was.
        self.world = World(self._world_path)
        self.world.on_change = self._world_changed
        self._nvs = read_json(self._nvs_path, {})
        self._inputs = {}
        self._wlan = WLAN(self.world)
        self._links = []
        self._zombies = []
        self._wdt = None
        self._led = None
        self._mains_cfg = None
        self._counter = None
        self.app = None
        self._clock = 0  # seconds added by NTP's set_time
        self._synced = False
        self._serial_clients = []
        self._lines = line.Lines(SERIAL_BACKLOG)
        self._irq_pin = None  # the mains pin on its IRQ path, once its edges are flowing
        self._tick0 = time.ticks_ms()
        self._tick_start = int(opts.get("ticks-start", "0")) % TICKS_PERIOD

    # --- clock, identity, reset ---------------------------------------------------------

    def ticks_ms(self):
        if self._irq_pin is not None:
            # Soft IRQs pending run first, as at the chip's next bytecode (World.pulses).
            self.world.soft_irqs(self._irq_pin)
        return (time.ticks_diff(time.ticks_ms(), self._tick0) + self._tick_start) & (TICKS_PERIOD - 1)

    def ticks_add(self, a, b):
        return (a + b) & (TICKS_PERIOD - 1)

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

    def reset_soon(self):
        async def later():
            await asyncio.sleep_ms(50)  # the control reply goes out first
            self.reset()

        self._tasks.append(asyncio.create_task(later()))

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

    def counter(self, pin, filter_ns):
        """A hardware count of the pin's falling edges (machine.Counter), or None where the port
        has none. The emulated port has one unless started with --no-counter (as a MicroPython
        build without machine.Counter)."""
        if self._no_counter:
            return None
        self._counter = Counter(self.world, filter_ns)
        return self._counter

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
        write_json(self._nvs_path, self._nvs)

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
        # As board_esp32 does (why: there); Linux's IPPROTO_TCP and TCP_NODELAY, which the unix
        # port's socket module does not name.
        _w.s.setsockopt(6, 1, 1)
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

    async def _watchdog(self):
        while True:
            await asyncio.sleep_ms(200)
            w = self._wdt
            if w is not None and time.ticks_diff(time.ticks_ms(), w.fed) > w.timeout:
                print("# emu: watchdog expired, resetting")
                raise SystemExit(EXIT_WDT)

    def _world_changed(self, key, value):
        if key == "mains":
            self._apply_mains()
        elif key == "wlan" and not value:
            for link in self._links:
                link.cut = True
        elif key == "wlan":
            for s in self._zombies:
                s.s.close()
            self._zombies = []

    def led_on(self):
        return self._led.on if self._led is not None else None

    def led_periods(self):
        """The last blinks' periods, or None with no status LED."""
        if self._led is None:
            return None
        c = self._led.changes
        return [self.ticks_diff(c[i + 1], c[i]) for i in range(len(c) - 1)]  # no itertools on the board

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

    async def _listen(self, what, host, port, starting):
        # A port in use (another emulator, a stale one) is one line and exit 2, not a traceback.
        try:
            await starting
        except OSError as e:
            why = "in use by another process" if e.errno == EADDRINUSE else "cannot listen (%r)" % e
            print("# emu: %s port %s:%d: %s; pass another --%s HOST:PORT" % (what, host, port, why, what))
            raise SystemExit(EXIT_CONFIG)

    async def serve(self, app):
        self.app = app
        host, port = self.control
        await self._listen("control", host, port, emu_control.serve(self, host, port))
        self._tasks = [
            asyncio.create_task(self.world.discharge()),
            asyncio.create_task(self._radio()),
            asyncio.create_task(self._watchdog()),
        ]
        c = self._mains_cfg
        pin = self._inputs.get(c["pin"]) if c else None
        # With a pulse counter the edges go to it, counted "in hardware"; else to the pin's IRQ.
        if pin is not None and c["mode"] == "pulse" and self._counter is None:
            self._tasks.append(asyncio.create_task(self.world.pulses(pin)))
            self._irq_pin = pin
        print("# emu: control on %s:%d" % (host, port))
        if self.serial:
            await self._listen(
                "serial", self.serial[0], self.serial[1], asyncio.start_server(self._serial_client, *self.serial)
            )
            self._tasks.append(asyncio.create_task(self._serial_writer()))
            print("# emu: serial on %s:%d" % self.serial)
