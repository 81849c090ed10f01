# Uplink watch: several targets probed together every interval, judged like mwan3 but faster.
#
# A round is good when at least `reliability` targets answered. The uplink goes down after
# `down` bad rounds in a row and comes back after `up` good ones, so one dead target or a lost
# probe never raises anything; "degraded" (up, but some target failing or lossy) is state only.
import asyncio
import os
import struct

import netio

UNKNOWN = "unknown"
UP = "up"
DEGRADED = "degraded"
DOWN = "down"
_DNS_NAME = b"\x07example\x03com\x00"  # asked of the resolver; any well-formed answer proves it alive


class Target:
    def __init__(self, t, timeout_ms, window):
        self.kind = t["kind"]
        self.port = t.get("port", 53)
        self.name = t.get("name") or "%s %s:%d" % (self.kind, t["host"], self.port)
        self.addr = netio.addr(t["host"], self.port)
        self.timeout = t.get("timeout_ms") or timeout_ms
        self.window = window
        self.mask = (1 << window) - 1
        self.hist = 0  # one bit per probe, newest lowest: 1 = answered
        self.n = 0
        self.rtt = None
        self.qid = 0

    def record(self, rtt):
        self.hist = ((self.hist << 1) | (rtt is not None)) & self.mask
        self.n = min(self.n + 1, self.window)
        if rtt is not None:
            self.rtt = rtt

    def loss_pct(self):
        if not self.n:
            return 0
        return (self.n - bin(self.hist & ((1 << self.n) - 1)).count("1")) * 100 // self.n

    async def probe(self):
        if self.kind == "tcp":
            return await netio.exchange(self.addr, self.timeout)
        self.qid = struct.unpack("H", os.urandom(2))[0]
        q = struct.pack("!HHHHHH", self.qid, 0x0100, 1, 0, 0, 0) + _DNS_NAME + b"\x00\x01\x00\x01"
        return await netio.exchange(self.addr, self.timeout, udp=True, send=q, accept=self._answer)

    def _answer(self, r):
        # Our id, a response, and not SERVFAIL/REFUSED: a resolver that cannot reach upstream is down.
        if len(r) < 12 or struct.unpack("!H", r[:2])[0] != self.qid:
            return False
        return bool(r[2] & 0x80) and (r[3] & 0x0F) not in (2, 5)


class UplinkWatch:
    def __init__(self, board, cfg, on_change):
        self.board = board
        self.cfg = cfg
        self.on_change = on_change  # (up, outage_ms)
        self.targets = [Target(t, cfg["timeout_ms"], cfg["window"]) for t in cfg["targets"]]
        self.up = None
        self._good = 0
        self._bad = 0
        self.last_ok_ms = board.ticks_ms()  # the last good round
        self.down_since_ms = None
        self.rounds = 0

    def status(self):
        if self.up is None:
            return UNKNOWN
        if not self.up:
            return DOWN
        for t in self.targets:
            if t.loss_pct() >= self.cfg["degraded_loss_pct"] or not t.hist & 1:
                return DEGRADED
        return UP

    def snapshot(self):
        return [{"name": t.name, "rtt_ms": t.rtt, "loss_pct": t.loss_pct()} for t in self.targets]

    def judge(self, results, now):
        """Feed one round's RTTs (None = lost); returns True when up/down flipped."""
        ok = 0
        for t, rtt in zip(self.targets, results):
            t.record(rtt)
            ok += rtt is not None
        self.rounds += 1
        if ok >= self.cfg["reliability"]:
            self._good += 1
            self._bad = 0
            self.last_ok_ms = now
            if self.up is not True and self._good >= self.cfg["up"]:
                was_down = self.up is False
                self.up = True
                if was_down:
                    self.on_change(True, self.board.ticks_diff(now, self.down_since_ms))
                return was_down
            return False
        self._bad += 1
        self._good = 0
        if self.up is not False and self._bad >= self.cfg["down"]:
            self.up = False
            # The outage began after the last good round; it is timed from there.
            self.down_since_ms = self.last_ok_ms
            self.on_change(False, self.board.ticks_diff(now, self.down_since_ms))
            return True
        return False

    async def run(self):
        if not self.targets:
            return
        interval = self.cfg["interval_ms"]
        ticks, diff = self.board.ticks_ms, self.board.ticks_diff
        while not self.board.net_up():
            # Before the first join nothing was ever reachable: no evidence about the uplink yet.
            await asyncio.sleep_ms(100)
        while True:
            t0 = ticks()
            if self.board.net_up():
                results = await asyncio.gather(*[t.probe() for t in self.targets])
                if not self.board.net_up():  # the radio dropped mid-round: nothing came over it
                    results = [None] * len(self.targets)
            else:
                results = [None] * len(self.targets)
            self.judge(results, ticks())
            await asyncio.sleep_ms(max(0, interval - diff(ticks(), t0)))
