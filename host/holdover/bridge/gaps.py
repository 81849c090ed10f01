"""Gaps in a sentinel's events: each event names its predecessor, and one named but not heard is
late (the sentinel's outbox sends again until receipted, in order) or lost from its RAM. After the
bridge was away, new events can arrive before the outbox's next resend of older ones, so a gap is
said only once the sentinel has had its chance to fill it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from holdover.firmware import protocol
from holdover.journal import Event

log = logging.getLogger("holdover.bridge")

# The outbox's longest wait before a resend, and a margin for the broker and a busy board.
WAIT_S = protocol.RESEND_MAX_MS / 1000 + 15

Key = tuple[str, str, int]  # (sentinel, boot, seq) of the event not heard yet


class Gaps:
    def __init__(self, heard: Callable[[Key], bool], clock: Callable[[], float] = time.monotonic) -> None:
        self.heard = heard  # is this event journaled (or held) already
        self.clock = clock
        self.wait_s = WAIT_S
        self.open: dict[Key, tuple[int, float]] = {}  # the missing one -> (who named it, when)
        self.lost: dict[str, int] = {}  # per sentinel: events never heard

    def arrived(self, event: Event) -> None:
        """An accepted event: it may fill a gap, and it may name one."""
        key = (event.sid, event.boot, event.seq)
        if (named := self.open.pop(key, None)) is not None:
            log.info(
                "%s: seq %d came %.0f s after seq %d named it (the sentinel's outbox sent it again)",
                event.sid,
                event.seq,
                self.clock() - named[1],
                named[0],
            )
        prev = event.data.get("prev")
        if isinstance(prev, int) and prev > 0:
            missing = (event.sid, event.boot, prev)
            if missing not in self.open and not self.heard(missing):
                self.open[missing] = (event.seq, self.clock())

    def judge(self) -> None:
        """Say each gap the sentinel has not filled within its resend time: that event is lost."""
        now = self.clock()
        for key, (by, since) in list(self.open.items()):
            if now - since < self.wait_s:
                continue
            del self.open[key]
            if self.heard(key):  # by a way arrived() did not see (the journal's recovery)
                continue
            sid, boot, seq = key
            self.lost[sid] = self.lost.get(sid, 0) + 1
            log.warning(
                "%s: event gap in boot %s: seq %d, named by seq %d, not heard in %.0f s: lost on the sentinel",
                sid,
                boot,
                seq,
                by,
                now - since,
            )
