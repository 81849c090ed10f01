"""What every wing's commands share: logging, the one mapping of a
`HoldoverError` to its message and exit code, and the pass / warn / fail table."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from typer.core import TyperGroup

from holdover import settings as settings_mod
from holdover.errors import USAGE, HoldoverError

# Help panels, by what a person is doing when they reach for the command.
SET_UP = "Set up"
RUN = "Run"
OUTAGE = "Outage"
BOARD = "Board"
LAB = "Lab"


class Group(TyperGroup):
    """The top-level command group: every command runs inside it, so this is the one place an
    error raised on purpose becomes a line on stderr and an exit code."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except HoldoverError as e:
            typer.echo(f"holdover: {e.user_message()}", err=True)
            raise typer.Exit(e.exit_code) from None


def wing(**kw: Any) -> typer.Typer:
    """A wing's own app: nameless, so `add_typer` merges its commands into the top level."""
    return typer.Typer(add_completion=False, **kw)


def fail(message: str, code: int = USAGE) -> typer.Exit:
    """For a command's own refusals (nothing raised them): say it, then exit with `code`."""
    typer.echo(f"holdover: {message}", err=True)
    return typer.Exit(code)


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )


# Where the service's config lives, as /etc/nut/ups.conf does for NUT: every command finds it there
# (or at $HOLDOVER_CONFIG) without --config.
DEFAULT_CONFIG = Path("/etc/holdover/holdover.toml")
CONFIG_ENV = "HOLDOVER_CONFIG"


def config_option(help_: str) -> Any:
    return typer.Option(
        DEFAULT_CONFIG,
        "--config",
        "-c",
        envvar=CONFIG_ENV,
        show_envvar=True,
        # Escaped: rich takes "[mqtt]" for a style and prints nothing of it.
        help=escape(f"{help_} Default: ${CONFIG_ENV}, else {DEFAULT_CONFIG}."),
    )


def load_config(path: Path, secrets_later: bool = False) -> settings_mod.Settings:
    """The bridge's config; a missing default says where it was looked for and how to make one.
    `secrets_later`: a password_file not there yet is not an error (the command writes it)."""
    if path == DEFAULT_CONFIG and not os.environ.get(CONFIG_ENV) and not path.exists():
        raise settings_mod.ConfigError(
            f"no config at {DEFAULT_CONFIG} (the default): pass --config FILE, set {CONFIG_ENV}, "
            f"or make one there: holdover config-example > {DEFAULT_CONFIG}"
        )
    return settings_mod.load(path, secrets_later)


def journal_exists(cfg: settings_mod.Settings) -> None:
    """The commands that read the journal directly: exit 2 if the bridge never made one."""
    if not cfg.journal.path.exists():
        raise fail(f"no journal at {cfg.journal.path} yet (has the bridge run?)")


def print_checks(checks: list[Any], with_fix: bool) -> None:
    """doctor's and diagnose's table: each check, its pass / warn / fail, what was found; then the fixes.

    The fixes are commands and paths to copy: printed under the table, whole, never cut or folded
    into a narrow column (the terminal wraps them, as it would a long command line)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    style = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
    t = Table("check", "", "what was found")
    t.columns[0].overflow = t.columns[2].overflow = "fold"
    fixes = [c for c in checks if with_fix and c.fix and c.status in ("warn", "fail")]
    for c in checks:
        mark = f" [dim]({fixes.index(c) + 1})[/]" if c in fixes else ""
        t.add_row(escape(c.name), f"[{style[c.status]}]{c.status}[/]", escape(c.detail) + mark)
    out = Console()
    out.print(t)
    if fixes:
        out.print("to fix:")
        for i, c in enumerate(fixes, 1):
            out.print(f"({i}) {escape(c.name)}: {escape(c.fix)}", soft_wrap=True, highlight=False)


def describe_job(r: dict[str, Any]) -> str | None:
    """One line for a run whose ranks span processes or nodes (launch.recover's `multi`): the step
    complete on every rank and where, and each rank here that saved a newer step alone."""
    m = r.get("multi")
    if not m:
        return None
    job = f"job {r['job']}, " if r.get("job") else ""
    here = ", ".join(
        f"rank {x['rank']} {'alive' if x['alive'] else 'gone'} (pid {x['pid']})" for x in r.get("ranks", [])
    )
    if m["complete_step"] is not None:
        on = ", ".join(f"rank {x['rank']} on {x['host']}" for x in m["complete_on"])
        line = f"{job}{m['world']} ranks: step {m['complete_step']} complete on all ({on})"
    else:
        line = f"{job}{r.get('world')} ranks: no step complete on all ranks yet"
    ahead = [
        f"rank {k} saved step {v['step']} alone"
        for k, v in m["ranks_here"].items()
        if m["complete_step"] is None or v["step"] > m["complete_step"]
    ]
    if ahead:
        line += f"; {', '.join(ahead)} (kept; resume loads it only if every rank has it)"
    return f"{line}; here: {here}" if here else line
