# The ESP32 board layer, against MicroPython's esp32 port (machine, network, esp32.NVS).
#
# Only what differs between the chip and the emulator lives here; it stays thin so the
# logic above runs identically on both. What this file does on real silicon is listed
# in docs/hardware-testing.md.
import asyncio
import json
import socket
import sys
import time

import esp32
import line
import machine
import network

# machine.reset_cause() values mapped to the names the protocol carries. A brownout
# reports as PWRON_RESET on the ESP32, so "power_on" may also mean a sagging supply.
_CAUSES = {
    machine.PWRON_RESET: "power_on",
    machine.HARD_RESET: "hard",
    machine.WDT_RESET: "wdt",
    machine.DEEPSLEEP_RESET: "deepsleep",
    machine.SOFT_RESET: "soft",
}
_EPOCH_OFFSET = 946684800 if time.gmtime(0)[0] == 2000 else 0  # the ESP32 counts from 2000


class _Input:
    def __init__(self, pin):
        self.pin = pin

    def value(self):
        return self.pin.value()

    def irq(self, handler):
        self.pin.irq(trigger=machine.Pin.IRQ_FALLING, handler=handler)


SERIAL_BACKLOG = 32  # event lines waiting for the UART; the oldest go when the host stops reading


class Board:
    name = "esp32"
    config_path = "/config.json"
    outbox_path = "/outbox.jsonl"

    def __init__(self):
        self._nvs = esp32.NVS("holdover")
        self._wlan = network.WLAN(network.STA_IF)
        self._time_synced = False
        self._lines = line.Lines(SERIAL_BACKLOG)
        self.app = None
        self.ticks_ms = time.ticks_ms
        self.ticks_diff = time.ticks_diff
        self.ticks_add = time.ticks_add

    def set_time(self, unix):
        t = time.gmtime(unix - _EPOCH_OFFSET)
        # RTC.datetime takes (year, month, day, weekday, hours, minutes, seconds, subseconds).
        machine.RTC().datetime((t[0], t[1], t[2], t[6] + 1, t[3], t[4], t[5], 0))
        self._time_synced = True

    def console(self, line):
        # Once the serial writer runs, logs go through it too: a print() in the middle of a
        # half-written event line would garble both.
        if self.app is None:
            print(line)
        else:
            self.serial_out(line)

    def now_unix(self):
        if not self._time_synced:
            return None
        return time.time() + _EPOCH_OFFSET

    def unique_id(self):
        import binascii

        return binascii.hexlify(machine.unique_id()).decode()

    def reset_cause(self):
        return _CAUSES.get(machine.reset_cause(), "unknown")

    def reset(self):
        machine.reset()

    def halt(self, msg):
        # Fall back to the REPL, where mpremote can replace a bad config.json.
        print("# halted:", msg)

    def configure(self, cfg):
        pass

    def input(self, num, pull_up=False):
        pull = machine.Pin.PULL_UP if pull_up else None
        return _Input(machine.Pin(num, machine.Pin.IN, pull))

    def counter(self, pin, filter_ns):
        """The pin's falling edges counted by a PCNT unit (machine.Counter, in recent MicroPython),
        through the VM's stalls that hold soft IRQs back; None on firmware without it."""
        counter = getattr(machine, "Counter", None)
        if counter is None:
            return None
        return counter(0, pin.pin, edge=counter.FALLING, filter_ns=filter_ns)

    def output(self, num, value=0):
        # value= before the direction switch, so the pin never glitches the relay at boot.
        return machine.Pin(num, machine.Pin.OUT, value=value)

    def relay(self, num, active_low):
        # Signal inverts for an active-low module; value=0 before the direction switch keeps the
        # coil off through boot (with the module's own pull-up, see hardware/pins.md).
        pin = machine.Pin(num, machine.Pin.OUT, value=1 if active_low else 0)
        return machine.Signal(pin, invert=active_low)

    def led(self, num, active_low):
        return machine.Signal(machine.Pin(num, machine.Pin.OUT, value=1 if active_low else 0), invert=active_low)

    def adc(self, num):
        # ADC1 only (GPIO 32-39): ADC2 is taken by the WiFi driver. 11 dB reads up to ~3.1 V,
        # and read_uv() applies the chip's factory calibration.
        return machine.ADC(machine.Pin(num), atten=machine.ADC.ATTN_11DB)

    def wdt(self, timeout_ms):
        return machine.WDT(timeout=timeout_ms)

    def nvs_get(self, key, default=None):
        buf = bytearray(256)
        try:
            n = self._nvs.get_blob(key, buf)
        except OSError:
            return default
        return json.loads(bytes(buf[:n]))

    def nvs_set(self, key, value):
        self._nvs.set_blob(key, json.dumps(value))
        self._nvs.commit()

    def net_up(self):
        return self._wlan.isconnected()

    def wlan(self):
        return self._wlan  # driven by wifi.WifiKeeper, above the board layer

    async def open_connection(self, host, port):
        r, w = await asyncio.open_connection(host, port)
        # An event is a few hundred bytes sent alone the moment it happens: with Nagle's algorithm
        # (on by default in lwIP) it waits for the broker's ACK of the last segment, a delayed ACK
        # later (a 20 ms tail on mains_suspect in the emulator). The port's setsockopt takes
        # TCP_NODELAY at IPPROTO_TCP (ports/esp32/modsocket.c).
        w.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return r, w

    # --- the USB serial port: UART0 through the devkit's USB bridge, shared with the REPL ---

    def serial_out(self, text):
        self._lines.put(text)

    async def _serial_writer(self):
        # Through a StreamWriter, so a 2 KB line at 115200 baud (~170 ms) is written as the
        # UART drains instead of holding the loop.
        out = asyncio.StreamWriter(sys.stdout, {})
        while True:
            out.write(await self._lines.get())
            out.write(b"\n")
            await out.drain()

    async def _serial_reader(self):
        inp = asyncio.StreamReader(sys.stdin)
        while True:
            got = await inp.readline()
            if got:
                self._lines.received(got, self.app, self.console)

    async def serve(self, app):
        self.app = app
        self._tasks = [asyncio.create_task(self._serial_writer()), asyncio.create_task(self._serial_reader())]
