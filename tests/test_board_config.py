"""Strict board configs: the board refuses broken JSON itself, and `holdover check-config` on the host
runs the very same rules and prints every problem by key."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_micropython
from holdover.board.config_check import check_text

GOOD = {
    "sentinel_id": "rack1",
    "key": "0123456789abcdef0",
    "wlan": {"ssid": "lab"},
    "mqtt": {"host": "127.0.0.1"},
    "mains": {"pin": 27},
}
GOOD_TEXT = json.dumps(GOOD)

# Each of these parses under MicroPython's json module (',' and ':' count as whitespace there)
# into something other than what was written; CPython refuses them all.
BROKEN = [
    (GOOD_TEXT.replace('"pin": 27}', '"pin": 27, "debounce_ms":}'), "line 1, column"),
    (GOOD_TEXT.replace('"rack1", ', '"rack1" '), "',' or '}' expected"),
    (GOOD_TEXT.replace('"pin": 27}', '"pin": 27,}'), "a key in double quotes expected"),
    (GOOD_TEXT.replace('"pin": 27', '"pin" 27'), "':' expected"),
    (GOOD_TEXT.replace("127.0.0.1", "127.0.0.1\\q"), "bad escape"),
    (GOOD_TEXT + "\n{}", "line 2, column 1: nothing expected after the value"),
    ("{'sentinel_id': 'rack1'}", "a key in double quotes expected"),
    (GOOD_TEXT.replace("27", "027"), "',' or '}' expected"),
]


def _board(tmp_path: Path, text: str) -> str:
    f = tmp_path / "config.json"
    f.write_text(text)
    return run_micropython("validate_config.py", str(f)).strip()


@pytest.mark.parametrize(("text", "fragment"), BROKEN)
def test_the_board_and_the_host_both_refuse_broken_json(tmp_path: Path, text: str, fragment: str) -> None:
    with pytest.raises(ValueError):
        json.loads(text)  # CPython agrees it is broken
    board = _board(tmp_path, text)
    assert board.startswith("error:") and "not valid JSON" in board and fragment in board, board
    host = check_text(text)
    assert len(host) == 1 and "not valid JSON" in host[0], host


def test_a_good_file_passes_both(tmp_path: Path) -> None:
    pretty = json.dumps(GOOD, indent=2) + "\n"
    assert _board(tmp_path, pretty) == "ok"
    assert check_text(pretty) == []


def test_check_config_prints_every_problem_by_key(tmp_path: Path) -> None:
    bad = {
        "sentinel_id": "bad id!",
        "key": "short",
        "mqtt": {"host": "broker.lan", "port": 70000},
        "mains": {"pin": 6},
        "relay": {"pin": 6},
        "colour": 1,
    }
    f = tmp_path / "config.json"
    f.write_text(json.dumps(bad))
    holdover = Path(sys.executable).parent / "holdover"
    out = subprocess.run([str(holdover), "check-config", str(f)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    for key in ("colour: unknown key", "sentinel_id:", "key: must be at least", "mqtt.host: must be an IPv4",
                "mqtt.port:", "mains.pin: GPIO6 is wired to the module's SPI flash", "relay.pin:"):  # fmt: skip
        assert key in out.stderr, (key, out.stderr)
    # The board stops at the first of them, with the same words.
    assert _board(tmp_path, json.dumps(bad)).startswith("error: colour: unknown key")
    f.write_text(json.dumps(GOOD))
    ok = subprocess.run([str(holdover), "check-config", str(f)], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and ok.stdout.strip().endswith(": ok")
