"""Strict board configs: the board refuses broken JSON itself, and `holdover check-config` on the host
runs the very same rules and prints every problem by key."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from holdover.board.config_check import check_text
from support import HOLDOVER, board_config, run_micropython

GOOD = board_config("rack1", "7f3a9c2e5b1d8e4f6", mqtt={"host": "127.0.0.1"}, mains={"pin": 27})
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
    out = subprocess.run([HOLDOVER, "check-config", str(f)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    for key in ("colour: unknown key", "sentinel_id:", "key: must be at least", "mqtt.host: must be an IPv4",
                "mqtt.port:", "mains.pin: GPIO6 is wired to the module's SPI flash", "relay.pin:"):  # fmt: skip
        assert key in out.stderr, (key, out.stderr)
    # The board names every one of them too, with the same words, whatever order its dicts keep.
    board = _board(tmp_path, json.dumps(bad))
    assert board.startswith("error: ") and all(key in board for key in ("colour: unknown key", "relay.pin:")), board
    f.write_text(json.dumps(GOOD))
    ok = subprocess.run([HOLDOVER, "check-config", str(f)], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and ok.stdout.strip().endswith(": ok")


PIN_CASES = [
    ("esp32", False, {"mains": {"pin": 24}}, "mains.pin: GPIO24 does not exist on an ESP32"),
    ("esp32", False, {"mains": {"pin": 40}}, "mains.pin: GPIO40 does not exist on an ESP32"),
    ("esp32", False, {"mains": {"pin": 20}}, "mains.pin: GPIO20 does not exist on an ESP32"),
    ("esp32", True, {"relay": {"pin": 16}}, "relay.pin: GPIO16 is taken by the PSRAM"),
    ("esp32", False, {"relay": {"pin": 5}}, "relay.pin: GPIO5 is a strapping pin"),
    ("esp32", False, {"battery": {"pin": 12}}, "battery.pin: GPIO12 is a strapping pin"),
    ("esp32s3", False, {"mains": {"pin": 22}}, "mains.pin: GPIO22 does not exist on an ESP32-S3"),
    ("esp32s3", False, {"mains": {"pin": 27}}, "mains.pin: GPIO27 is wired to the module's SPI flash"),
    ("esp32s3", True, {"mains": {"pin": 35}}, "mains.pin: GPIO35 is taken by the PSRAM"),
    ("esp32s3", False, {"relay": {"pin": 43}}, "relay.pin: GPIO43 is UART0"),
    ("esp32s3", False, {"relay": {"pin": 19}}, "relay.pin: GPIO19 is the chip's native USB"),
    ("esp32s3", False, {"relay": {"pin": 46}}, "relay.pin: GPIO46 is a strapping pin"),
    ("esp32s3", False, {"battery": {"pin": 12}}, "battery.pin: GPIO12 is on ADC2"),
    ("esp32c3", False, {"mains": {"pin": 22}}, "mains.pin: GPIO22 does not exist on an ESP32-C3"),
    ("esp32c3", False, {"mains": {"pin": 18}}, "mains.pin: GPIO18 is the chip's native USB"),
    ("esp32c3", False, {"relay": {"pin": 9}}, "relay.pin: GPIO9 is a strapping pin"),
    ("esp32c3", False, {"relay": {"pin": 21}}, "relay.pin: GPIO21 is UART0"),
    ("esp32c3", False, {"battery": {"pin": 5}}, "battery.pin: GPIO5 is on ADC2"),
    ("esp32c3", False, {"battery": {"pin": 6}}, "battery.pin: GPIO6 has no ADC; use ADC1 (GPIO0-4)"),
    ("esp32", False, {"led": {"pin": 0}}, "led.pin: GPIO0 is a strapping pin"),
    ("esp32", False, {"led": {"pin": 35}}, "led.pin: GPIO35 is input-only"),
    ("esp32", False, {"led": {"pin": 26}}, "led.pin: GPIO26 is already relay.pin"),
    ("esp32c3", False, {"led": {"pin": 2}}, "led.pin: GPIO2 is a strapping pin"),
]

# A pin map per chip that follows every rule (the hardware page's recommendation).
GOOD_MAPS = {
    "esp32": {"mains": {"pin": 27}, "relay": {"pin": 26}, "battery": {"pin": 34}},
    "esp32s3": {"mains": {"pin": 4}, "relay": {"pin": 5}, "battery": {"pin": 6}},
    "esp32c3": {"mains": {"pin": 4}, "relay": {"pin": 7}, "battery": {"pin": 3}},
}


def _with(chip: str, psram: bool, extra: dict) -> dict:
    cfg = {**GOOD, "chip": chip, "psram": psram, **GOOD_MAPS[chip]}
    for k, v in extra.items():
        cfg[k] = {**cfg.get(k, {}), **v}
    return cfg


@pytest.mark.parametrize(("chip", "psram", "extra", "message"), PIN_CASES)
def test_pins_are_checked_per_chip_and_role(chip: str, psram: bool, extra: dict, message: str) -> None:
    problems = check_text(json.dumps(_with(chip, psram, extra)))
    assert any(message in p for p in problems), problems


def test_a_status_led_may_use_the_esp32_devkits_own_led_pin_and_no_other_strapping_pin() -> None:
    assert check_text(json.dumps(_with("esp32", False, {"led": {"pin": 2}}))) == []
    assert any(
        "GPIO5 is a strapping pin" in p for p in check_text(json.dumps(_with("esp32", False, {"led": {"pin": 5}})))
    )


@pytest.mark.parametrize("chip", sorted(GOOD_MAPS))
def test_each_chips_recommended_map_passes_on_the_board_and_the_host(tmp_path: Path, chip: str) -> None:
    text = json.dumps(_with(chip, False, {}))
    assert check_text(text) == []
    assert _board(tmp_path, text) == "ok"
    # And the board itself refuses a bad pin with the host's words.
    bad = json.dumps(_with(chip, False, {"mains": {"pin": 22 if chip != "esp32" else 24}}))
    assert "does not exist on an ESP32" in _board(tmp_path, bad)


WEAK_KEYS = [
    ("short", "must be at least 16 characters"),
    ("<the key holdover keygen rack1 printed>", "looks like a placeholder"),
    ("a long random secret, at least 16 characters", "looks like a placeholder ('secret')"),
    ("change-me-change-me-change-me", "looks like a placeholder ('change')"),
    ("aaaaaaaabbbbbbbbaaaaaaaabbbbbbbb", "too predictable (about 32 bits"),
    ("0123456789abcdef", "too predictable (runs of consecutive characters)"),
]


@pytest.mark.parametrize(("key", "words"), WEAK_KEYS)
def test_the_board_and_the_bridge_refuse_the_same_weak_keys(tmp_path: Path, key: str, words: str) -> None:
    from holdover import settings

    text = json.dumps({**GOOD, "key": key})
    board = _board(tmp_path, text)
    assert board.startswith("error:") and f"key: {words}" in board, board
    assert any(p.startswith(f"key: {words}") for p in check_text(text)), check_text(text)
    with pytest.raises(settings.ConfigError, match=re.escape(words)):
        settings.parse({"sentinels": [{"id": "rack1", "key": key}]})


def test_keygen_writes_a_private_key_both_configs_accept(tmp_path: Path) -> None:
    from holdover import settings

    out = subprocess.run([HOLDOVER, "keygen", "rack1", "--dir", str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    path = tmp_path / "rack1.key"
    assert path.stat().st_mode & 0o777 == 0o600
    key = path.read_text().strip()
    assert len(key) == 64 and f'"key": "{key}",' in out.stdout and f'key_file = "{path}"' in out.stdout
    board_text = json.dumps({**GOOD, "key": key})
    assert _board(tmp_path, board_text) == "ok" and check_text(board_text) == []
    cfg = settings.parse({"sentinels": [{"id": "rack1", "key_file": str(path)}]})
    assert cfg.keys() == {"rack1": key.encode()}
    again = subprocess.run([HOLDOVER, "keygen", "rack1", "--dir", str(tmp_path)], capture_output=True, text=True)
    assert again.returncode == 1 and "exists" in again.stderr and path.read_text().strip() == key


# The board's own validator in the unix port (validate_config.py): errors name the key.
@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (
            '{"key": "7f3a9c2e5b1d8e4f", "wlan": {"ssid": "lab"}, "mqtt": {"host": "1.2.3.4"}, "mains": {"pin": 4}}',
            "sentinel_id: required",
        ),
        (
            '{"sentinel_id": "s", "key": "short", "wlan": {"ssid": "lab"}, "mqtt": {"host": "10.0.0.2"}, "mains": {"pin": 4}}',
            "key: must be at least",
        ),
        (
            '{"sentinel_id": "s", "key": "7f3a9c2e5b1d8e4f", "wlan": {"ssid": "lab"}, "mqtt": {"host": "10.0.0.2", "port": 70000}, "mains": {"pin": 4}}',
            "mqtt.port: must be in 1..65535",
        ),
        (
            '{"sentinel_id": "s", "key": "7f3a9c2e5b1d8e4f", "wlan": {"ssid": "lab"}, "mqtt": {"host": "10.0.0.2"}, "mains": {"pin": 4, "mode": "ac"}}',
            "mains.mode: must be one of",
        ),
        (
            '{"sentinel_id": "s", "key": "7f3a9c2e5b1d8e4f", "wlan": {"ssid": "lab"}, "mqtt": {"host": "10.0.0.2"}, "mains": {"pin": 4}, "x": 1}',
            "x: unknown key",
        ),
        (
            '{"sentinel_id": "s", "key": "7f3a9c2e5b1d8e4f", "wlan": {"ssid": "lab"}, "mqtt": {"host": "10.0.0.2"}, "mains": {"pin": true}}',
            "mains.pin: must be an integer",
        ),
        ("{not json", "not valid JSON"),
    ],
)
def test_firmware_config_errors_name_the_key(tmp_path, cfg: str, message: str) -> None:
    f = tmp_path / "config.json"
    f.write_text(cfg)
    out = run_micropython("validate_config.py", str(f))
    assert out.startswith("error:") and message in out, out


_BASE = board_config(key="7f3a9c2e5b1d8e4f", mains={"pin": 27})


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"relay": {"pin": 12}}, "relay.pin: GPIO12 is a strapping pin"),
        ({"relay": {"pin": 0}}, "relay.pin: GPIO0 is a strapping pin"),
        ({"relay": {"pin": 34}}, "relay.pin: GPIO34 is input-only"),
        ({"battery": {"pin": 26}}, "battery.pin: GPIO26 is on ADC2, which the WiFi driver owns"),
        ({"battery": {"pin": 23}}, "battery.pin: GPIO23 has no ADC"),
        ({"mains": {"pin": 7}}, "mains.pin: GPIO7 is wired to the module's SPI flash"),
        ({"mains": {"pin": 1}}, "mains.pin: GPIO1 is UART0"),
        ({"mains": {"pin": 35}}, "mains.pin: GPIO35 has no internal pull-up"),
        ({"relay": {"pin": 27}}, "relay.pin: GPIO27 is already mains.pin"),
        ({"uplink": {"targets": [{"kind": "tcp", "host": "example.com", "port": 80}]}}, "uplink.targets: [0].host"),
        ({"uplink": {"targets": [{"kind": "icmp", "host": "10.0.0.1"}]}}, "[0].kind: must be tcp or dns"),
        ({"uplink": {"interval_ms": 300, "timeout_ms": 400}}, "uplink.timeout_ms: must be shorter"),
        ({"battery": {"low_pct": 10, "critical_pct": 20}}, "battery.critical_pct: must be below"),
    ],
)
def test_config_refuses_pins_and_targets_that_cannot_work(tmp_path, extra: dict, message: str) -> None:
    cfg = {**_BASE}
    for k, v in extra.items():
        cfg[k] = {**cfg.get(k, {}), **v}
    f = tmp_path / "config.json"
    f.write_text(json.dumps(cfg))
    out = run_micropython("validate_config.py", str(f))
    assert out.startswith("error:") and message in out, out


def test_the_recommended_pin_map_is_accepted(tmp_path) -> None:
    cfg = {**_BASE, "mains": {"pin": 35, "pull_up": False}, "relay": {"pin": 26}, "battery": {"pin": 33}}
    f = tmp_path / "config.json"
    f.write_text(json.dumps(cfg))
    assert run_micropython("validate_config.py", str(f)).startswith("ok"), cfg
