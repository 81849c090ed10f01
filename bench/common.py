"""What the benchmarks share (they run as scripts: `python bench/X.py` puts this directory on the
path). Not tests/support.wait_for: a benchmark cannot import the tests, and it polls 5 ms apart
because what it waits for is often what it times."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait(what: str, test: Callable[[], T], timeout: float = 15.0) -> T:
    """test()'s first truthy answer, polled every 5 ms; TimeoutError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = test()
        if found:
            return found
        time.sleep(0.005)
    raise TimeoutError(what)
