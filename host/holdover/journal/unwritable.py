"""A journal that cannot write: the words for what is wrong with its file, and the events held in
memory meanwhile (bounded: HELD_MAX, oldest dropped first; each is acted on, and no receipt goes to
its sentinel, so the sentinel's own outbox keeps it and sends it again). The Journal holds one
Held, and journals what it holds once the file takes writes again (Journal.recover)."""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from holdover.journal.schema import Event, event

log = logging.getLogger("holdover.journal")
HELD_MAX = 10_000  # events held in memory while the journal cannot write (about 10 MB at most)


def cause(e: BaseException) -> str:
    """What went wrong, with the OS's errno name where there is one (ENOSPC, EROFS, EACCES)."""
    if isinstance(e, OSError) and e.errno:
        return f"{e.strerror} ({errno.errorcode.get(e.errno, e.errno)})"
    code = getattr(e, "sqlite_errorname", None)
    return f"{e} ({code})" if code else str(e)


def unusable(path: Path, e: BaseException) -> str:
    """What is wrong with a journal file, in words, with what to do ([journal] path names it)."""
    said = str(e)
    if path.is_dir():
        why = "is a directory, not a journal file"
    elif isinstance(e, sqlite3.DatabaseError) and "not a database" in said:
        why = "is not a holdover journal (not an SQLite file)"
    elif not path.exists() and not path.parent.is_dir():
        why = f"cannot be made: {path.parent} is not a directory"
    elif not path.exists():
        why = "does not exist (has the bridge run with this config?)"
    elif isinstance(e, OSError):
        why = f"cannot be opened: {e.strerror or e}"
    elif path.exists() and not os.access(path, os.R_OK):
        why = "cannot be read by this user"
    else:
        why = f"cannot be opened: {said}"
    return f"journal {path} {why}; fix [journal] path in the config"


class Held:
    """The events held while the journal cannot write, by (sentinel, boot, seq), oldest first."""

    def __init__(self, limit: int = HELD_MAX) -> None:
        self.limit = limit
        self.events: OrderedDict[tuple[str, str, int], tuple[str, dict[str, Any]]] = OrderedDict()
        self.dropped = 0  # dropped to stay within the limit (their sentinels still have them)
        self._unjournaled = 0  # the ids of events not journaled count down from -1

    def __contains__(self, key: tuple[str, str, int]) -> bool:
        return key in self.events

    def __len__(self) -> int:
        return len(self.events)

    def hold(self, source: str, body: dict[str, Any]) -> Event:
        while len(self.events) >= self.limit:
            self.events.popitem(last=False)
            self.dropped += 1
        self.events[(body["sid"], body["boot"], body["seq"])] = (source, body)
        return self.unjournaled(source, body)

    def unjournaled(self, source: str, body: dict[str, Any]) -> Event:
        """The event as the reactions see it, with an id no journaled event has."""
        self._unjournaled += 1
        return event(-self._unjournaled, time.time(), source, body)

    def next_host_seq(self) -> int:
        """A host event's seq while it is held: numbered for real when it is journaled."""
        self._unjournaled += 1
        return -self._unjournaled
