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
from collections.abc import Collection
from pathlib import Path
from typing import Any

from holdover.journal.schema import Event, event

log = logging.getLogger("holdover.journal")
HELD_MAX = 10_000  # events held in memory while the journal cannot write (about 10 MB at most)


def cause(e: BaseException) -> str:
    """What went wrong, with the OS's errno name where there is one (ENOSPC, EROFS, EACCES)."""
    if isinstance(e, OSError) and e.errno:
        return in_words(e)
    code = getattr(e, "sqlite_errorname", None)
    if code == "SQLITE_FULL":
        return "the disk is full (SQLITE_FULL)"
    if code == "SQLITE_READONLY":
        return f"the file or its file system is read-only ({code})"
    return f"{e} ({code})" if code else str(e)


# The OS's reasons a file cannot be written, as a person would say them.
IN_WORDS = {
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.ENOENT: "no such directory",
    errno.ENOTDIR: "a part of the path is not a directory",
    errno.EIO: "an I/O error (the disk may be failing)",
}


def in_words(e: OSError) -> str:
    """An OS error as a person says it, with its errno name for a search: "the file system is
    read-only (EROFS)"."""
    name = errno.errorcode.get(e.errno or 0, "")
    words = IN_WORDS.get(e.errno or 0) or e.strerror or str(e)
    return f"{words} ({name})" if name else words


def why_not_writable(path: Path) -> OSError | None:
    """The OS's own reason the journal cannot be written where it is, found by doing what SQLite
    does (make the directory, open the file, make a file beside it for the WAL); SQLite says only
    "unable to open database file" for all of them. None: the OS lets it."""
    made = not path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        if made:
            path.unlink()  # a probe leaves nothing: an empty file would read as "no journal yet"
        probe = path.with_name(f".{path.name}.probe-{os.getpid()}")
        os.close(os.open(probe, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
        probe.unlink()
    except OSError as e:
        return e
    return None


def unusable(path: Path, e: BaseException, writing: bool = False) -> str:
    """What is wrong with a journal file, in words, with what to do ([journal] path names it).
    `writing`: the bridge's view (the OS's own reason it cannot write there), not a reader's."""
    said = str(e)
    blocked = next((p for p in path.parents if p.exists()), None)  # the nearest part that exists
    if path.is_dir():
        why = "is a directory, not a journal file"
    elif isinstance(e, sqlite3.DatabaseError) and "not a database" in said:
        why = "is not a holdover journal (not an SQLite file)"
    elif blocked is not None and not blocked.is_dir():
        why = f"cannot be made: {blocked} is not a directory"
    elif getattr(e, "sqlite_errorname", None) == "SQLITE_FULL":
        return f"journal {path} cannot be written: {cause(e)}; free space on it"
    elif writing and (os_said := e if isinstance(e, OSError) else why_not_writable(path)) is not None:
        return f"journal {path} cannot be written: {in_words(os_said)}; fix that or [journal] path in the config"
    elif not path.exists() and not path.parent.is_dir():
        why = f"cannot be made: {path.parent} is not a directory"
    elif not path.exists():
        why = "does not exist (has the bridge run with this config?)"
    elif isinstance(e, OSError):
        why = f"cannot be opened: {in_words(e)}"
    elif not os.access(path, os.R_OK):
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

    def bodies(self) -> list[tuple[str, dict[str, Any]]]:
        """What is held, oldest first: (source, body) as it came."""
        return list(self.events.values())

    def later(self, sid: str, boot: str, seq: int, kinds: Collection[str]) -> list[int]:
        """The seqs held of `kinds` that `sid` raised after `seq` in `boot`."""
        return [k[2] for k, (_, b) in self.events.items() if k[:2] == (sid, boot) and k[2] > seq and b["kind"] in kinds]

    def journaled(self) -> int:
        """Everything held is in the file now: let it go; how many that was."""
        n = len(self.events)
        self.events.clear()
        return n

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
