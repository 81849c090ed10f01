"""How the training-side library speaks to the person running the script: one line to stderr,
flushed, so it lands between the script's own output and survives a kill right after it. Every
part of holdover.train that logs takes a `log` of this type and defaults to `stderr`."""

from __future__ import annotations

import sys
from collections.abc import Callable

Log = Callable[[str], None]


def stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
