# The ESP32 board layer, against MicroPython's esp32 port (machine, network, esp32.NVS).
#
# Only what differs between the chip and the emulator lives here; it stays thin so the
# logic above runs identically on both. What this file does on real silicon is listed
# in docs/hardware-testing.md.
import asyncio
import json
import time

import esp32
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


class Board:
    name = "esp32"
    config_path = "/config.json"

    def __init__(self):
        self._nvs = esp32.NVS("holdover")
        self._wlan = network.WLAN(network.STA_IF)
        self._time_synced = False
        self.ticks_ms = time.ticks_ms
        self.ticks_diff = time.ticks_diff

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

    def output(self, num, value=0):
        # value= before the direction switch, so the pin never glitches the relay at boot.
        return machine.Pin(num, machine.Pin.OUT, value=value)

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

    async def net_task(self, cfg, log):
        # The IDF driver retries forever after connect(); only a stuck attempt is restarted.
        w = self._wlan
        w.active(True)
        backoff = 1000
        while True:
            if not w.isconnected():
                log("wlan", "connecting to", cfg["ssid"])
                w.connect(cfg["ssid"], cfg["password"])
                t0 = time.ticks_ms()
                while not w.isconnected() and time.ticks_diff(time.ticks_ms(), t0) < cfg["connect_timeout_ms"]:
                    await asyncio.sleep_ms(250)
                if w.isconnected():
                    log("wlan", "up", w.ifconfig()[0])
                    backoff = 1000
                else:
                    log("wlan", "no connection, status", w.status())
                    w.disconnect()
                    # A pause before retrying gets the driver out of the stuck-202 state after an AP reboot.
                    await asyncio.sleep_ms(backoff)
                    backoff = min(backoff * 2, 60000)
                    continue
            await asyncio.sleep_ms(1000)

    async def open_connection(self, host, port):
        return await asyncio.open_connection(host, port)

    async def serve(self, app):
        pass
