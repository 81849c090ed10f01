# Keeps the station joined to the access point, the way the esp32 port wants to be driven.
#
# The port's driver reconnects by itself: connect() sets "connect requested", and every
# STA_DISCONNECTED event (the AP rebooting, a beacon timeout) calls esp_wifi_connect() again.
# Calling connect() while it is at that raises OSError("Wifi Internal Error") (micropython
# #17661); escaping a task, that error ends the application and the watchdog resets the board
# in the middle of the outage the sentinel exists for. So: connect() once, then only when the
# driver is idle (nothing requested any more), or when an attempt has been stuck longer than
# connect_timeout_ms, after a disconnect() and a pause. Every WLAN call is guarded; a failing
# one costs a backoff, never the task.

STAT_IDLE = 1000  # network.STAT_IDLE on the esp32 port


class WifiKeeper:
    def __init__(self, wlan, cfg, board, log):
        self.wlan = wlan
        self.cfg = cfg
        self.board = board
        self.log = log
        self.up = False
        self.joins = 0  # times the link came up
        self.errors = 0  # WLAN calls that raised

    def _call(self, what, *args):
        try:
            return getattr(self.wlan, what)(*args)
        except OSError as e:
            self.errors += 1
            self.log("wlan", what, "failed:", repr(e))
            return None

    def _connect(self):
        self.log("wlan", "connecting to", self.cfg["ssid"])
        self._call("connect", self.cfg["ssid"], self.cfg["password"])

    def rssi(self):
        # Only while joined: unjoined, the port raises ("Wifi Not Connected"), which is no
        # error of the link worth counting.
        if not self.up:
            return None
        try:
            return self.wlan.status("rssi")
        except (OSError, ValueError):
            return None

    def mac(self):
        try:
            return ":".join("%02x" % b for b in self.wlan.config("mac"))
        except (OSError, ValueError):
            return None

    async def run(self):
        import asyncio

        ticks, diff = self.board.ticks_ms, self.board.ticks_diff
        self._call("active", True)
        self._connect()
        backoff = 1000
        down_since = ticks()
        while True:
            await asyncio.sleep_ms(250)
            connected = self._call("isconnected")
            now = ticks()
            if connected:
                if not self.up:
                    self.up = True
                    self.joins += 1
                    backoff = 1000
                    self.log("wlan", "up")
                continue
            if self.up:
                self.up = False
                down_since = now
                self.log("wlan", "down; the driver reconnects by itself")
            status = self._call("status")
            if status != STAT_IDLE and diff(now, down_since) < self.cfg["connect_timeout_ms"]:
                # The driver is at it (connecting, or between its own retries after "no AP
                # found" or a beacon timeout): a connect() now would raise "Wifi Internal Error".
                continue
            # Idle (nothing requested) or stuck past the timeout: start over, after a pause.
            self.log("wlan", "no connection, status", status, "; retrying in", backoff, "ms")
            self._call("disconnect")
            await asyncio.sleep_ms(backoff)
            backoff = min(backoff * 2, 60000)
            self._connect()
            down_since = ticks()
