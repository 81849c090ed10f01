"""`holdover check-config`: the board's own validator, run on the host before a file goes to a board.

The rules are the firmware's (`firmware/config.py`), imported here, not copied, so the host and
the board can never disagree. CPython's JSON parser is strict where MicroPython's is not; the
firmware checks the grammar itself too, so a file that passes here also passes on the board.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from holdover.firmware import jsoncheck, keycheck, pins, protocol

# The firmware imports its siblings by their bare names, as MicroPython's flat path has them.
sys.modules.setdefault("protocol", protocol)
sys.modules.setdefault("pins", pins)
sys.modules.setdefault("keycheck", keycheck)
sys.modules.setdefault("jsoncheck", jsoncheck)
from holdover.firmware import config as board_config  # noqa: E402


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def check_text(text: str) -> list[str]:
    """Every problem with a board config, each naming its key or its line and column; [] if valid."""
    bad = jsoncheck.syntax_error(text)
    if bad:
        return [f"not valid JSON: {bad}"]
    try:
        raw = json.loads(text, parse_constant=_reject_constant)
    except ValueError as e:
        return [f"not valid JSON: {e}"]
    errs, _cfg = board_config.problems(raw)
    return errs


def check_file(path: Path) -> list[str]:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        return [f"cannot read: {e}"]
    return check_text(text)
