# A small MQTT 3.1.1 client that never blocks the event loop.
#
# Written by hand because no installable MicroPython client fits: umqtt blocks on every
# call (and a QoS 1 publish spins forever waiting for PUBACK), and mqtt_as's publish()
# awaits the connection, parking its caller. Here publish() only queues; one connection
# task owns the socket, retransmits QoS 1 until PUBACK, pings, and reconnects with backoff.
# Everything awaits with a timeout, so the power-watch task keeps running whatever the
# network does.
import asyncio
import struct

CONNECT = 0x10
CONNACK = 0x20
PUBLISH = 0x30
PUBACK = 0x40
SUBSCRIBE = 0x82
SUBACK = 0x90
PINGREQ = 0xC0
PINGRESP = 0xD0
DISCONNECT = 0xE0

MAX_IN = 2048  # a bigger incoming packet is read and thrown away; the heap cannot afford it
_DISCARD = 256  # bytes read at a time while throwing a packet away
INFLIGHT = 8  # unacknowledged QoS 1 publishes on the wire at once
MAX_TRIES = 3  # unanswered sends of one message before the connection is declared dead


class MQTTError(OSError):
    pass


def _str(s):
    if isinstance(s, str):
        s = s.encode()
    return struct.pack("!H", len(s)) + s


def _varlen(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _packet(kind, body):
    return bytes([kind]) + _varlen(len(body)) + body


class Message:
    def __init__(self, topic, payload, retain, qos, critical):
        self.topic = topic
        self.payload = payload
        self.retain = retain
        self.qos = qos
        self.critical = critical
        self.pid = 0
        self.sent_ms = None  # ticks of the last send on the current connection, None = unsent
        self.tries = 0


class Client:
    def __init__(self, board, cfg, client_id, will=None, on_connect=None, on_message=None, log=None):
        self.board = board
        self.host = cfg["host"]
        self.port = cfg["port"]
        self.user = cfg.get("user") or ""
        self.password = cfg.get("password") or ""
        self.keepalive = cfg["keepalive_s"]
        self.ack_timeout = cfg["ack_timeout_ms"]
        self.backoff_min = cfg["backoff_min_ms"]
        self.backoff_max = cfg["backoff_max_ms"]
        self.queue_len = cfg["queue_len"]
        self.client_id = client_id
        self.will = will  # (topic, payload, retain, qos)
        self.on_connect = on_connect
        self.on_message = on_message
        self.log = log or (lambda *a: None)
        self.outbox = []
        self.subs = []
        self.connected = False
        self.dropped = 0
        self.connects = 0
        self._pid = 0
        self._w = None
        self._kick = asyncio.Event()
        # Two tasks draining one MicroPython stream at once trip an assertion in its I/O queue.
        self._lock = asyncio.Lock()
        self._last_tx = 0
        self._last_rx = 0
        self._last_ping = 0
        self._session_ok = False  # this session reached CONNACK: the next reconnect starts fast
        self.oversized = 0  # incoming packets thrown away for their size
        self.sub_failed = []  # filters the broker refused (SUBACK 0x80)
        self._sub_pids = {}  # SUBSCRIBE packet id -> filter, until its SUBACK
        self._dropped_pid = None
        self._reader_end = None

    # --- API used by the application; none of it awaits -----------------------------

    def publish(self, topic, payload, retain=False, qos=1, critical=False, first=False):
        if retain:
            # A retained topic only ever needs its newest value: replace one still unsent, and
            # forget one sent but unacknowledged (into a dead link, say; its PUBACK, should it
            # come, matches nothing). Otherwise a silent link piles up a state per event.
            for m in list(self.outbox):
                if m.topic == topic and m.retain:
                    if m.sent_ms is None:
                        m.payload = payload
                        self._kick.set()
                        return m
                    self.outbox.remove(m)
        m = Message(topic, payload, retain, qos, critical)
        if first:
            self.outbox.insert(0, m)
        else:
            self.outbox.append(m)
        if len(self.outbox) > self.queue_len:
            self._drop_one()
        self._kick.set()
        return m

    def subscribe(self, topic_filter):
        if topic_filter not in self.subs:
            self.subs.append(topic_filter)

    def pending(self):
        return len(self.outbox)

    def _drop_one(self):
        # Telemetry goes first; a critical message only when nothing else is left (an event
        # dropped here is still on flash in the sentinel's outbox, which sends it again).
        victim = None
        for m in self.outbox:
            if victim is None or (victim.critical and not m.critical):
                victim = m
                if not m.critical:
                    break
        if victim is None:
            return
        self.outbox.remove(victim)
        self.dropped += 1
        self.log("mqtt", "queue full, dropped", victim.topic)

    # --- connection task -------------------------------------------------------------

    async def run(self):
        backoff = self.backoff_min
        while True:
            if self.board.net_up():
                self._session_ok = False
                try:
                    await self._session()
                except Exception as e:  # any failure of one session just means: reconnect
                    self.log("mqtt", "session ended:", repr(e))
                await self._close()
                if self._session_ok:
                    # The broker took us: this drop is news, not a pattern. Back off from the
                    # start, or the fifth short radio cut would wait the longest backoff.
                    backoff = self.backoff_min
            await asyncio.sleep_ms(backoff)
            backoff = min(backoff * 2, self.backoff_max)

    async def _close(self):
        self.connected = False
        w, self._w = self._w, None
        if w is not None:
            # MicroPython's Stream.close() does nothing: the socket is closed by wait_closed().
            # Skipping it leaks one lwIP socket per reconnect until the ESP32 has none left.
            try:
                w.close()
                await asyncio.wait_for_ms(w.wait_closed(), 1000)
            except Exception:
                pass
        for m in self.outbox:
            # Unsent again: a new connection gives it a new packet id, so no stale PUBACK matches.
            m.sent_ms = None
            m.tries = 0
            m.pid = 0

    async def _write(self, data):
        async with self._lock:
            self._w.write(data)
            await asyncio.wait_for_ms(self._w.drain(), self.ack_timeout)
        self._last_tx = self.board.ticks_ms()

    def _connect_packet(self):
        flags = 0x02  # clean session: unacked messages are ours to resend, and we do
        payload = _str(self.client_id)
        if self.will:
            t, p, retain, qos = self.will
            flags |= 0x04 | (qos << 3) | (0x20 if retain else 0)
            payload += _str(t) + _str(p)
        if self.user:
            flags |= 0x80
            payload += _str(self.user)
            if self.password:
                flags |= 0x40
                payload += _str(self.password)
        var = _str("MQTT") + bytes([4, flags]) + struct.pack("!H", self.keepalive)
        return _packet(CONNECT, var + payload)

    async def _session(self):
        ticks, diff = self.board.ticks_ms, self.board.ticks_diff
        r, w = await asyncio.wait_for_ms(self.board.open_connection(self.host, self.port), self.ack_timeout * 2)
        self._w = w
        await self._write(self._connect_packet())
        kind, body = await asyncio.wait_for_ms(self._read_packet(r), self.ack_timeout * 2)
        if kind != CONNACK or len(body) != 2:
            raise MQTTError("expected CONNACK, got 0x%02x" % kind)
        if body[1] != 0:
            raise MQTTError("broker refused connection, code %d" % body[1])
        self._last_rx = self._last_ping = ticks()
        self._session_ok = True
        self.connected = True
        self.connects += 1
        self.log("mqtt", "connected to %s:%d" % (self.host, self.port))
        self._sub_pids = {}
        for f in self.subs:
            self._pid = self._pid % 65535 + 1
            self._sub_pids[self._pid] = f
            await self._write(_packet(SUBSCRIBE, struct.pack("!H", self._pid) + _str(f) + b"\x01"))
        if self.on_connect:
            self.on_connect()
        self._reader_end = None
        reader = asyncio.create_task(self._reader_task(r))
        try:
            ping_every = self.keepalive * 500
            while True:
                if reader.done():
                    raise MQTTError("reader stopped: %r" % (self._reader_end,))
                now = ticks()
                if diff(now, self._last_rx) > self.keepalive * 1000:
                    raise MQTTError("no traffic from broker for %d s" % self.keepalive)
                await self._send_due(now)
                # Ping when we have been quiet *or* the broker has: a client that only sends
                # (QoS 0 telemetry) hears nothing back, and would call its own link dead.
                quiet = diff(now, self._last_tx) >= ping_every or diff(now, self._last_rx) >= ping_every
                if quiet and diff(now, self._last_ping) >= ping_every:
                    self._last_ping = now
                    await self._write(b"\xc0\x00")
                self._kick.clear()
                try:
                    await asyncio.wait_for_ms(self._kick.wait(), 100)
                except asyncio.TimeoutError:  # MicroPython has no builtin TimeoutError
                    pass
        finally:
            reader.cancel()

    async def _send_due(self, now):
        diff = self.board.ticks_diff
        inflight = 0
        for m in list(self.outbox):
            if m.sent_ms is not None:
                if m.qos == 0 or diff(now, m.sent_ms) < self.ack_timeout:
                    inflight += 1
                    continue
                if m.tries >= MAX_TRIES:
                    raise MQTTError("no PUBACK for pid %d after %d sends" % (m.pid, m.tries))
            elif inflight >= INFLIGHT:
                break
            dup = m.sent_ms is not None
            if m.qos and not dup:
                self._pid = self._pid % 65535 + 1
                m.pid = self._pid
            head = PUBLISH | (0x08 if dup else 0) | (m.qos << 1) | (1 if m.retain else 0)
            var = _str(m.topic) + (struct.pack("!H", m.pid) if m.qos else b"")
            # Marked sent before the write: its PUBACK can arrive while drain() is still awaiting.
            m.sent_ms = now
            m.tries += 1
            inflight += 1
            await self._write(_packet(head, var + m.payload))
            if m.qos == 0:
                self.outbox.remove(m)

    async def _read_packet(self, r):
        head = (await r.readexactly(1))[0]
        n, shift = 0, 0
        while True:
            b = (await r.readexactly(1))[0]
            n |= (b & 0x7F) << shift
            if not b & 0x80:
                break
            shift += 7
            if shift > 21:
                raise MQTTError("bad remaining length")
        if n > MAX_IN:
            self._dropped_pid = await self._discard(r, head, n)
            return head, None
        body = await r.readexactly(n) if n else b""
        return head, body

    async def _discard(self, r, head, n):
        """Read an oversized packet off the wire without keeping it; returns a QoS 1 PUBLISH's
        packet id (to acknowledge it, so the broker does not send it again), else None."""
        self.oversized += 1
        pid = None
        if head & 0xF0 == PUBLISH and n >= 2:
            tlen = struct.unpack("!H", await r.readexactly(2))[0]
            n -= 2
            while tlen and n:
                k = min(tlen, _DISCARD, n)
                await r.readexactly(k)
                tlen -= k
                n -= k
            if (head >> 1) & 3 and n >= 2:
                pid = await r.readexactly(2)
                n -= 2
        while n:
            k = min(n, _DISCARD)
            await r.readexactly(k)
            n -= k
        return pid

    async def _reader_task(self, r):
        # MicroPython reports a task's exception the moment the task ends with nobody awaiting
        # it, as a traceback on the console the serial channel shares; so the reader never
        # raises, and the session loop reads how it ended from here.
        try:
            await self._reader(r)
        except Exception as e:
            self._reader_end = e

    async def _reader(self, r):
        while True:
            head, body = await self._read_packet(r)
            self._last_rx = self.board.ticks_ms()
            kind = head & 0xF0
            if body is None:
                # Thrown away for its size (one 4 KB retained command must not cycle the link).
                self.log("mqtt", "dropped an incoming packet over %d bytes" % MAX_IN)
                if self._dropped_pid is not None:
                    await self._write(b"\x40\x02" + self._dropped_pid)
                continue
            if kind == PUBACK:
                pid = struct.unpack("!H", body)[0]
                for m in self.outbox:
                    if m.pid == pid and m.sent_ms is not None:
                        self.outbox.remove(m)
                        self._kick.set()
                        break
            elif kind == PUBLISH:
                qos = (head >> 1) & 3
                tlen = struct.unpack("!H", body[:2])[0]
                topic = body[2 : 2 + tlen].decode()
                pos = 2 + tlen
                if qos:
                    pid = body[pos : pos + 2]
                    pos += 2
                    await self._write(b"\x40\x02" + pid)
                if self.on_message:
                    try:
                        self.on_message(topic, body[pos:], bool(head & 1))
                    except Exception as e:  # a bad command must not take the link down
                        self.log("mqtt", "message handler failed:", repr(e))
            elif kind == SUBACK and len(body) >= 3:
                f = self._sub_pids.pop(struct.unpack("!H", body[:2])[0], None)
                if body[2] & 0x80:
                    # Refused (an ACL, a bad filter): commands will never arrive; say so in state.
                    self.log("mqtt", "broker refused subscription", f)
                    if f is not None and f not in self.sub_failed:
                        self.sub_failed.append(f)
                elif f in self.sub_failed:
                    self.sub_failed.remove(f)
            # PINGRESP only proves the link is alive, which _last_rx records.

    async def disconnect(self):
        if self._w is not None and self.connected:
            try:
                await self._write(_packet(DISCONNECT, b""))
            except Exception:
                pass
        await self._close()
