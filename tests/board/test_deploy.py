"""`holdover deploy` and `holdover console` end to end: mpremote over a pseudo-terminal to a board
that speaks MicroPython's raw REPL and runs the code in the real MicroPython, then boots the
emulated sentinel from exactly the files deployed, which must reach a real Mosquitto."""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from pathlib import Path

import pytest
from typer.testing import CliRunner

from holdover.board import chips, console, deploy, manifest, mpy_build
from holdover.cli import app
from holdover.firmware import protocol
from holdover.lab.broker import Broker
from holdover.lab.rawrepl import RawReplBoard, boot_emulated_sentinel


def test_the_manifest_lists_every_board_module_and_nothing_else() -> None:
    on_disk = {p.name for p in manifest.firmware_dir().glob("*.py")} - {"__init__.py", manifest.MANIFEST}
    listed = [m.name for m in manifest.read()]
    assert len(listed) == len(set(listed))
    assert set(listed) | set(manifest.EMULATOR_ONLY) == on_disk  # a new firmware file must be placed
    assert not set(listed) & set(manifest.EMULATOR_ONLY)
    assert "main.py" in listed and [m.on_board for m in manifest.read() if m.name == "main.py"] == ["main.py"]


@pytest.mark.parametrize("march", sorted({c.march for c in chips.CHIPS.values()}))
def test_the_manifest_compiles_for_each_architecture(march: str) -> None:
    built = mpy_build.build(march=march)
    for m in manifest.read():
        data = (built / m.on_board).read_bytes()
        assert data[:1] == (b"M" if m.on_board.endswith(".mpy") else data[:1]) and len(data) > 50, m.on_board


def test_a_manifest_asking_for_what_deploy_cannot_do_is_refused(tmp_path: Path) -> None:
    (tmp_path / "manifest.py").write_text('require("umqtt.simple")\n')
    with pytest.raises(manifest.ManifestError, match=r"require\(\) is not supported"):
        manifest.read(tmp_path / "manifest.py")
    (tmp_path / "manifest.py").write_text('module("nope.py")\n')
    with pytest.raises(manifest.ManifestError, match="no such file"):
        manifest.read(tmp_path / "manifest.py")


def _board_config(tmp_path: Path, broker: Broker, **over: object) -> Path:
    cfg = {
        "sentinel_id": "desk",
        "key": secrets.token_hex(16),
        "chip": "esp32",
        "wlan": {"ssid": "emulated-ap"},
        "mqtt": {"host": broker.host, "port": broker.port, "keepalive_s": 5},
        "mains": {"pin": 27, "mode": "pulse", "active_low": True, "debounce_ms": 300},
    }
    cfg.update(over)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def test_deploy_copies_checks_resets_and_sees_the_sentinel_reach_its_broker(tmp_path: Path) -> None:
    with Broker(workdir=tmp_path / "broker") as broker:
        cfg = _board_config(tmp_path, broker, heartbeat_s=1)
        board = RawReplBoard(tmp_path / "board", boot=boot_emulated_sentinel).start()
        try:
            # An earlier source deploy left sentinel.py: MicroPython would import it before sentinel.mpy.
            (board.root / "sentinel.py").write_text("raise ImportError('the old one')\n")
            (board.root / "notes.txt").write_text("the user's own file")
            said: list[str] = []
            result = deploy.deploy(board.device, cfg, say=said.append, follow_seconds=40)
            assert result.reached_broker, "\n".join(said)
            assert result.removed == ["sentinel.py"] and not (board.root / "sentinel.py").exists()
            assert (board.root / "notes.txt").exists()  # nothing else on the board is touched
            uploads, _ = deploy.prepare(cfg)
            for u in uploads:
                assert hashlib.sha256((board.root / u.name).read_bytes()).hexdigest() == u.sha256, u.name
            assert json.loads((board.root / "config.json").read_text())["sentinel_id"] == "desk"
            assert any(s.startswith("log ") and "mqtt connected to" in s for s in said), said
            assert board.execs > len(uploads) and board.resets >= 2  # the soft reset, then machine.reset()
            # The running sentinel's console, as `holdover console` shows it: heartbeats checked with its key.
            r = CliRunner().invoke(app, ["console", "--port", board.device, "--board", str(cfg), "--seconds", "4"])
            assert r.exit_code == 0, r.output
            assert re.search(r"event desk #\d+ heartbeat .*\(signature ok\)", r.output), r.output
        finally:
            board.close()


def test_deploy_refuses_a_bad_config_before_touching_the_board(tmp_path: Path) -> None:
    with Broker(workdir=tmp_path / "broker") as broker:
        cfg = _board_config(tmp_path, broker, relay={"pin": 0})
        board = RawReplBoard(tmp_path / "board").start()
        try:
            with pytest.raises(deploy.DeployError, match=r"GPIO0 is a strapping pin.*nothing was copied"):
                deploy.deploy(board.device, cfg, say=lambda s: None)
            assert board.execs == 0 and list(board.root.iterdir()) == []
        finally:
            board.close()


def test_the_console_shows_logs_and_events_and_says_why_a_line_is_refused() -> None:
    key = secrets.token_bytes(32)
    signer = protocol.Signer(key)
    line = protocol.encode(signer, "desk", "b00t", 7, 1234, None, protocol.BOOT, {"x": 1}).decode()
    keys = {"desk": key}
    assert console.readable("# 12345 mqtt connected to 10.0.0.2:1883", keys).text.startswith("log       12.345 s  mqtt")
    shown = console.readable(line, keys)
    assert shown.kind == "event" and "desk #7" in shown.text and "signature ok" in shown.text
    assert "signature not checked" in console.readable(line).text
    forged = console.readable(line, {"desk": secrets.token_bytes(32)})
    assert forged.kind == "rejected" and "HMAC does not match" in forged.text
    assert console.readable('{"sig": "zz', keys).kind == "rejected"
