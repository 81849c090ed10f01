"""The lab's commands: the firmware in the MicroPython unix port, and the whole chain as a demo."""

from __future__ import annotations

import signal
from pathlib import Path

import typer

from holdover.cli.common import LAB, wing

app = wing()


@app.command(rich_help_panel=LAB)
def emu(
    config: Path = typer.Option(..., "--config", "-c", help="The board's config.json, as it would be on the ESP32."),
    control: str = typer.Option("127.0.0.1:7300", help="HOST:PORT of the JSON-lines control port."),
    heap: str = typer.Option(
        "168K", help="MicroPython heap size; 168K on this 64-bit port holds what ~110K holds on an ESP32."
    ),
    state: Path | None = typer.Option(
        None, help="Directory for the board's NVS, outbox and physical world (default: a temporary one)."
    ),
    serial: str | None = typer.Option(
        None, help="HOST:PORT where the board's USB serial port listens; open it as socket://HOST:PORT."
    ),
) -> None:
    """Run the unchanged firmware in the MicroPython unix port on the emulated board."""
    from holdover.board.emulator import Emulator, parse_hostport

    def interrupted(signum: int, _frame: object) -> None:
        # SIGTERM (systemd, kill) ends the run as Ctrl-C does: the finally below stops the
        # interpreter's whole process group and removes the temporary state directory.
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)
    emulator = None
    try:
        emulator = Emulator(
            config,
            parse_hostport(control),
            heap=heap,
            state_dir=state,
            serial=parse_hostport(serial) if serial else None,
        )
        rc = emulator.run()
    except KeyboardInterrupt:
        rc = 0
    finally:
        if emulator is not None:
            emulator.stop()
    raise typer.Exit(rc)


@app.command(rich_help_panel=LAB)
def demo(
    debounce_ms: int = typer.Option(300, help="Mains debounce on the emulated sentinel."),
    hold: float = typer.Option(
        0.0, help="Keep everything up this many seconds at the end, to open the dashboard in a browser."
    ),
) -> None:
    """Run the whole chain locally: Mosquitto, an emulated sentinel, the bridge; cut and restore mains."""
    from holdover.lab.demo import run_demo

    raise typer.Exit(run_demo(debounce_ms=debounce_ms, hold_s=hold))
