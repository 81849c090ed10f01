# The holdover wire protocol, defined once.
#
# This file is imported unchanged by the firmware (MicroPython on the ESP32 and the unix
# port) and by the host (CPython, as holdover.firmware.protocol). It may only use what both
# interpreters have: json, hashlib.sha256, binascii. MicroPython has no hmac module, so
# HMAC-SHA256 (RFC 2104) is written out here and checked against RFC 4231 vectors on both.
#
# Envelope, byte for byte:   {"sig":"<64 hex>","body":<body JSON>}
# The signature covers the body bytes exactly as sent. Re-serialising parsed JSON is not
# an option: MicroPython and CPython order dict keys and format floats differently, so
# the verifier slices the raw body out of the fixed framing instead.

import binascii
import hashlib
import json
import sys

VERSION = 1
ROOT = "holdover"
MAX_PAYLOAD = 2048  # bytes; an ESP32 has ~100 KB of heap, so nothing legitimate is bigger
MAX_SID = 32

STATUS = "status"  # retained "online"/"offline"; "offline" is the last will
STATE = "state"  # retained signed snapshot
EVENT = "event"  # QoS 1, never retained
CMD = "cmd"  # to the sentinel; never retained, never acted on if it arrives retained
CMD_ACK = "cmd/ack"
RELAY_SET = "relay/set"  # plain ON/OFF from Home Assistant, signed and forwarded by the bridge
LEAVES = (STATUS, STATE, EVENT, CMD, CMD_ACK, RELAY_SET)

ONLINE = "online"
OFFLINE = "offline"

# Event kinds a sentinel raises. "critical" kinds are never dropped from a full queue.
BOOT = "boot"
MAINS_LOST = "mains_lost"
MAINS_RESTORED = "mains_restored"
# No mains edge for 1.5 periods: said at once, never alerted, never kept in the outbox (a flash
# write in the watch's first milliseconds is the stall the pulse counter is there to outlast).
MAINS_SUSPECT = "mains_suspect"
MAINS_DIP = "mains_dip"  # a suspicion that cleared before the debounce, with its length
BATTERY_LOW = "battery_low"
BATTERY_CRITICAL = "battery_critical"
BATTERY_OK = "battery_ok"
UPLINK_LOST = "uplink_lost"
UPLINK_RESTORED = "uplink_restored"
RELAY = "relay"
HEARTBEAT = "heartbeat"
EVENT_KINDS = (
    BOOT,
    MAINS_LOST,
    MAINS_RESTORED,
    MAINS_SUSPECT,
    MAINS_DIP,
    BATTERY_LOW,
    BATTERY_CRITICAL,
    BATTERY_OK,
    UPLINK_LOST,
    UPLINK_RESTORED,
    RELAY,
    HEARTBEAT,
)
CRITICAL_KINDS = (MAINS_LOST, MAINS_RESTORED, BATTERY_LOW, BATTERY_CRITICAL, BATTERY_OK)
# Events that report a state: within a boot, a later one of the same family makes an earlier one
# that arrives after it (a resend) history, not news; the bridge journals it and acts on nothing.
FAMILIES = ((MAINS_LOST, MAINS_RESTORED), (UPLINK_LOST, UPLINK_RESTORED), (BATTERY_LOW, BATTERY_CRITICAL, BATTERY_OK))
# Sent as they happen and not kept: neither in the outbox nor in the chain of events ("prev").
TRANSIENT_KINDS = (HEARTBEAT, MAINS_SUSPECT)
# Message kinds that are not events: the state snapshot, a command, a command's answer.
STATE_KIND = "state"
CMD_KIND = "cmd"
ACK_KIND = "ack"
# The bridge's receipt for events it has journaled, on the cmd topic or the serial line: the
# sentinel keeps each event until one names it (end-to-end, where PUBACK is only the broker's).
EVACK_KIND = "evack"
EVACK_MAX = 16  # events named in one receipt
# The longest a sentinel waits before sending an unreceipted event again: an event named as
# another's predecessor and not heard within this (and a margin) was lost, not late.
RESEND_MAX_MS = 60000
KINDS = EVENT_KINDS + (STATE_KIND, CMD_KIND, ACK_KIND, EVACK_KIND)

# Rejection reasons, stable strings the journal and tests rely on.
OVERSIZED = "oversized"
MALFORMED = "malformed"
UNSIGNED = "unsigned"
BAD_SIGNATURE = "bad_signature"
UNKNOWN_SENTINEL = "unknown_sentinel"
SCHEMA = "schema"
REPLAYED = "replayed"
STALE_BOOT = "stale_boot"
RETAINED = "retained"  # a command that arrived with the retain flag
TOO_SOON = "too_soon"  # a relay switch inside its minimum interval
DUPLICATE = "duplicate"  # the same event again, by the other channel (MQTT and serial)
BUSY = "busy"  # a relay pulse already running
NO_RELAY = "no_relay"  # this sentinel has no relay configured
EXPIRED = "expired"  # a command stamped further from the board's clock than CMD_TTL_S
SAFE_MODE = "safe_mode"  # the relay is off limits while the sentinel is in boot-loop safe mode

# Commands to a sentinel (kind "cmd"). The body's boot must be the sentinel's current boot and
# its seq higher than any command seq that boot has accepted: a command from before a reboot,
# or one replayed, is refused without any clock on the board. data: {"op", "id", "ms"}.
CMD_TTL_S = 60  # a command older (or newer) than this by the board's NTP clock is refused
OP_ON = "on"
OP_OFF = "off"
OP_PULSE = "pulse"
OP_RESTART = "restart"  # the board reboots, as ESPHome's restart button does (no relay needed)
OPS = (OP_ON, OP_OFF, OP_PULSE, OP_RESTART)
RESTART_ASKED = "command"  # the reset cause a board reports after a restart it was asked for
PULSE_MAX_MS = 600000

# Serial line protocol: each signed envelope is one line; a line starting with LOG is a log.
LOG = "#"
RUNTIME = "runtime_s"  # remaining runtime, carried by the state and every event while on battery
HA_PREFIX = "homeassistant"


def ha_config_topic(prefix, component, sid, oid):
    # Home Assistant's discovery config of one entity of a sentinel ("+" in a filter): the board
    # publishes these, `holdover ha-remove` empties them. A node's are under ha_node_id(name).
    return "%s/%s/holdover_%s/%s/config" % (prefix, component, sid, oid)


_PREFIX = b'{"sig":"'
_MIDDLE = b'","body":'
_SIG_HEX = 64
_BODY_AT = len(_PREFIX) + _SIG_HEX + len(_MIDDLE)
_HEX = b"0123456789abcdef"
_SID_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"


class ProtocolError(ValueError):
    def __init__(self, reason, detail):
        super().__init__(reason + ": " + detail)
        self.reason = reason
        self.detail = detail


def valid_sid(sid):
    if not isinstance(sid, str) or not 0 < len(sid) <= MAX_SID:
        return False
    for c in sid:
        if c not in _SID_CHARS:
            return False
    return True


def topic(sid, leaf):
    return ROOT + "/" + sid + "/" + leaf


NODE = "node"  # what the journal and the node's topics name the training node by: not a sentinel
ALERTS = ROOT + "/alerts"  # every alert, readable text, from the bridge: for phone MQTT apps on the LAN
UPLINK = "uplink"  # retained JSON from the node's bridge: which uplink carries traffic, each one's health
# The node's own leaves beside UPLINK: STATE, retained JSON (power, the host UPS, the uplink in
# use, the protected runs); STATUS, retained online/offline (offline is the bridge's last will);
# NODE_CHECKPOINT, where Home Assistant's button sends PRESS: a checkpoint of every run now.
NODE_CHECKPOINT = "checkpoint/set"
PRESS = "PRESS"


def node_topic(node, leaf):
    """A training node's own retained state, published by its bridge (unsigned: information for
    dashboards and phone apps; nothing acts on it). Four levels, so no sentinel topic matches."""
    return ROOT + "/" + NODE + "/" + node + "/" + leaf


class Signer:
    """HMAC-SHA256 under one sentinel's key; the padded keys are kept to save work per message."""

    def __init__(self, key):
        if isinstance(key, str):
            key = key.encode()
        if len(key) > 64:
            key = hashlib.sha256(key).digest()
        key = key + b"\x00" * (64 - len(key))
        self._ipad = bytes([b ^ 0x36 for b in key])
        self._opad = bytes([b ^ 0x5C for b in key])

    def digest(self, msg):
        inner = hashlib.sha256(self._ipad)
        inner.update(msg)
        outer = hashlib.sha256(self._opad)
        outer.update(inner.digest())
        return outer.digest()

    def sign(self, msg):
        return binascii.hexlify(self.digest(msg))

    def verify(self, msg, sig_hex):
        want = self.sign(msg)
        if len(want) != len(sig_hex):
            return False
        # Constant time, so a forger learns nothing from how fast a guess is refused.
        diff = 0
        for i in range(len(want)):
            diff |= want[i] ^ sig_hex[i]
        return diff == 0


def body(sid, boot, seq, ms, ts, kind, data):
    return {
        "v": VERSION,
        "sid": sid,
        "boot": boot,
        "seq": seq,
        "ms": ms,
        "ts": ts,
        "kind": kind,
        "data": data,
    }


def seal(signer, fields):
    """The signed envelope for a body dict, as bytes ready for MQTT or a serial line."""
    raw = json.dumps(fields, separators=(",", ":")).encode()
    out = _PREFIX + signer.sign(raw) + _MIDDLE + raw + b"}"
    if len(out) > MAX_PAYLOAD:
        raise ProtocolError(OVERSIZED, "%d bytes > %d" % (len(out), MAX_PAYLOAD))
    return out


def encode(signer, sid, boot, seq, ms, ts, kind, data):
    return seal(signer, body(sid, boot, seq, ms, ts, kind, data))


def unframe(payload):
    """Split an envelope into (sig_hex, raw_body) without trusting anything in it."""
    if isinstance(payload, str):
        payload = payload.encode()
    n = len(payload)
    if n > MAX_PAYLOAD:
        raise ProtocolError(OVERSIZED, "%d bytes > %d" % (n, MAX_PAYLOAD))
    if n == 0:
        raise ProtocolError(MALFORMED, "empty payload")
    if not payload.startswith(_PREFIX):
        if payload[:1] == b"{":
            raise ProtocolError(UNSIGNED, "no leading sig field")
        raise ProtocolError(MALFORMED, "not a JSON envelope")
    if n < _BODY_AT + 3 or payload[_BODY_AT - len(_MIDDLE) : _BODY_AT] != _MIDDLE:
        raise ProtocolError(MALFORMED, "envelope framing")
    sig = payload[len(_PREFIX) : len(_PREFIX) + _SIG_HEX]
    for c in sig:
        if c not in _HEX:
            raise ProtocolError(MALFORMED, "signature is not lowercase hex")
    if payload[n - 1 : n] != b"}":
        raise ProtocolError(MALFORMED, "envelope not closed")
    return sig, payload[_BODY_AT : n - 1]


def _int(v):
    # bool is an int subclass on CPython; a JSON true is never a sequence number.
    return isinstance(v, int) and not isinstance(v, bool)


def check_body(msg, sid=None):
    """Schema of a decoded body; raises ProtocolError(SCHEMA, ...) naming the bad field."""
    if not isinstance(msg, dict):
        raise ProtocolError(SCHEMA, "body is not an object")
    if msg.get("v") != VERSION:
        raise ProtocolError(SCHEMA, "v: unsupported version %r" % (msg.get("v"),))
    s = msg.get("sid")
    if not valid_sid(s):
        raise ProtocolError(SCHEMA, "sid: invalid %r" % (s,))
    if sid is not None and s != sid:
        raise ProtocolError(SCHEMA, "sid: %r in body, %r in topic" % (s, sid))
    boot = msg.get("boot")
    if not isinstance(boot, str) or not 4 <= len(boot) <= 32:
        raise ProtocolError(SCHEMA, "boot: invalid %r" % (boot,))
    seq = msg.get("seq")
    if not _int(seq) or seq < 1:
        raise ProtocolError(SCHEMA, "seq: must be an integer >= 1")
    ms = msg.get("ms")
    if not _int(ms) or ms < 0:
        raise ProtocolError(SCHEMA, "ms: must be an integer >= 0")
    ts = msg.get("ts")
    if ts is not None and not _int(ts):
        raise ProtocolError(SCHEMA, "ts: must be an integer or null")
    kind = msg.get("kind")
    if kind not in KINDS:
        raise ProtocolError(SCHEMA, "kind: unknown %r" % (kind,))
    if not isinstance(msg.get("data"), dict):
        raise ProtocolError(SCHEMA, "data: must be an object")
    return msg


def open_envelope(payload, signer, sid=None):
    """Verify and decode one envelope. Raises ProtocolError with the reason; never anything else."""
    sig, raw = unframe(payload)
    if signer is None:
        raise ProtocolError(UNKNOWN_SENTINEL, "no key for sentinel %r" % (sid,))
    if not signer.verify(raw, sig):
        raise ProtocolError(BAD_SIGNATURE, "HMAC does not match")
    try:
        msg = json.loads(raw)
    except (ValueError, UnicodeError, RuntimeError) as e:  # RuntimeError: nesting too deep
        # Only a holder of the key can get here, but a buggy sender must not crash us either.
        raise ProtocolError(MALFORMED, "body JSON: %s" % e)
    return check_body(msg, sid)


def check_evack(data):
    """The data of an evack body: returns [(boot, seq), ...] or raises ProtocolError(SCHEMA, ...)."""
    got = data.get("events")
    if not isinstance(got, list) or not 1 <= len(got) <= EVACK_MAX:
        raise ProtocolError(SCHEMA, "events: must be a list of 1..%d [boot, seq] pairs" % EVACK_MAX)
    out = []
    for e in got:
        if not isinstance(e, list) or len(e) != 2:
            raise ProtocolError(SCHEMA, "events: each must be [boot, seq]")
        boot, seq = e
        if not isinstance(boot, str) or not 4 <= len(boot) <= 32 or not _int(seq) or seq < 1:
            raise ProtocolError(SCHEMA, "events: bad [boot, seq] %r" % (e,))
        out.append((boot, seq))
    return out


def check_command(data):
    """The data of a cmd body: returns (op, id, ms) or raises ProtocolError(SCHEMA, ...)."""
    op = data.get("op")
    if op not in OPS:
        raise ProtocolError(SCHEMA, "op: must be one of %s, got %r" % (", ".join(OPS), op))
    cid = data.get("id", "")
    if not isinstance(cid, str) or len(cid) > 32:
        raise ProtocolError(SCHEMA, "id: must be a string of at most 32 characters")
    ms = data.get("ms", 0)
    if op == OP_PULSE and (not _int(ms) or not 50 <= ms <= PULSE_MAX_MS):
        raise ProtocolError(SCHEMA, "ms: a pulse must last 50..%d ms" % PULSE_MAX_MS)
    return op, cid, ms


# The host's half: parsing topics and picking a key by a serial line's sid, which the board never
# does. Not defined there, where their bytecode would sit in the heap for nothing (0.5 KB).
if sys.implementation.name != "micropython":

    def ha_node_id(node):
        # A node's device in Home Assistant, apart from the sentinels' (holdover_node_NAME).
        return "node_" + node

    def parse_node_topic(t):
        """(node, leaf) for a node's topic (node_topic), or None."""
        parts = t.split("/", 3)
        if len(parts) != 4 or parts[0] != ROOT or parts[1] != NODE or not parts[2]:
            return None
        return parts[2], parts[3]

    def parse_topic(t):
        """(sid, leaf) for a holdover topic, or None."""
        if not t.startswith(ROOT + "/"):
            return None
        rest = t[len(ROOT) + 1 :]
        i = rest.find("/")
        if i <= 0:
            return None
        sid, leaf = rest[:i], rest[i + 1 :]
        if not valid_sid(sid) or leaf not in LEAVES:
            return None
        return sid, leaf

    def peek_sid(payload):
        """The body's sid, read without trusting it, to pick a key when the topic gives none (serial)."""
        try:
            msg = json.loads(unframe(payload)[1])
        except (ValueError, UnicodeError, RuntimeError):  # RuntimeError: nesting too deep
            raise ProtocolError(MALFORMED, "body JSON")
        s = msg.get("sid") if isinstance(msg, dict) else None
        if not valid_sid(s):
            raise ProtocolError(SCHEMA, "sid: invalid %r" % (s,))
        return s
