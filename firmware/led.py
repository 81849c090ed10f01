# The status LED: what a person standing at the rack can read without a laptop.
#
# ESPHome's status_led grammar, with a blip for "alive": one short flash every 3 s when all is
# well (an LED that is simply off cannot tell "fine" from "dead"), a slow blink for a warning
# (on battery, uplink down, battery low), a fast blink for an error (no broker, safe mode:
# the bridge cannot hear this sentinel). Blink patterns are (on_ms, off_ms) pairs.
import asyncio

OK = "ok"
WARNING = "warning"
ERROR = "error"
PATTERNS = {
    OK: (60, 2940),
    WARNING: (500, 500),
    ERROR: (100, 100),
}


class StatusLed:
    def __init__(self, board, cfg, judge):
        self.board = board
        self.out = board.led(cfg["pin"], cfg["active_low"])
        self.judge = judge  # () -> OK, WARNING or ERROR, from the sentinel's view of things
        self.shown = None

    def snapshot(self):
        return {"led": self.shown}

    async def run(self):
        while True:
            # Judged once per blink, so a change shows within one period (3 s at most).
            self.shown = self.judge()
            on_ms, off_ms = PATTERNS[self.shown]
            self.out.value(1)
            await asyncio.sleep_ms(on_ms)
            self.out.value(0)
            await asyncio.sleep_ms(off_ms)
