"""The training runs' commands: launch one protected, list and resume after an outage, forget
one, verify a checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from holdover.cli.common import OUTAGE, RUN, describe_job, fail, wing
from holdover.errors import FAILED

app = wing()


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    options_metavar="[OPTIONS] -- CMD...",
    rich_help_panel=RUN,
)
def launch(
    ctx: typer.Context,
    name: str = typer.Option(..., "--name", "-n", help="Run name (tmux session holdover-NAME, log NAME.log)."),
    ckpt: Path | None = typer.Option(None, "--ckpt", help="The run's checkpoint directory, for `recover`."),
    log_dir: Path | None = typer.Option(None, help="Where the output log goes (default: the state directory)."),
) -> None:
    """Run a training command inside tmux, logged to a file and registered for protection: launch -n NAME -- CMD..."""
    from holdover.node.launch import launch as do_launch

    run = do_launch(name, list(ctx.args), ckpt_dir=ckpt, log_dir=log_dir)
    if run.ended == 0:
        typer.echo(f"{run.name} finished at once (exit 0); its output is in {run.log}")
        return
    typer.echo(f"launched {run.name}: tmux session {run.session}, pid {run.pid}, log {run.log}")
    typer.echo(f"attach with: tmux attach -t {run.session}")


@app.command(rich_help_panel=OUTAGE)
def recover(
    everything: bool = typer.Option(False, "--all", help="Also runs that finished more than a week ago."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """After an outage: every known run (running, finished, failed or killed), its newest verified
    checkpoint, and the command that resumes each unfinished one."""
    from rich.console import Console
    from rich.table import Table

    from holdover.node.launch import recover as do_recover

    runs = do_recover(everything=everything)
    if as_json:
        typer.echo(json.dumps(runs, indent=1))
        return
    console = Console()
    if not runs:
        console.print("no runs known to holdover (none launched, none registered)")
        return
    table = Table("run", "state", "pid", "tmux", "newest verified checkpoint")
    for r in runs:
        c = r["checkpoint"]
        ck = f"step {c['step']} ({c['bytes'] / 1e6:.1f} MB, {c['age_s'] / 60:.0f} min old)\n{c['dir']}" if c else "none"
        state = f"{r['state']} ({r['how']})" if r["how"] else r["state"]
        table.add_row(r["name"], state, str(r.get("pid") or ""), r.get("session") or "", ck)
    console.print(table)
    for r in runs:
        if line := describe_job(r):
            console.print(f"[bold]{r['name']}:[/bold] {line}", soft_wrap=True, highlight=False)
    for r in runs:
        if r.get("resume"):
            console.print(f"[bold]resume {r['name']}:[/bold] {r['resume']}", soft_wrap=True, highlight=False)


@app.command(rich_help_panel=RUN)
def forget(name: str = typer.Argument(..., help="A run that is not running.")) -> None:
    """Drop a run from `holdover recover` (its launch record, exit status and registration)."""
    from holdover.node.launch import forget as do_forget

    removed = do_forget(name)
    typer.echo(f"forgot {name}: removed {', '.join(str(p) for p in removed) or 'nothing more'}")


@app.command(rich_help_panel=RUN)
def verify(directory: Path = typer.Argument(..., help="A checkpoint directory or a run's checkpoint root.")) -> None:
    """Check a checkpoint's files against its manifest (or find the newest good one under a root)."""
    from holdover.train import ckpt

    if not directory.is_dir():
        raise fail(f"{directory}: " + ("not a directory" if directory.exists() else "does not exist"))
    if (directory / ckpt.MANIFEST).exists():
        m = ckpt.verify(directory)
        typer.echo(f"{directory}: step {m.step}, {len(m.files)} files, {m.nbytes} bytes: OK")
        return
    found = ckpt.newest_verified(directory, log=lambda msg: typer.echo(msg, err=True))
    if found is None:
        raise fail(f"no verified checkpoint under {directory}", FAILED)
    typer.echo(f"newest verified: {found[0]} (step {found[1].step}, {found[1].nbytes} bytes)")
