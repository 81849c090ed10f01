"""How `holdover status` draws what it gathered for a person: the host's UPS and the deadline it sets,
the sentinels and the runs as tables, the rescue plan, the uplink, Slurm's circuits. `--json` prints
the same dict without this."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from holdover.cli.common import describe_job
from holdover.events import duration
from holdover.node import cadence
from holdover.node.ups import UpsReading


def show(st: dict[str, Any], reading: UpsReading | None, problem: str | None) -> None:
    out = Console()
    out.print(f"[dim]config {escape(st['config'])} · journal {escape(st['journal'])}[/dim]", soft_wrap=True)
    if st["journal_note"]:
        out.print(f"[yellow]journal: {escape(st['journal_note'])}[/yellow]: nothing heard or done yet", soft_wrap=True)
    u = st["ups"]
    if problem:
        out.print(f"host UPS {escape(u['name'])}: [red]{escape(problem)}[/red]", soft_wrap=True)
    elif reading is not None and not reading.fixed:
        colour = "red" if u["on_battery"] else "green"
        out.print(
            f"host UPS {escape(u['name'])} ({escape(u['source'])}): [{colour}]{escape(reading.describe())}[/]",
            soft_wrap=True,
        )
    elif not u["configured"]:
        out.print("host UPS: [yellow]none configured[/yellow] (\\[ups] nut or apcupsd)")
    guess = "[yellow]" if u["guess"] else ""
    out.print(
        f"an emergency's deadline: {guess}{escape(u['deadline_from'])}{'[/yellow]' if guess else ''}", soft_wrap=True
    )
    t = Table(title="sentinels")
    for col in ("sentinel", "status", "mains", "own battery", "uplink", "relay", "last event"):
        t.add_column(col)
    for s in st["sentinels"]:
        # The sentinel's own cell: how long it keeps watching, never the host's time (that is the UPS).
        cell = [f"{s['battery_pct']:.0f} %"] if isinstance(s["battery_pct"], int | float) else []
        if isinstance(s["runtime_s"], int | float):
            cell.append(f"about {duration(s['runtime_s'])}")
        mains = {True: "on", False: "[red]LOST[/red]", None: "-"}[s["mains"]]
        last = s["last_event"]
        t.add_row(
            s["sid"],
            s["status"] or "never heard",
            mains,
            ", ".join(cell) or "-",
            s["uplink"] or "-",
            {True: "on", False: "off", None: "-"}[s["relay"]],
            f"{last['kind']} ({last['age_s']:.0f} s ago)" if last else "-",
        )
    out.print(t)
    t = Table(title="training runs")
    for col in ("run", "state", "newest verified checkpoint", "age"):
        t.add_column(col)
    for r in st["runs"]:
        ck = r.get("checkpoint")
        t.add_row(r["name"], r["state"], ck["dir"] if ck else "none", f"{ck['age_s']:.0f} s" if ck else "-")
    out.print(t)
    for r in st["runs"]:
        if line := describe_job(r):
            out.print(f"{escape(r['name'])}: {escape(line)}", soft_wrap=True)
        if r.get("bound"):  # the rescue plan cannot save it: it saves by the clock (node/cadence.py)
            out.print(escape(cadence.sentence(r["name"], r["bound"], "is left out of the rescue plan")), soft_wrap=True)
    plan = st["plan"]
    colour = "yellow" if plan["cannot"] else "green"
    out.print(f"rescue plan: [{colour}]{escape(plan['sentence'])}[/{colour}]", soft_wrap=True)
    up = st["uplinks"]
    out.print(
        f"uplink: {up['active'] or 'primary (no failover recorded)'}"
        + (f" since {up['since_s']:.0f} s" if up["since_s"] else "")
    )
    for c in st["slurm"]:
        if not c["drained"]:
            out.print(f"Slurm circuit {escape(c['circuit'])} ({escape(c['nodes'])}): [green]not drained[/green]")
        else:
            out.print(
                f"Slurm circuit {escape(c['circuit'])}: [red]{escape(c['nodes'])} drained[/red] "
                f"{duration(c['age_s'])} ago: {escape(c['reason'] or '')}",
                soft_wrap=True,
            )
        for job in c["jobs"]:
            out.print(f"  job {escape(job['job'])} ({escape(job['name'])}, {job['signal']}): {escape(job['state'])}")
