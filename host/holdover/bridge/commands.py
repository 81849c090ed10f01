"""What the bridge signs for a sentinel: relay commands, and receipts for the events it has journaled.

A command names the sentinel's current boot and carries a sequence number above any the
sentinel has accepted in that boot, so a command recorded earlier, or from before a reboot,
is refused on the board without any clock there. The sequence is the sender's wall clock in
milliseconds, which keeps rising across bridge and CLI restarts.
"""

from __future__ import annotations

import secrets
import threading
import time
from typing import Any

from holdover.firmware import protocol

_last = 0
_lock = threading.Lock()


class CommandError(RuntimeError):
    pass


def next_seq() -> int:
    global _last
    with _lock:
        _last = max(_last + 1, time.time_ns() // 1_000_000)
        return _last


def build(key: bytes | str, sid: str, boot: str, op: str, ms: int = 0, cid: str | None = None) -> tuple[bytes, str]:
    """(envelope, command id) for one relay command."""
    data: dict[str, Any] = {"op": op, "id": cid or secrets.token_hex(4)}
    if op == protocol.OP_PULSE:
        data["ms"] = ms
    protocol.check_command(data)  # refuse here what the board would refuse
    payload = protocol.encode(protocol.Signer(key), sid, boot, next_seq(), 0, int(time.time()), protocol.CMD_KIND, data)
    return payload, data["id"]


def build_receipt(key: bytes | str, sid: str, events: list[tuple[str, int]]) -> bytes:
    """An evack envelope naming journaled events, so the sentinel can let them go from its outbox.

    Its own boot and seq mean nothing to the sentinel (a receipt is idempotent); they are the
    bridge's, to keep the envelope's schema.
    """
    data = {"events": [[b, s] for b, s in events]}
    protocol.check_evack(data)
    return protocol.encode(
        protocol.Signer(key), sid, "bridge", next_seq(), 0, int(time.time()), protocol.EVACK_KIND, data
    )
