"""The `holdover` command."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

import typer

from holdover import settings as settings_mod

app = typer.Typer(
    help="holdover: watch mains power and the uplink, and save training runs before they are lost.",
    no_args_is_help=True,
    add_completion=False,
)


def _logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )


@app.command()
def bridge(
    config: Path = typer.Option(..., "--config", "-c", help="The bridge's TOML config."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging."),
) -> None:
    """Run the host bridge: take sentinel events from MQTT, journal them and run hooks."""
    from holdover.bridge import Bridge

    _logging(verbose)
    try:
        cfg = settings_mod.load(config)
    except settings_mod.ConfigError as e:
        typer.echo(f"holdover: bad config: {e}", err=True)
        raise typer.Exit(2) from None
    asyncio.run(Bridge(cfg).run())


@app.command()
def emu(
    config: Path = typer.Option(..., "--config", "-c", help="The board's config.json, as it would be on the ESP32."),
    control: str = typer.Option("127.0.0.1:7300", help="HOST:PORT of the JSON-lines control port."),
    heap: str = typer.Option("110K", help="MicroPython heap size; 110K is an ESP32-WROOM with WiFi up."),
    state: Path | None = typer.Option(
        None, help="Directory for the board's NVS and physical world (default: a temporary one)."
    ),
) -> None:
    """Run the unchanged firmware in the MicroPython unix port on the emulated board."""
    from holdover.emulator import Emulator, EmulatorError, parse_hostport

    try:
        emulator = Emulator(config, parse_hostport(control), heap=heap, state_dir=state)
        rc = emulator.run()
    except EmulatorError as e:
        typer.echo(f"holdover: {e}", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        rc = 0
    finally:
        if "emulator" in locals():
            emulator.stop()
    raise typer.Exit(rc)


@app.command()
def demo(
    debounce_ms: int = typer.Option(300, help="Mains debounce on the emulated sentinel."),
) -> None:
    """Run the whole chain locally: Mosquitto, an emulated sentinel, the bridge; cut and restore mains."""
    from holdover.demo import run_demo

    raise typer.Exit(run_demo(debounce_ms=debounce_ms))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
