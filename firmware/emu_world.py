# The physical world around the emulated board: mains (a level, or the 50/60 Hz edge train an AC
# optocoupler gives), interference on the mains pin, the battery and its discharge, and the
# WiFi access point. It outlives a reboot of the chip (kept in the state directory), as the
# real world does. Emulator only: never on a board (host/holdover/board/manifest.py).
#
# Mains edges and ghosts are a timeline on a microsecond clock, not a task's ticks: a pulse
# counter (machine.Counter) counts them in hardware while the VM is stalled, so the emulated
# one must be able to say how many fell in any stretch of time, stalls included.
import asyncio
import json
import os
import time
from random import getrandbits

DEFAULTS = {"mains": True, "battery_v": 4.1, "wlan": True}
# The opto's output falls once per half-cycle (a bridge-fed opto) or once per cycle
# ("edges_per_cycle": 1, a single-LED PC817 on one half-wave).
EDGES_PER_CYCLE = 2
IRQ_QUEUE = 4  # soft IRQs MicroPython keeps scheduled while the VM is busy; more are dropped


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps(obj))
    os.rename(tmp, path)


def read_json(path, default):
    try:
        with open(path) as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return default


class World:
    def __init__(self, path):
        self.path = path
        self.state = read_json(path, dict(DEFAULTS))
        self.on_change = None  # (key, value): what the board does when the world changes
        self._us = 0
        self._us_tick = time.ticks_us()
        self._on_since = None  # world µs since mains has been on
        self._edges_done = 0  # mains edges in the intervals that ended
        self._ghost_next = None
        self._irq_seen = None  # mains edges already handed to the pin's IRQ handler
        self._in_irq = False  # a handler reading the clock must not run the IRQs again
        self._mains_edit(self.state["mains"])

    def __getitem__(self, key):
        return self.state[key]

    def get(self, key, default=None):
        return self.state.get(key, default)

    def set(self, key, value):
        if key == "mains":
            self._mains_edit(value)
        elif key in ("hz", "edges_per_cycle", "jitter_pct") and self._on_since is not None:
            self._mains_edit(False)  # the edges so far at the old period, the rest at the new
            self.state[key] = value
            self._mains_edit(True)
        self.state[key] = value
        write_json(self.path, self.state)
        if self.on_change is not None:
            self.on_change(key, value)

    # --- the mains pin's timeline ------------------------------------------------------------

    def now_us(self):
        """Microseconds since the world began; ticks_us wraps, this does not (read often)."""
        t = time.ticks_us()
        self._us += time.ticks_diff(t, self._us_tick)
        self._us_tick = t
        return self._us

    def period_us(self):
        hz = self.state.get("hz") or 50
        return 1000000 // (hz * (self.state.get("edges_per_cycle") or EDGES_PER_CYCLE))

    def _mains_edit(self, on):
        # Mains' edges fall on multiples of the period on the world's clock; an interval of
        # mains holds those inside it. Closed intervals are summed, so a count is O(1).
        now = self.now_us()
        if on and self._on_since is None:
            self._on_since = now
        elif not on and self._on_since is not None:
            self._edges_done += self._edges_in(self._on_since, now)
            self._on_since = None

    def dip(self, ms):
        """A gap in the edge train from now for exactly `ms` (mains stays on either side)."""
        now = self.now_us()
        if self._on_since is None:
            return False
        self._edges_done += self._edges_in(self._on_since, now)
        self._on_since = now + ms * 1000  # an interval that starts in the future holds no edges yet
        return True

    def jitter_us(self):
        return self.period_us() * (self.state.get("jitter_pct") or 0) // 100

    def _upto(self, t):
        # Edges at or before t. Edge k falls at k*p, moved by up to jitter_pct of p either way
        # (its own fixed offset, from k): with under half a period of jitter the order holds, so
        # only the edges either side of t//p can be on the other side of t.
        p = self.period_us()
        span = self.jitter_us()
        k = t // p
        if span:

            def at(i):
                return i * p + span * (((i * 2654435761) >> 7) % 2001 - 1000) // 1000

            if at(k) > t:
                k -= 1
            elif at(k + 1) <= t:
                k += 1
        return k + 1

    def _edges_in(self, a, b):
        return max(0, self._upto(b) - self._upto(a - 1))

    def mains_edges(self, now):
        """Every mains edge on the pin since the world began, up to `now` (world µs)."""
        n = self._edges_done
        if self._on_since is not None:
            n += self._edges_in(self._on_since, now)
        return n

    def ghosts_until(self, now):
        """The ghost edges since the last call, as (µs, width µs): interference is irregular
        (each gap 50..150 % of the mean) and narrow (a few µs unless "ghost_us" says wider)."""
        hz = self.state.get("ghost_hz") or 0
        if not hz:
            self._ghost_next = None
            return ()
        out = []
        mean = 1000000 // hz
        if self._ghost_next is None:
            self._ghost_next = now + mean * (128 + getrandbits(8)) // 256
        while self._ghost_next <= now:
            out.append((self._ghost_next, self.state.get("ghost_us") or 2))
            self._ghost_next += mean // 2 + mean * getrandbits(8) // 255
        return out

    def soft_irqs(self, pin):
        """The edges fallen since the last call, into the pin's IRQ handler as MicroPython's soft
        IRQs run them: late by whatever held the VM, at most IRQ_QUEUE of them caught up after a
        stall. No glitch filter on this path: every ghost is an edge."""
        now = self.now_us()
        if self._in_irq:
            return now
        edges = self.mains_edges(now)
        if self._irq_seen is None:
            self._irq_seen = edges
        due = edges - self._irq_seen + len(self.ghosts_until(now))
        self._irq_seen = edges
        if pin.handler is not None:
            self._in_irq = True
            try:
                for _ in range(min(due, IRQ_QUEUE)):
                    pin.handler(pin)
            finally:
                self._in_irq = False
        return now

    async def pulses(self, pin):
        """Runs the soft IRQs as the edges fall. The board also runs them before the firmware
        reads its clock (board_emu.ticks_ms): on the chip a scheduled soft IRQ runs at the VM's
        next bytecode, before the task that was held up with it, not when this task is next
        scheduled; a poll that ran first would find no edge for as long as the VM was held."""
        while True:
            now = self.soft_irqs(pin)
            # Wake just after the next edge can have fallen: its slot on the grid plus the jitter.
            p = self.period_us()
            j = self.jitter_us()
            await asyncio.sleep_ms(max(1, (p - (now - j) % p) // 1000))

    async def discharge(self):
        step_ms = 100
        while True:
            await asyncio.sleep_ms(step_ms)
            rate = self.state.get("discharge_v_per_s") or 0
            if rate:
                # Straight into the state, not through set(): ten file writes a second buy nothing.
                self.state["battery_v"] = max(0.0, self.state["battery_v"] - rate * step_ms / 1000)

    def adc_volts(self):
        # The ESP32's ADC is noisy (tens of mV a reading); "adc_noise_v" puts that much on each.
        v = self.state["battery_v"]
        noise = self.state.get("adc_noise_v") or 0
        if noise:
            v += noise * (getrandbits(16) / 32767.5 - 1)
        return v


class Counter:
    """machine.Counter as the esp32 port has it (a PCNT unit): counts the pin's edges whatever
    the VM is doing, ignoring pulses narrower than `filter_ns` (the unit's glitch filter)."""

    RISING, FALLING, UP, DOWN = 1, 2, 1, 2

    def __init__(self, world, filter_ns=0):
        self.world = world
        self.filter_ns = filter_ns
        self._ghosts = 0
        self._base = world.mains_edges(world.now_us())

    def value(self, v=None):
        now = self.world.now_us()
        for _t, width_us in self.world.ghosts_until(now):
            if width_us * 1000 >= self.filter_ns:
                self._ghosts += 1
        n = self.world.mains_edges(now) - self._base + self._ghosts
        if v is not None:
            self._base += n - v
        return n


class WLAN:
    """network.WLAN(STA_IF) as the esp32 port drives it, with the access point in the world.

    Faithful where it hurts (ports/esp32/network_wlan.c): connect() sets "connect requested"
    and the driver then reconnects by itself after every drop; a connect() while it is
    connecting raises OSError("Wifi Internal Error"); status() gives the port's codes.
    """

    IDLE, CONNECTING, GOT_IP = 1000, 1001, 1010
    BEACON_TIMEOUT, NO_AP_FOUND = 200, 201
    JOIN_MS = 300  # association and DHCP, when the AP is there
    SCAN_MS = 1500  # one failed attempt, when it is not

    def __init__(self, world):
        self.world = world
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

    def status(self, param=None):
        if param is None:
            return self._status
        if param != "rssi":
            raise ValueError("unknown status param")
        if self._status != self.GOT_IP:
            # esp_wifi_sta_get_ap_info() unjoined, as the port raises it
            raise OSError("Wifi Not Connected")
        return int(self.world.get("rssi", -58))

    def config(self, param):
        if param != "mac":
            raise ValueError("unknown config param")
        return b"\x24\x6f\x28\x0a\x0b\x0c"  # an Espressif OUI, as efuse gives the chip's own

    def ifconfig(self):
        return ("127.0.0.1", "255.0.0.0", "127.0.0.1", "127.0.0.1")

    def tick(self, now):
        """The driver's event handler, run by the board's radio task."""
        ap = self.world["wlan"]
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
