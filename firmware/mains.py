# Mains presence, debounced, from either a level input or an AC optocoupler's pulse train.
#
# An AC opto module pulls its output low on every mains half-cycle, so "present" cannot be
# read as a level: it means an edge was seen within the last pulse_gap_ms. A loss is timed
# from the last edge, so the event fires debounce_ms after mains actually went, not after
# the gap detector caught up. Flickers shorter than the debounce are counted, not raised.


class MainsWatch:
    def __init__(self, board, cfg, on_change):
        self.board = board
        self.level = cfg["mode"] == "level"
        self.active_low = cfg["active_low"]
        self.debounce = cfg["debounce_ms"]
        self.gap = cfg["pulse_gap_ms"]
        self.sample = cfg["sample_ms"]
        self.on_change = on_change
        self.pin = board.input(cfg["pin"], pull_up=self.active_low)
        self._last_edge = None
        self.edges = 0
        self.glitches = 0
        self.present = None  # unknown until the first settle
        self.changed_ms = board.ticks_ms()
        self.alive_ms = self.changed_ms  # the watchdog supervisor checks this
        self._cand = None
        if not self.level:
            self.pin.irq(self._edge)

    def _edge(self, _pin):
        # Runs as a (soft) interrupt: no allocation beyond a small int.
        self._last_edge = self.board.ticks_ms()
        self.edges += 1

    def raw(self, now):
        if self.level:
            v = self.pin.value()
            return v == 0 if self.active_low else v == 1
        e = self._last_edge
        return e is not None and self.board.ticks_diff(now, e) < self.gap

    async def settle(self):
        """Read the initial state without raising anything: long enough to see a pulse."""
        import asyncio

        await asyncio.sleep_ms(self.gap + 2 * self.sample)
        now = self.board.ticks_ms()
        self.present = self.raw(now)
        self.changed_ms = now
        return self.present

    def poll(self, now):
        """One sample; returns True when the debounced state flipped."""
        self.alive_ms = now
        r = self.raw(now)
        if r == self.present:
            if self._cand is not None:
                self.glitches += 1
                self._cand = None
            return False
        if self._cand is None:
            e = self._last_edge
            self._cand = e if (not r and not self.level and e is not None) else now
        if self.board.ticks_diff(now, self._cand) < self.debounce:
            return False
        held = self.board.ticks_diff(self._cand, self.changed_ms)
        self.present = r
        self.changed_ms = self._cand
        self._cand = None
        self.on_change(r, held)
        return True

    async def run(self):
        import asyncio

        if self.present is None:
            await self.settle()
        while True:
            self.poll(self.board.ticks_ms())
            await asyncio.sleep_ms(self.sample)
