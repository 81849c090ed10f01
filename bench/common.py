"""What the benchmarks share (they run as scripts: `python bench/X.py` puts this directory on the
path). Not tests/support.wait_for: a benchmark cannot import the tests, and it polls 5 ms apart
because what it waits for is often what it times."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait(what: str, test: Callable[[], T], timeout: float = 15.0) -> T:
    """test()'s first truthy answer, polled every 5 ms (a bench times what it waits for)."""
    from holdover.lab.demo import until  # here: the demo brings the rig, which a bench that never waits need not load

    return until(what, test, timeout, every=0.005)


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
