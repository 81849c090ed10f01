# Mains presence, debounced, from either a level input or an AC optocoupler's pulse train.
#
# An AC opto module pulls its output low on every mains half-cycle (or every cycle), so
# "present" cannot be read as a level. Nor is "an edge was seen lately" enough: with WiFi on,
# GPIO36/39 and noisy wiring see ghost edges, a few to 20 a second, and one ghost per debounce
# period would hold off mains_lost forever. An edge counts as mains only when it closes a run
# of `pulse_edges` edges each within `pulse_gap_ms` of the last: a rate that mains has and
# ghosts do not. Mains is present while the newest such edge is younger than the gap, and a
# loss is timed from it (not from a later ghost), so the event fires debounce_ms after mains
# went. Flickers shorter than the debounce are counted, not raised.


class MainsWatch:
    def __init__(self, board, cfg, on_change):
        self.board = board
        self.level = cfg["mode"] == "level"
        self.active_low = cfg["active_low"]
        self.debounce = cfg["debounce_ms"]
        self.k = cfg["pulse_edges"]
        self.gap = cfg["pulse_gap_ms"]
        self.sample = cfg["sample_ms"]
        self.on_change = on_change
        self.pin = board.input(cfg["pin"], pull_up=self.active_low and cfg["pull_up"])
        # Written by the interrupt; small ints only, so the handler never allocates.
        self._prev = None  # the last edge of any kind
        self._run = 0  # edges in a row, each within the gap of the one before
        self._mains_edge = None  # the newest edge that closed a run: mains, not a ghost
        self.edges = 0
        self.glitches = 0
        self.present = None  # unknown until the first settle
        self.changed_ms = board.ticks_ms()
        self.alive_ms = self.changed_ms  # the watchdog supervisor checks this
        self._cand = None
        self._resume_ms = None  # when the loop came back from its last stall
        self.stalls = 0  # times the loop was held up past the gap (see poll)
        self.stalled_ms = 0
        if not self.level:
            self.pin.irq(self._edge)

    def _edge(self, _pin):
        # Runs as a (soft) interrupt: no allocation beyond a small int.
        t = self.board.ticks_ms()
        p = self._prev
        if p is not None and self.board.ticks_diff(t, p) < self.gap:
            if self._run < self.k:
                self._run += 1
        else:
            self._run = 1
        self._prev = t
        if self._run >= self.k:
            self._mains_edge = t
        self.edges += 1

    def raw(self, now):
        if self.level:
            v = self.pin.value()
            return v == 0 if self.active_low else v == 1
        e = self._mains_edge
        return e is not None and self.board.ticks_diff(now, e) < self.gap

    async def settle(self):
        """Read the initial state without raising anything: long enough to see a pulse."""
        import asyncio

        # Absent only after the debounce with no run of mains edges: a board busy booting may
        # take its first edges late, and "no mains at boot" starts an emergency checkpoint.
        start = self.board.ticks_ms()
        wait = self.debounce + self.k * self.gap + 2 * self.sample
        while True:
            await asyncio.sleep_ms(self.sample)
            now = self.board.ticks_ms()
            self.alive_ms = now
            if self.raw(now) or self.board.ticks_diff(now, start) >= wait:
                break
        self.present = self.raw(now)
        self.changed_ms = now
        return self.present

    def poll(self, now):
        """One sample; returns True when the debounced state flipped."""
        since = self.board.ticks_diff(now, self.alive_ms)
        if since > self.gap + self.sample:
            self.stalls += 1
            self.stalled_ms += since
            # The loop was held up (a long GC, a slow flash write, a starved process in the
            # emulator): interrupts were not handled either, so "no edges" during the stall
            # proves nothing. Absence counts again from now; a real cut is reported that late.
            self._resume_ms = now
            if self.present:
                self._cand = None  # a loss in progress starts again; a restore goes on
        self.alive_ms = now
        r = self.raw(now)
        if r == self.present:
            if self._cand is not None:
                self.glitches += 1
                self._cand = None
            return False
        if self._cand is None:
            e = self._mains_edge
            if not r and not self.level and e is not None:
                # Timed from the last mains edge, but never from before a stall.
                r0 = self._resume_ms
                self._cand = r0 if r0 is not None and self.board.ticks_diff(r0, e) > 0 else e
            else:
                self._cand = now
        if self.board.ticks_diff(now, self._cand) < self.debounce:
            return False
        held = self.board.ticks_diff(self._cand, self.changed_ms)
        self.present = r
        self.changed_ms = self._cand
        self._cand = None
        self.on_change(r, held)
        return True

    def snapshot(self):
        """Its part of the sentinel's state: mains now, flickers counted, loop stalls seen."""
        return {
            "mains": self.present,
            "glitches": self.glitches,
            "loop_stalls": self.stalls,
            "loop_stalled_ms": self.stalled_ms,
        }

    async def run(self):
        import asyncio

        if self.present is None:
            await self.settle()
        while True:
            self.poll(self.board.ticks_ms())
            await asyncio.sleep_ms(self.sample)
