# Mains presence, in tiers, from a level input or an AC optocoupler's pulse train.
#
# An AC opto module pulls its output low once or twice a mains cycle, so "present" cannot be
# read as a level. Nor is "an edge was seen lately" enough: with WiFi on, GPIO36/39 and noisy
# wiring see ghost edges, a few to 20 a second, and one ghost per debounce period would hold off
# mains_lost forever. An edge counts as mains only when it closes a run of edges each within the
# gap of the last: a rate that mains has and ghosts do not.
#
# Two ways to see the edges. The chip's pulse counter (machine.Counter, a PCNT unit) counts them
# in hardware, through a GC pause or a flash write, and its glitch filter drops interference
# spikes; it is sampled every count_ms. Where the firmware has no Counter, a pin interrupt
# takes each edge; on the ESP32 those are soft (run by the VM when it gets round to them), so a
# stall of the loop hides edges, and a loss is never timed from inside one.
#
# The line frequency is learned from each steady second (50 or 60 Hz, one or two edges a cycle)
# and sets the pulse period P. Then:
#   suspect  no mains edge for 1.5 P: said at once (a hook may prepare), never acted on;
#   dip      the suspicion cleared before the debounce: its length, the flicker a user sees;
#   lost     the suspicion held for the debounce.
# Each is timed from the last mains edge, so the host knows when the cut began.

from micropython import const

# const() with a leading underscore: folded into the bytecode, no global kept on the heap
_LEARN_MS = const(1000)
# (edges a second, line Hz) an opto gives: one edge a cycle or two; a rate within 5 % is that line.
RATES = ((50, 50), (60, 60), (100, 50), (120, 60))
_COUNTER_RUN = const(2)  # the glitch filter already took the spikes: two edges in cadence are mains
# The rate is learned from edges at least this far apart. Between 4.2 ms (half of 60 Hz's
# two-edge period) and 8.3 ms (all of it): a ghost then either falls too soon after a mains edge
# to count, or counts and makes the next mains edge too soon to: the count stays mains' own.
_CADENCE_MS = const(6)


class MainsWatch:
    def __init__(self, board, cfg, on_change, on_tier=None):
        self.board = board
        self.level = cfg["mode"] == "level"
        self.active_low = cfg["active_low"]
        self.debounce = cfg["debounce_ms"]
        self.k = cfg["pulse_edges"]
        self.fallback_gap = cfg["pulse_gap_ms"]
        self.gap = self.fallback_gap
        self.sample = cfg["sample_ms"]
        self.on_change = on_change
        # (None, ticks of the last mains edge) on a suspicion; (dip ms, the same) on its dip
        self.on_tier = on_tier
        self.pin = board.input(cfg["pin"], pull_up=self.active_low and cfg["pull_up"])
        self.counter = None
        if not self.level and cfg["counter"]:
            self.counter = board.counter(self.pin, cfg["filter_ns"])
        if self.counter is not None:
            self.k = _COUNTER_RUN
            self.sample = cfg["count_ms"]
            self._count = self.counter.value()
        elif not self.level:
            self.pin.irq(self._edge)
        self.path = "level" if self.level else ("counter" if self.counter is not None else "irq")
        # Written by the interrupt; small ints only, so the handler never allocates.
        self._prev = None  # the last edge of any kind
        self._run = 0  # edges in a row, each within the gap of the one before
        self._run_start = None  # when that run began: the end of a dip
        self._mains_edge = None  # the newest edge that closed a run: mains, not a ghost
        self.cadence = 0  # edges at least _CADENCE_MS apart: mains' rate, ghosts or not
        self._cadence_at = None
        self.glitches = 0
        self.dips = 0
        self.hz = None  # 50, 60; 0 when the rate fits neither; None before a steady second
        self.period_us = 0  # between mains edges, once learned: ms would put 60 Hz 0.33 ms a period out
        self._learn_at = None  # when the steady stretch being measured began
        self._learn_n = 0  # self.cadence then
        self._suspect = None  # ticks of the last mains edge, while a suspicion stands
        self.present = None  # unknown until the first settle
        self.changed_ms = board.ticks_ms()
        self.alive_ms = self.changed_ms  # the watchdog supervisor checks this
        self._cand = None
        self._resume_ms = None  # when the loop came back from its last stall
        self.stalls = 0  # times the loop was held up past the gap (see poll)
        self.stalled_ms = 0

    def _edge(self, _pin):
        # Runs as a (soft) interrupt: no allocation beyond a small int. It runs when the VM gets
        # to it, so the edges a hold-up queued all carry its end; each came after the loop last
        # ran, and only a gap already open then breaks the run (else a 20 ms GC is a dip).
        self._edges_at(self.board.ticks_ms(), 1, since=self.alive_ms)

    def _edges_at(self, t, n, spread=False, first=None, since=None):
        # since: the earliest these edges can have come (the counter's previous read, the loop's
        # last run for a soft IRQ); the run breaks only on a gap they certainly left, or a poll
        # a few ms late would break it
        c = self._cadence_at
        if c is None or self.board.ticks_diff(t, c) >= _CADENCE_MS:
            self._cadence_at = t
            # n edges read at once are one unless they were spread over a stall
            self.cadence += n if spread else 1
        p = self._prev
        if p is not None and self.board.ticks_diff(t if since is None else since, p) < self.gap:
            if self._run < self.k:
                self._run += n
                if (
                    self._run >= self.k
                    and self.counter is not None
                    and self.board.ticks_diff(t, self._run_start) >= self.gap
                ):
                    # In cadence only by the lenient test: the run's first edge (a ghost inside a
                    # dip) may not be mains; these edges are, and came after the previous read.
                    self._run_start = since
        else:
            self._run = n
            self._run_start = t if first is None else first
        self._prev = t
        if self._run >= self.k:
            self._mains_edge = t

    def _read_counter(self, now, last, late=False):
        # last: when the counter was read before; late: the loop was held up since
        c = self.counter.value()
        n = c - self._count
        if n <= 0:
            return
        self._count = c
        t = now
        first = None
        p = self.period_us
        if late and p:
            if self._suspect is not None or not self.present:
                # Mains coming back inside the stall: the first of these edges came n - 1 periods
                # before now (the newest is within a period of now), never before the last read.
                first = self.board.ticks_add(now, -((n - 1) * p // 1000))
                if self.board.ticks_diff(first, last) < 0:
                    first = last
            else:
                # The counter went on through the stall and the edges came a period apart: from
                # the last one seen, the newest is that many periods on. If that is a gap before
                # now, mains went inside the stall and is timed from it, not from the wake;
                # otherwise the train went on and its newest edge is about now (dated so, as an
                # estimate kept would carry its error into the next one).
                e = self._mains_edge
                est = now if e is None else self.board.ticks_add(e, n * p // 1000)
                if self.board.ticks_diff(now, est) >= self.gap and self.board.ticks_diff(est, last) > 0:
                    t = est
        self._edges_at(t, n, late, first, last)

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
            if self.counter is not None:
                self._read_counter(now, self.alive_ms)
            self.alive_ms = now
            if self.raw(now) or self.board.ticks_diff(now, start) >= wait:
                break
        self.present = self.raw(now)
        self.changed_ms = now
        return self.present

    def poll(self, now):
        """One sample; returns True when the debounced state flipped."""
        last = self.alive_ms
        since = self.board.ticks_diff(now, last)
        late = since > self.gap + self.sample
        if late:
            self.stalls += 1
            self.stalled_ms += since
            if self.counter is None:
                # The loop was held up (a long GC, a slow flash write, a starved process in the
                # emulator): interrupts were not handled either, so "no edges" during the stall
                # proves nothing. Absence counts again from now; a real cut is reported that late.
                self._resume_ms = now
                if self.present:
                    self._cand = None  # a loss in progress starts again; a restore goes on
        self.alive_ms = now
        if self.counter is not None:
            self._read_counter(now, last, late)
        r = self.raw(now)
        # The tiers: learn the line while steady; a suspicion when the edges stop (not when a
        # stall hid them from the IRQs); a dip when they come back before the debounce.
        if self.present and r and self._suspect is None:
            # Edges in cadence over a steady second give the line: a rate within 5 % of one an opto
            # gives, or "unknown" (0) and the configured gap stays; measured again every second.
            at = self._learn_at
            took = 0 if at is None else self.board.ticks_diff(now, at)
            if at is None or took >= _LEARN_MS:
                if at is not None:
                    rate = (self.cadence - self._learn_n) * 1000 // took
                    self.hz = 0
                    for edges, hz in RATES:
                        if abs(rate - edges) * 20 <= edges:
                            self.hz = hz
                            self.period_us = 1000000 // edges
                            p = self.period_us // 1000
                            # 1.5 periods, never under a period and a sample (the counter is read
                            # that late at most); soft IRQs lag by whatever holds the VM, so that
                            # path keeps the configured gap if it is longer.
                            self.gap = max(3 * p // 2, p + self.sample + 1, 0 if self.counter else self.fallback_gap)
                self._learn_at = now
                self._learn_n = self.cadence
        elif self.present and not r and self._suspect is None and not (late and self.counter is None):
            last = now if self.level or self._mains_edge is None else self._mains_edge
            self._suspect = last
            self._learn_at = None
            if self.on_tier is not None:
                self.on_tier(None, last)
        elif r and self._suspect is not None:
            # Back before the debounce: the edges missing between the last one and the first of
            # the run that came back, less the period an edge would have come anyway.
            back = now if self.level or self._run_start is None else self._run_start
            dip = self.board.ticks_diff(back, self._suspect) - self.period_us // 1000
            last = self._suspect
            self._suspect = None
            self.dips += 1
            if self.on_tier is not None:
                self.on_tier(max(0, dip), last)
        if r == self.present:
            if self._cand is not None:
                self.glitches += 1
                self._cand = None
            return False
        if self._cand is None:
            e = self._mains_edge
            if not r and not self.level and e is not None:
                # Timed from the last mains edge, but never from before a stall the IRQs missed.
                r0 = self._resume_ms
                self._cand = r0 if r0 is not None and self.board.ticks_diff(r0, e) > 0 else e
            elif r and not self.level and self._run_start is not None:
                self._cand = self._run_start  # back from the first edge of the run that came back
            else:
                self._cand = now
        if self.board.ticks_diff(now, self._cand) < self.debounce:
            return False
        held = self.board.ticks_diff(self._cand, self.changed_ms)
        self.present = r
        self.changed_ms = self._cand
        self._cand = None
        self._suspect = None  # it held: a loss now, not a dip
        self._learn_at = None
        self.on_change(r, held)
        return True

    def snapshot(self):
        """Its part of the sentinel's state: mains now, the line learned, flickers and dips
        counted, loop stalls seen."""
        return {
            "mains": self.present,
            "mains_hz": "unknown" if self.hz == 0 else self.hz,
            "glitches": self.glitches,
            "dips": self.dips,
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
