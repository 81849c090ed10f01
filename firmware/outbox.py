# The outbox: every event waits on flash until the *bridge* has acknowledged it.
#
# MQTT's PUBACK only says the broker has a message; a broker restarted without persistence, or
# one whose bridge session is gone, acknowledges and then drops it. So an event leaves here only
# on the bridge's signed receipt (protocol.EVACK_KIND, by MQTT or serial), and is sent again with
# backoff until one comes; the bridge journals by (sentinel, boot, seq), so a repeat costs a
# duplicate, never a second hook run. Events go out strictly in the order raised, `window` at a
# time: a new one waits on flash behind older ones still unreceipted.
#
# On flash: an append-only file of one signed envelope per line, read forward by a cursor.
# Appending and a head pointer saved at most once a second is what the flash's wear wants (the
# ESP32 port's LittleFS spreads the writes; NVS blobs are too small for 48 KB of events).
# `head` (the first unacknowledged byte) survives a reboot, so events raised before it are sent
# again in their order, with their original times. Telemetry never comes here (the heartbeat
# lives in the MQTT queue only). The last quarter of the cap is kept for critical events: past
# three quarters other events are refused (and counted), and only a completely full file
# refuses a critical one.
import json
import os

import protocol

RETRY_MIN_MS = 3000  # a receipt takes one broker round trip; this is several
RETRY_MAX_MS = protocol.RESEND_MAX_MS


def ident(payload):
    """(boot, seq) of an envelope this sentinel sealed itself."""
    body = json.loads(protocol.unframe(payload)[1])
    return body["boot"], body["seq"]


class _Pending:
    # One event sent and not yet receipted: where it sits in the file, who it is, when to resend.
    def __init__(self, start, end, payload, now):
        self.start = start
        self.end = end
        self.payload = payload
        self.boot, self.seq = ident(payload)
        self.sent = now
        self.delay = 0  # ms after `sent` that the next send is due
        self.tries = 0
        self.handle = None  # what send() returned last time, passed back on a resend


class Outbox:
    def __init__(self, board, path, cap_bytes, send, window=4):
        self.board = board
        self.path = path
        self.pos_path = path + ".pos"
        self.cap = cap_bytes
        self.send = send  # (payload, handle) -> handle
        self.window = window  # events in RAM at once; the rest wait on flash
        self.refused = 0
        self.resent = 0
        self.head = 0
        try:
            with open(self.pos_path) as f:
                self.head = int(f.read())
        except (OSError, ValueError):
            pass
        self.size = self._size()
        if self.head > self.size:
            self.head = 0
        self.read_at = self.head
        self.inflight = []
        self._done = []  # (start, end) of receipted lines past head
        self._dirty = False

    def _size(self):
        try:
            return os.stat(self.path)[6]
        except OSError:
            return 0

    def pending(self):
        return self.size - self.head

    def append(self, payload, critical=False):
        """Keep one sealed event on flash and send it when the window allows; False if refused."""
        limit = self.cap if critical else self.cap * 3 // 4
        if self.size + len(payload) + 1 > limit:
            self.refused += 1
            return False
        with open(self.path, "ab") as f:
            f.write(payload)
            f.write(b"\n")
        self.size += len(payload) + 1
        self.pump()
        return True

    def _read(self):
        if self.read_at >= self.size:
            return None
        with open(self.path, "rb") as f:
            f.seek(self.read_at)
            line = f.readline()
        if not line.endswith(b"\n"):  # a line cut short by a reset mid-write: skip the rest
            self.read_at = self.size
            return None
        start = self.read_at
        self.read_at += len(line)
        return start, self.read_at, line[:-1]

    def pump(self):
        """Fill the window from flash, and send again whatever is due. Called on every change and
        once a second by the supervisor."""
        now = self.board.ticks_ms()
        while len(self.inflight) < self.window:
            got = self._read()
            if got is None:
                break
            try:
                p = _Pending(got[0], got[1], got[2], now)
            except (ValueError, KeyError, protocol.ProtocolError):
                self._receipted(got[0], got[1])  # not ours to deliver (a torn line): step over it
                continue
            self.inflight.append(p)
        diff = self.board.ticks_diff
        for p in self.inflight:
            if diff(now, p.sent) < p.delay:
                continue
            if p.tries:
                self.resent += 1
            p.handle = self.send(p.payload, p.handle)
            p.tries += 1
            p.sent = now
            p.delay = min(RETRY_MAX_MS, RETRY_MIN_MS << min(p.tries - 1, 5))

    def receipt(self, boot, seq):
        """The bridge has (boot, seq): it leaves the outbox. True if it was waiting here."""
        for p in self.inflight:
            if p.seq == seq and p.boot == boot:
                self.inflight.remove(p)
                self._receipted(p.start, p.end)
                self.hurry()  # the bridge is there: what it has not receipted need not wait long
                self.pump()
                return True
        return False  # a repeat receipt, or one for an event sent before a reboot and receipted since

    def hurry(self):
        """The way to the bridge is open again (a receipt came, the broker is back): nothing waits
        more than the shortest retry, instead of up to a minute of backoff."""
        for p in self.inflight:
            if p.delay > RETRY_MIN_MS:
                p.delay = RETRY_MIN_MS

    def _receipted(self, start, end):
        self._done.append((start, end))
        moved = True
        while moved:
            moved = False
            for span in self._done:
                if span[0] == self.head:
                    self.head = span[1]
                    self._done.remove(span)
                    self._dirty = moved = True
                    break

    def flush(self):
        """Save head; once everything is receipted, start an empty file."""
        if not self._dirty:
            return
        self._dirty = False
        if self.head >= self.size and self.read_at >= self.size:
            try:
                os.remove(self.path)
            except OSError:
                pass
            self.size = self.head = self.read_at = 0
        with open(self.pos_path, "w") as f:
            f.write(str(self.head))
