# The physical world around the emulated board: mains (a level, or the 50 Hz edge train an AC
# optocoupler gives), interference on the mains pin, the battery and its discharge, and the
# WiFi access point. It outlives a reboot of the chip (kept in the state directory), as the
# real world does. Emulator only: never on a board (host/holdover/board/manifest.py).
import asyncio
import json
import os
import time
from random import getrandbits

HALF_CYCLE_MS = 10  # 50 Hz mains: the opto output falls once per half-cycle
DEFAULTS = {"mains": True, "battery_v": 4.1, "wlan": True}


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

    def __getitem__(self, key):
        return self.state[key]

    def get(self, key, default=None):
        return self.state.get(key, default)

    def set(self, key, value):
        self.state[key] = value
        write_json(self.path, self.state)
        if self.on_change is not None:
            self.on_change(key, value)

    async def pulses(self, pin):
        """The opto's edge train while mains is there, into the pin's IRQ handler."""
        while True:
            if self.state["mains"] and pin.handler is not None:
                pin.handler(pin)
            await asyncio.sleep_ms(HALF_CYCLE_MS)

    async def ghosts(self, pin):
        """Spurious edges, as GPIO36/39 see with WiFi on: with or without mains."""
        while True:
            hz = self.state.get("ghost_hz") or 0
            if not hz:
                await asyncio.sleep_ms(50)
                continue
            # Irregular, as interference is: each gap 50..150 % of the mean.
            mean = 1000 / hz
            await asyncio.sleep_ms(int(mean * (0.5 + getrandbits(8) / 255)))
            if (self.state.get("ghost_hz") or 0) and pin.handler is not None:
                pin.handler(pin)

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

    def status(self):
        return self._status

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
