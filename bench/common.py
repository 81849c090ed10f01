"""What the benchmarks share (they run as scripts: `python bench/X.py` puts this directory on the
path). Not tests/support.wait_for: a benchmark cannot import the tests, and it polls 5 ms apart
because what it waits for is often what it times."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any, TypeVar

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


def parse(ap: argparse.ArgumentParser, **smoke: Any) -> argparse.Namespace:
    """The bench's arguments, with --smoke: these values instead, the same code path in seconds at
    sizes whose figures mean nothing (no verdict is checked). tests/e2e/test_benches.py runs every
    bench so, and a bench that rots fails the suite."""
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="the same code path in seconds, at sizes whose figures mean nothing: what the suite runs",
    )
    args = ap.parse_args()
    if args.smoke:
        for k, v in smoke.items():
            setattr(args, k, v)
    return args
