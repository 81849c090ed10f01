# The relay, and the policy that power-cycles the modem when the uplink stays down: this module
# owns both; the sentinel only tells it, once a second, how long the uplink has been down.
#
# "on" energises the coil. Wire the modem through the normally-closed contact (wiring "nc", the
# default): the coil rests off, a pulse cuts the modem's power, and a dead or rebooting sentinel
# leaves it powered. On the normally-open contact (wiring "no") the coil rests on, and a pulse
# releases it: the same power cycle, but the modem loses power whenever the sentinel does.
import asyncio

import protocol


class Relay:
    def __init__(self, board, cfg, on_switch):
        self.board = board
        self.cfg = cfg
        self.on_switch = on_switch  # (on, why)
        self.out = board.relay(cfg["pin"], cfg["active_low"])
        self.rest = cfg["wiring"] == "no"  # the coil's state while the modem is powered
        self.out.value(1 if self.rest else 0)
        self.on = self.rest
        self.last_ms = None
        self.pulsing = None
        self.cycles = []  # ticks of the policy's recent power cycles

    def _too_soon(self):
        gap = self.cfg["min_interval_ms"]
        return self.last_ms is not None and self.board.ticks_diff(self.board.ticks_ms(), self.last_ms) < gap

    def _switch(self, on, why):
        self.out.value(1 if on else 0)
        self.on = on
        self.last_ms = self.board.ticks_ms()
        self.on_switch(on, why)

    def set(self, on, why):
        """Switch the coil now; returns an error reason, or None. A pulse in progress is cancelled:
        the coil's rest ends it early (as its own end would, no minimum interval), the other keeps
        the modem off."""
        if self.pulsing is not None:
            self.pulsing.cancel()
            self.pulsing = None
            if on == self.rest:
                self._switch(self.rest, why)
            return None
        if on == self.on:
            return None
        if self._too_soon():
            return protocol.TOO_SOON
        self._switch(on, why)
        return None

    @property
    def modem_on(self):
        return self.on == self.rest

    def pulse(self, ms, why):
        """The modem off for ms, then on again."""
        if self.pulsing is not None or not self.modem_on:
            return protocol.BUSY
        if self._too_soon():
            return protocol.TOO_SOON
        self._switch(not self.rest, why)
        self.pulsing = asyncio.create_task(self._release(ms, why))
        return None

    async def _release(self, ms, why):
        await asyncio.sleep_ms(ms)
        self.pulsing = None
        self._switch(self.rest, why)  # the end of a pulse is part of it: no minimum interval

    def cycle_allowed(self, down_ms, on_battery):
        """The modem power-cycle policy: down long enough, under the hourly cap, mains unless allowed."""
        c = self.cfg
        if not c["cycle_after_s"] or down_ms < c["cycle_after_s"] * 1000 or self.pulsing is not None:
            return False
        if on_battery and not c["cycle_on_battery"]:
            return False
        now = self.board.ticks_ms()
        self.cycles = [t for t in self.cycles if self.board.ticks_diff(now, t) < 3600000]
        if len(self.cycles) >= c["cycles_per_hour"]:
            return False
        # After a cycle, give the modem the full wait again before the next one.
        return not (self.cycles and self.board.ticks_diff(now, self.cycles[-1]) < c["cycle_after_s"] * 1000)

    def cycle(self):
        if self.pulse(self.cfg["cycle_ms"], "uplink_down") is None:
            self.cycles.append(self.board.ticks_ms())
            return True
        return False

    def tick(self, down_ms, on_battery):
        """The policy, asked once a second by the sentinel: power-cycle the modem if the uplink has
        been down `down_ms` (0: it is up) and the policy allows; True when a cycle started."""
        return bool(down_ms) and self.cycle_allowed(down_ms, on_battery) and self.cycle()
