"""The board's commands: its key, its config, MicroPython and the firmware onto it, its console."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import typer

from holdover import settings as settings_mod
from holdover.cli.common import BOARD, SET_UP, wing
from holdover.errors import FAILED

app = wing()

PORT_HELP = "The board's serial port; default: the one ESP32 board on USB."


@app.command(rich_help_panel=SET_UP)
def keygen(
    sentinel: str = typer.Argument(..., help="The sentinel's id (its sentinel_id on the board)."),
    directory: Path = typer.Option(Path("/etc/holdover"), "--dir", help="Where SENTINEL.key is written."),
    force: bool = typer.Option(False, help="Replace an existing key file (the board then needs the new key)."),
) -> None:
    """Make a sentinel's signing key: a 0600 file for the bridge, and the line for the board's config."""
    from holdover.board import keys

    path, key = keys.write(sentinel, directory, force)
    typer.echo(f"wrote {path} (mode 0600, {keys.KEY_BYTES} random bytes as hex)")
    typer.echo("\nthe board's config.json:")
    typer.echo(f'  "sentinel_id": "{sentinel}",\n  "key": "{key}",')
    typer.echo("\nthe bridge's holdover.toml:")
    typer.echo(f'  [[sentinels]]\n  id = "{sentinel}"\n  key_file = "{path.resolve()}"')


@app.command("check-config", rich_help_panel=BOARD)
def check_config(
    path: Path = typer.Argument(..., help="A board's config.json."),
) -> None:
    """Check a board config with the firmware's own rules; print every problem by key."""
    from holdover.board.config_check import check_file

    problems = check_file(path)
    for p in problems:
        typer.echo(f"{path}: {p}", err=True)
    if problems:
        typer.echo(f"{len(problems)} problem(s); the board would refuse this file", err=True)
        raise typer.Exit(FAILED)
    typer.echo(f"{path}: ok")


@app.command(rich_help_panel=BOARD)
def flash(
    image: Path = typer.Argument(..., help="A full MicroPython image for the board (the .bin from micropython.org)."),
    port: str | None = typer.Option(None, "--port", "-p", help=PORT_HELP),
    chip: str = typer.Option("auto", "--chip", help="auto (from the image), esp32, esp32s3 or esp32c3."),
    erase: bool = typer.Option(True, "--erase/--no-erase", help="Erase the whole flash first (the board's files too)."),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print what would be done and the esptool commands; touch nothing."
    ),
) -> None:
    """Write MicroPython to an ESP32 board with esptool, refusing an image built for another chip."""
    import shlex

    from holdover.board import flash as flash_mod

    plan = flash_mod.plan(image, port, chip, erase, dry_run=dry_run)
    for line in plan.describe():
        typer.echo(line)
    if dry_run:
        typer.echo("the same by hand:")
        for argv in plan.esptool_argv():
            typer.echo("  " + shlex.join(argv))
        typer.echo("dry run: nothing was done")
        return
    flash_mod.flash(plan, say=typer.echo)
    typer.echo(f"done: next, holdover deploy --port {plan.port.device} --board config.json")


@app.command(rich_help_panel=BOARD)
def deploy(
    board: Path = typer.Option(..., "--board", "-b", help="The board's config.json (checked first)."),
    port: str | None = typer.Option(None, "--port", "-p", help=PORT_HELP),
    follow_s: float = typer.Option(20.0, "--follow", help="Seconds to watch the console after the reset."),
) -> None:
    """Check the config, compile the firmware for its chip, copy both (mpremote), check every file's
    hash on the board, reset it and watch it reach its broker."""
    from holdover.board import deploy as deploy_mod
    from holdover.board import flash as flash_mod

    deploy_mod.check(board)  # the config first, as the help says: a bad one needs no board to be refused
    device = flash_mod.pick_port(port).device
    result = deploy_mod.deploy(device, board, say=typer.echo, follow_seconds=follow_s)
    if not result.reached_broker:
        raise typer.Exit(3)


@app.command(rich_help_panel=BOARD)
def console(
    port: str | None = typer.Option(None, "--port", "-p", help=PORT_HELP),
    board: Path | None = typer.Option(
        None, "--board", "-b", help="The board's config.json: its key checks the events."
    ),
    config: Path | None = typer.Option(
        None, "--config", "-c", help="Or the bridge's TOML config: every sentinel's key."
    ),
    seconds: float | None = typer.Option(None, "--seconds", help="Stop after this long (default: until Ctrl-C)."),
) -> None:
    """Show a board's USB serial console: log lines, and signed events checked with the sentinel's key."""
    from rich.console import Console
    from rich.markup import escape

    from holdover.board import console as console_mod
    from holdover.board import flash as flash_mod

    keys: dict[str, bytes] = {}
    if config is not None:
        keys.update(settings_mod.load(config).keys())
    if board is not None:
        try:
            keys.update(console_mod.board_keys(json.loads(board.read_text())))
        except (OSError, ValueError) as e:
            raise console_mod.ConsoleError(f"{board}: {e}") from None
    device = flash_mod.pick_port(port).device
    typer.echo(f"{device}: Ctrl-C to stop", err=True)
    style = {"log": "", "event": "bold", "rejected": "bold red", "other": "dim"}
    out = Console(highlight=False)
    with contextlib.suppress(KeyboardInterrupt):
        console_mod.follow(
            device,
            lambda s: out.print(f"[{style[s.kind]}]{escape(s.text)}[/]" if style[s.kind] else escape(s.text)),
            keys,
            seconds,
        )
