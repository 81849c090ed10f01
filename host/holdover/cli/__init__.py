"""The `holdover` command: one typer app per wing, merged into one command line.

Each wing's module (bridge, node, runs, board, lab) declares its commands and imports what it
drives inside the command, so `holdover --help` loads no wing. Errors raised on purpose are turned
into a message and an exit code in one place (`common.Group`).
"""

from __future__ import annotations

import typer

from holdover.cli import board, bridge, lab, node, runs
from holdover.cli.common import Group

app = typer.Typer(
    cls=Group,
    help="holdover: watch mains power and the uplink, and save training runs before they are lost.",
    no_args_is_help=True,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        import holdover

        typer.echo(f"holdover {holdover.__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """holdover: watch mains power and the uplink, and save training runs before they are lost."""


for _wing in (bridge, node, runs, board, lab):
    app.add_typer(_wing.app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
