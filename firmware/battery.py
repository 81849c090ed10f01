# Battery voltage through a divider on an ADC1 pin, state of charge from a discharge curve,
# and the runtime left at the configured load; low and critical with hysteresis.
LEVEL_OK = "ok"
LEVEL_LOW = "low"
LEVEL_CRITICAL = "critical"


class Battery:
    def __init__(self, board, cfg, on_level):
        self.cfg = cfg
        self.adc = board.adc(cfg["pin"])
        self.on_level = on_level  # (level, previous level)
        self.volts = None
        self.level = LEVEL_OK
        self.alive_ms = board.ticks_ms()
        self.board = board

    def read(self):
        # Many samples in a row average out the ESP32 ADC's noise (a few tens of mV per reading).
        n = self.cfg["samples"]
        total = 0
        for _ in range(n):
            total += self.adc.read_uv()
        v = total / n / 1000000 * self.cfg["divider"] + self.cfg["offset_v"]
        # A little smoothing across reads, so a relay click's sag does not flip the level.
        self.volts = v if self.volts is None else self.volts * 0.75 + v * 0.25
        return self.volts

    def percent(self):
        if self.volts is None:
            return None
        v = self.volts / self.cfg["cells"]
        curve = self.cfg["curve"]
        if v <= curve[0][0]:
            return curve[0][1]
        for i in range(1, len(curve)):
            (v0, p0), (v1, p1) = curve[i - 1], curve[i]
            if v <= v1:
                return p0 + (p1 - p0) * (v - v0) / (v1 - v0)
        return curve[-1][1]

    def runtime_s(self):
        p = self.percent()
        if p is None:
            return None
        return int(p / 100 * self.cfg["capacity_wh"] / self.cfg["load_w"] * 3600)

    def judge(self):
        """Move between ok, low and critical; returns the new level when it changed."""
        p = self.percent()
        c = self.cfg
        new = self.level
        if p <= c["critical_pct"]:
            new = LEVEL_CRITICAL
        elif p <= c["low_pct"]:
            if self.level == LEVEL_OK or p > c["critical_pct"] + c["hysteresis_pct"]:
                new = LEVEL_LOW
        elif p > c["low_pct"] + c["hysteresis_pct"]:
            new = LEVEL_OK
        elif self.level == LEVEL_CRITICAL:
            new = LEVEL_LOW
        if new == self.level:
            return None
        prev, self.level = self.level, new
        if prev == LEVEL_CRITICAL and new == LEVEL_LOW:
            return None  # recovering, not a new alarm: battery_low would start a second rescue
        self.on_level(new, prev)
        return new

    def snapshot(self):
        p = self.percent()
        return {
            "battery_v": None if self.volts is None else round(self.volts, 3),
            "battery_pct": None if p is None else round(p, 1),
            "battery_level": self.level,
        }

    async def run(self):
        import asyncio

        self.read()
        self.judge()  # a board that boots on a low battery says so at once
        while True:
            await asyncio.sleep_ms(self.cfg["interval_ms"])
            self.read()
            self.alive_ms = self.board.ticks_ms()
            self.judge()
