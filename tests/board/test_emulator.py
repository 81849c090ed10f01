"""The emulator's control port and its supervisor: bounded lines, clean sockets, a clean stop."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from holdover.board.emulator import Control, EmulatorError
from holdover.lab.broker import free_port
from holdover.lab.rig import Rig
from support import HOLDOVER, wait_for


def _reply(sock: socket.socket) -> dict:
    buf = b""
    while b"\n" not in buf:
        chunk = sock.recv(4096)
        assert chunk, "the control port closed the connection"
        buf += chunk
    return json.loads(buf.partition(b"\n")[0])


def test_a_megabyte_line_is_refused_without_killing_the_port(rig_factory) -> None:
    rig = rig_factory(bridge=False)
    # Connected and settled first (its birth, state and discovery burst sent): what those hold is
    # the firmware's, and a loaded host can put them after the first reading.
    rig.wait_board(lambda st: st["queued"] == 0 and st["uptime_ms"] > 3000, 15, "the board settled")
    free_before = rig.control.send(get="mem")["mem"]["free"]
    with socket.create_connection(rig.control_addr, timeout=10) as s:
        s.sendall(b"x" * (1 << 20) + b"\n")
        assert _reply(s) == {"ok": False, "error": "line too long"}
        # The same connection still works after the long line, and so does the firmware.
        s.sendall(b'{"get": "world"}\n')
        assert _reply(s)["ok"] is True
    # The heap is an ESP32's (~170K here): had the line been held whole, MemoryError would have ended this client
    # without an answer. Nothing of it stays behind either.
    assert rig.control.send(get="mem")["mem"]["free"] > free_before - 8 * 1024
    assert rig.control.send(mains=False)["ok"]


def test_invalid_utf8_gets_an_error_reply(rig_factory) -> None:
    rig = rig_factory(bridge=False)
    reply = rig.control.raw(b'{"mains": "\xff\xfe"}')
    assert reply == {"ok": False, "error": "not UTF-8"}
    assert rig.control.send(get="world")["world"]["mains"] is True


def test_closed_control_connections_leave_no_socket_behind(rig_factory) -> None:
    rig = rig_factory(bridge=False)
    for _ in range(20):
        with socket.create_connection(rig.control_addr, timeout=10) as s:
            s.sendall(b'{"get": "world"}\n')
            assert _reply(s)["ok"] is True
    assert rig.emulator is not None and rig.emulator.proc is not None
    mpy = psutil.Process(rig.emulator.proc.pid)

    def settled() -> bool:
        states = [c.status for c in mpy.net_connections(kind="tcp")]
        return states.count(psutil.CONN_CLOSE_WAIT) == 0 and len(states) <= 4

    wait_for(settled, 10, "the emulator to close every finished control connection")


def test_holdover_emu_stopped_with_sigterm_ends_its_interpreter_and_state(tmp_path: Path) -> None:
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    cfg = tmp_path / "config.json"
    broker_port = free_port()  # nothing listens there: the sentinel just keeps retrying
    cfg.write_text(
        json.dumps(
            {
                "sentinel_id": "emu",
                "key": "7f3a9c2e5b1d8e4f6a0c",
                "mqtt": {"host": "127.0.0.1", "port": broker_port},
                "wlan": {"ssid": "lab"},
                "mains": {"pin": 27},
            }
        )
    )
    port = free_port()
    emu = subprocess.Popen(
        [HOLDOVER, "emu", "--config", str(cfg), "--control", f"127.0.0.1:{port}"],
        env=dict(os.environ, TMPDIR=str(tmpdir)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: _answers(port), 20, "the control port")
        children = psutil.Process(emu.pid).children(recursive=True)
        assert children, "no MicroPython child"
        assert _states(tmpdir), "the state directory was not made where expected"
        emu.send_signal(signal.SIGTERM)
        emu.wait(15)
        _gone, alive = psutil.wait_procs(children, timeout=5)
        assert not alive, alive
        assert not _answers(port)
        assert _states(tmpdir) == []
    finally:
        if emu.poll() is None:
            emu.kill()
        emu.communicate()


def _states(tmpdir: Path) -> list[Path]:
    return [p for p in tmpdir.iterdir() if p.name.startswith("holdover-emu-")]


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b'{"get": "world"}\n')
            return _reply(s)["ok"] is True
    except OSError:
        return False


def test_an_emulator_that_exits_at_boot_is_named_at_once_with_its_last_words(rig_factory) -> None:
    """A heap too small to boot in: the interpreter exits at once, and starting the rig says so
    with what the board printed, rather than waiting out the control port's 15 s."""
    t0 = time.monotonic()
    with pytest.raises(
        EmulatorError, match=r"the emulator exited before its control port .* answered; its last lines: \[.*\]"
    ):
        rig_factory(bridge=False, heap="2k")
    assert time.monotonic() - t0 < 10


def test_a_control_port_taken_before_the_board_binds_it_is_retried_on_another(tmp_path: Path) -> None:
    """free_port() lets go of the port it found; under a parallel run another process can take it
    first (CI saw it). The rig boots the board again on a fresh port, and only for that reason."""
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))  # bound, not listening: the board's bind fails, a connect is refused
    r = Rig(tmp_path / "rig")
    try:
        taken = squatter.getsockname()
        r.control_addr = taken
        r.control = Control(*taken)
        r.start(bridge=False, emulator=True)
        assert r.control_addr != taken
        assert any("in use by another process" in line for line in r.lines)
        assert "mains" in json.dumps(r.board_state())
    finally:
        r.close()
        squatter.close()


def test_bad_control_commands_get_an_error_naming_the_problem(rig_factory) -> None:
    rig = rig_factory(bridge=False)
    for line, fragment in [
        (b"not json", "not JSON"),
        (b'{"mains": "yes"}', "mains: expected true or false"),
        (b'{"battery_v": -1}', "battery_v"),
        (b'{"teleport": 1}', "unknown command"),
        (b'{"get": "secrets"}', "get: expected state, world, ticks, adc, mem, relay, led or raised"),
        (b'{"mains": false, "wlan": false}', "exactly one key"),
    ]:
        reply = rig.control.raw(line)
        assert reply["ok"] is False and fragment in reply["error"], (line, reply)
    assert rig.control.send(get="world")["world"]["mains"] is True


def test_emulated_adc_sees_the_battery_through_the_divider(rig_factory) -> None:
    rig = rig_factory(bridge=False)
    rig.control.send(battery_v=3.55)
    assert rig.control.send(get="adc")["adc_uv"] == 1775000
    assert rig.control.send(get="world")["world"]["battery_v"] == 3.55
