"""This machine's commands: audit it, install its service, walk and show its uplinks."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import typer

from holdover.cli.common import OUTAGE, SET_UP, config_option, fail, load_config, print_checks, wing
from holdover.errors import FAILED

app = wing()


@app.command(rich_help_panel=SET_UP)
def doctor(
    config: Path = config_option("The bridge's TOML config."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    root: Path = typer.Option(Path("/"), hidden=True, help="Read /etc and /proc under this (tests)."),
) -> None:
    """Audit this training node before an outage: each cause of a lost run, pass / warn / fail and the fix.
    Exit status: 0 all pass, 1 a warning, 2 a failure."""
    from holdover.node.checks import worst
    from holdover.node.doctor import Doctor

    checks = Doctor(load_config(config), root=root).run()
    if as_json:
        typer.echo(json.dumps([c.as_dict() for c in checks], indent=1))
    else:
        print_checks(checks, with_fix=True)
    raise typer.Exit(worst(checks))


@app.command("install-service", rich_help_panel=SET_UP)
def install_service(
    config: Path = config_option("The bridge's TOML config the service runs with."),
    unit_dir: Path = typer.Option(Path("/etc/systemd/system"), help="Where the unit file goes."),
    enable: bool = typer.Option(False, help="Also run systemctl daemon-reload and enable --now."),
) -> None:
    """Write a systemd unit for the bridge (Type=notify, watchdog, hardened) and check it with systemd-analyze."""
    from holdover import proc
    from holdover.node import systemd

    cfg = load_config(config, secrets_later=True)
    path, _text = systemd.install(cfg, config, unit_dir)
    typer.echo(f"wrote {path}: holdover bridge --config {config.resolve()}, as root with only")
    typer.echo(f"  {', '.join(systemd.CAPABILITIES)}; the system read-only but for")
    typer.echo(f"  {', '.join(str(p) for p in systemd.writable_paths(cfg))}; watchdog {systemd.WATCHDOG_SEC} s")
    ok, said = systemd.verify(path)
    typer.echo("systemd-analyze verify: ok" if ok else f"systemd-analyze verify: {said}", err=not ok)
    if not ok:
        raise typer.Exit(FAILED)
    steps = [["systemctl", "daemon-reload"], ["systemctl", "enable", "--now", systemd.UNIT_NAME]]
    if not enable:
        typer.echo("start it with: " + " && ".join(" ".join(s) for s in steps))
        return
    for step in steps:
        r = proc.run_sync(step, timeout=120)
        typer.echo(f"{' '.join(step)}: {r.describe()} {r.output.strip()}".rstrip())
        if not r.ok:
            raise typer.Exit(FAILED)


@app.command(rich_help_panel=OUTAGE)
def diagnose(
    config: Path = config_option("The bridge's TOML config ([failover], [diagnose])."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Walk each uplink hop by hop (link, gateway, targets), DNS, metadata, the kernel's words and
    the dongle: pass / warn / fail, the first failed hop named. Exit 0 all pass, 1 a warning, 2 a failure."""
    from holdover.node import diagnose as dg
    from holdover.node.checks import worst
    from holdover.node.netlink import NetlinkThread

    cfg = load_config(config)
    with NetlinkThread(netns=cfg.failover.netns) as nl:
        findings = asyncio.run(dg.diagnose(cfg, nl.ipr, nl.arun))
    if not findings:
        raise fail(
            f"{config}: nothing to check: no [failover] uplinks, [diagnose] resolvers or [dongle]; "
            "docs/failover.md shows how to configure them"
        )
    if as_json:
        typer.echo(json.dumps(dg.summary(findings), indent=1))
    else:
        print_checks(findings, with_fix=False)
    raise typer.Exit(worst(findings))


failover_app = typer.Typer(help="The node's uplink failover.", no_args_is_help=True)
app.add_typer(failover_app, name="failover", rich_help_panel=OUTAGE)


@failover_app.command("status")
def failover_status(
    config: Path = config_option("The bridge's TOML config ([failover])."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Probe every uplink once and show which one carries traffic."""
    from rich.console import Console
    from rich.table import Table

    from holdover.node.failover import check
    from holdover.node.netlink import open_handle

    fo = load_config(config).failover
    if not fo.uplinks:
        raise fail(f"{config} has no [failover] uplinks")
    with open_handle(fo.netns) as ipr:
        st = check(fo, ipr)
    if as_json:
        typer.echo(json.dumps(st, indent=2))
        return
    t = Table(title="uplinks" + (" (holdover's failover route in place)" if st["holdover_route"] else ""))
    for col in ("uplink", "dev", "probes", "rtt ms", "traffic"):
        t.add_column(col)
    for u in st["uplinks"]:
        rtt = f"{u['rtt_ms']:.1f}" if u["rtt_ms"] is not None else "-"
        t.add_row(
            u["name"],
            u["dev"],
            "ok" if u["up"] else "FAILING",
            rtt,
            "<- carries it" if u["name"] == st["active"] else "",
        )
    Console().print(t)
