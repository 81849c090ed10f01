"""The bridge's commands: run it, configure it and its broker, read its journal, reach a sentinel."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from holdover.cli.common import (
    OUTAGE,
    RUN,
    SET_UP,
    config_option,
    fail,
    journal_exists,
    load_config,
    setup_logging,
    wing,
)
from holdover.errors import FAILED

if TYPE_CHECKING:
    from holdover.settings import Settings

app = wing()


@app.command("config-example", rich_help_panel=SET_UP)
def config_example() -> None:
    """Print a bridge config with every setting, its default and what it is for (holdover.toml.example)."""
    from holdover.settings.example import example_toml

    typer.echo(example_toml(), nl=False)


@app.command("broker-config", rich_help_panel=SET_UP)
def broker_config(
    config: Path = config_option("The bridge's TOML config (its sentinels get users)."),
    out: Path = typer.Option(Path("/etc/holdover/mosquitto"), help="Where mosquitto.conf, passwd and acl go."),
    listen: str = typer.Option("0.0.0.0", help="The broker's listening address (the LAN's side)."),
    port: int = typer.Option(1883, help="The broker's port."),
    persistence: Path = typer.Option(Path("/var/lib/mosquitto"), help="Mosquitto's persistence directory."),
    ha: bool = typer.Option(False, "--ha", help="Add a user for Home Assistant (reads state, switches relays)."),
    lan_address: str = typer.Option("", help="This broker's LAN address, for the sentinels' config lines."),
    rotate: list[str] = typer.Option(
        [], "--rotate", help="Give this client (a sentinel id, holdover, homeassistant) a new password; repeatable."
    ),
    node: list[str] = typer.Option(
        [], "--node", help="Another node of the site: a broker user of its own (holdover-node-NAME); repeatable."
    ),
) -> None:
    """Write a Mosquitto config with a password per client and an ACL per sentinel, and print the
    lines that make the bridge's and each sentinel's configs match."""
    from holdover.bridge import broker_config as bc

    cfg = load_config(config, secrets_later=True)
    try:
        sids = [s.id for s in cfg.sentinels]
        w = bc.write(out, sids, listen, port, persistence, ha, rotate=rotate, node=cfg.node, nodes=node)
    except OSError as e:
        raise bc.BrokerConfigError(str(e)) from None
    typer.echo(f"wrote {w.conf}, {w.passwd} ({len(w.passwords)} users, hashed), {w.acl}")
    kept = [u for u in w.passwords if u not in w.new and u not in w.rotated]
    if kept:
        typer.echo(f"kept the passwords of {', '.join(kept)}: what is deployed with them goes on working")
    if w.new:
        typer.echo(f"new passwords for {', '.join(w.new)}")
    for user in w.rotated:
        where = {
            bc.BRIDGE_USER: "nothing: the bridge reads its password_file, restart it",
            bc.HA_USER: "Home Assistant's MQTT password",
        }.get(user, f"the board config.json of {user} (its mqtt line below), then holdover deploy")
        typer.echo(f"ROTATED {user}: its old password no longer works; change {where}")
    typer.echo(
        f"with Debian's mosquitto service: ln -sf {w.fragment} {bc.DEBIAN_CONF_D}/ && systemctl restart mosquitto\n"
        f"or on its own: mosquitto -c {w.conf}"
    )
    typer.echo(f"\n{config}: the bridge's [mqtt] section:")
    typer.echo(f'  username = "{bc.BRIDGE_USER}"\n  password_file = "{w.password_files[bc.BRIDGE_USER]}"')
    host = lan_address or "<this broker's LAN address>"
    for s in cfg.sentinels:
        mqtt = {"host": host, "port": port, "user": s.id, "password": w.passwords[s.id]}
        typer.echo(f'\nsentinel {s.id}, in its config.json:\n  "mqtt": {json.dumps(mqtt)}')
    for other in (u for u in w.passwords if u.startswith(bc.NODE_USER)):
        typer.echo(
            f"\nnode {other.removeprefix(bc.NODE_USER)}: copy {w.password_files[other]} there (0600), and in its "
            f'[mqtt]:\n  username = "{other}"\n  password_file = "<where you copied it>"'
        )
    if ha:
        typer.echo(f"\nHome Assistant's MQTT: user {bc.HA_USER}, password in {w.password_files[bc.HA_USER]}")


@app.command("nut-config", rich_help_panel=SET_UP)
def nut_config(
    config: Path = config_option("The bridge's TOML config ([nut_server], sentinels)."),
    out: Path = typer.Option(
        Path("/etc/holdover/nut"),
        help="Where ups.conf, upsd.conf, upsd.users and nut.conf go; /etc/nut for Debian's nut-server service.",
    ),
    host: str = typer.Option("", help="This NUT server's LAN address, for the clients' upsmon.conf lines."),
    rotate: list[str] = typer.Option([], "--rotate", help="Give this client a new password; repeatable."),
    group: str = typer.Option("nut", help="The group NUT's daemons run as: the files are root:GROUP 0640."),
) -> None:
    """Write NUT's config that serves each sentinel as a UPS (NUT's own upsd and dummy-ups), and
    print how to start NUT on it and each client's upsmon.conf line. Passwords already made are kept."""
    from holdover.bridge import nut_config as nc

    cfg = load_config(config)
    s = cfg.nut_server
    w = nc.write(s, [x.id for x in cfg.sentinels], out, rotate, group)
    typer.echo(f"wrote {', '.join(str(f) for f in w.files)}")
    kept = [c for c in w.passwords if c not in w.new and c not in w.rotated]
    if kept:
        typer.echo(f"kept the passwords of {', '.join(kept)}: the machines following with them go on")
    for client in w.rotated:
        typer.echo(f"ROTATED {client}: its old password no longer works; change its upsmon.conf (below)")
    if not s.serve:
        typer.echo(f"{config}: set [nut_server] serve = true, so the bridge keeps {s.dir} current")
    typer.echo(f"start NUT on it (once the bridge has written {s.dir}): {nc.start_line(out)}")
    where = host or "<this NUT server's LAN address>"
    for client, password in w.passwords.items():
        typer.echo(f"\n{client}, in its upsmon.conf:")
        for sid in (x.id for x in cfg.sentinels):
            typer.echo("  " + nc.monitor_line(s, sid, client, password, where))


@app.command("test-alert", rich_help_panel=SET_UP)
def test_alert(
    config: Path = config_option("The bridge's TOML config ([alerts])."),
) -> None:
    """Send one test alert through every configured channel and print each one's result."""
    import socket

    from holdover.bridge import notify

    cfg = load_config(config)
    if not cfg.alerts.channels:
        raise fail(f"{config} has no [[alerts.channels]]")
    failed = 0
    for c in cfg.alerts.channels:
        r = notify.send(
            c.url,
            "holdover test alert",
            f"from {socket.gethostname()}: if you read this, channel {c.name!r} works",
            "critical",  # so a channel with any minimum severity shows it
        )
        typer.echo(f"{c.name}: " + ("sent" if r.ok else f"FAILED: {r.error}"))
        failed += not r.ok
    if failed:
        raise typer.Exit(FAILED)


@app.command("ha-remove", rich_help_panel=SET_UP)
def ha_remove(
    sentinel: str = typer.Argument(..., help="The sentinel's id."),
    config: Path = config_option("The bridge's TOML config (for the broker)."),
    prefix: str = typer.Option("homeassistant", help="Home Assistant's discovery prefix."),
) -> None:
    """Remove a sentinel's Home Assistant entities (empty their retained discovery configs)."""
    from holdover.bridge import discovery

    removed = discovery.remove(load_config(config).mqtt, sentinel, prefix)
    if not removed:
        typer.echo(f"no discovery configs for {sentinel} under {discovery.node_filter(sentinel, prefix)}")
        return
    for t in removed:
        typer.echo(f"removed {t}")
    typer.echo(
        f"{len(removed)} entities removed; {sentinel} publishes them again on its next connect "
        'unless its board config has "ha": {"discovery": false}'
    )


@app.command(rich_help_panel=RUN)
def bridge(
    config: Path = config_option("The bridge's TOML config."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging."),
) -> None:
    """Run the host bridge: take sentinel events from MQTT, journal them and run hooks."""
    from holdover.bridge import Bridge

    setup_logging(verbose)
    cfg = load_config(config)
    if not cfg.sentinels and not cfg.ups.enabled:
        raise fail(
            f"{config}: no [[sentinels]] and no [ups]: the bridge would hear nobody. Make a key with "
            "`holdover keygen ID` (it prints the [[sentinels]] lines to add), or point [ups] nut at your UPS."
        )
    if cfg.slurm.enabled:
        _slurm_knows_the_circuits(cfg, config)
    beside = None
    if cfg.web.enabled:  # FastAPI and uvicorn are 26 MB resident: a bridge that serves nothing never loads them
        from holdover.web.server import serving

        beside = lambda b: serving(b, cfg.web)  # noqa: E731
    asyncio.run(Bridge(cfg).run(beside=beside))


def _slurm_knows_the_circuits(cfg: Settings, config: Path) -> None:
    """A circuit naming a node Slurm does not know would drain nothing on a cut: refused, by key,
    when slurmctld answers; when it does not, said, and the bridge starts (power may need it)."""
    from holdover.cluster.slurm import SlurmError, unknown_nodes

    try:
        problems = unknown_nodes(cfg.slurm)
    except SlurmError as e:
        logging.getLogger("holdover.cluster").warning("cannot ask Slurm about the circuits' nodes: %s", e)
        return
    if problems:
        raise fail(f"{config}: " + "; ".join(problems))


@app.command(rich_help_panel=RUN)
def status(
    config: Path = config_option("The bridge's TOML config (for the journal)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """The host's UPS, sentinels, protected runs and uplinks at a glance: the UPS read now, the rest
    from the journal (works while the bridge is down)."""
    from holdover.cli import glance
    from holdover.journal import Journal, NoJournalYet
    from holdover.node import launch
    from holdover.node.ups import read_once
    from holdover.web import snapshot

    cfg = load_config(config)
    reading, problem = read_once(cfg.ups)
    path = cfg.journal.path
    # Before the bridge ever ran there is no journal, but the UPS and the runs are there to show
    # (a UPS-only box is read by `get ups` already): an empty journal stands in, and it is said.
    note = None
    try:
        if not path.exists():
            raise NoJournalYet(f"{path} does not exist")
        j = Journal(path, readonly=True)
    except NoJournalYet:
        j, note = Journal(":memory:"), "none yet: the bridge has not run with this config"
    with j:
        st = {
            "config": str(config.resolve()),
            "journal": str(path),
            "journal_note": note,
            "ups": snapshot.ups(cfg, reading, problem),
            "sentinels": snapshot.sentinels(j, [s.id for s in cfg.sentinels]),
            "runs": launch.recover(cfg.protect.registry),
            "plan": snapshot.rescue_plan(cfg, reading, problem),
            "uplinks": snapshot.uplinks(j),
            "checkpoints": snapshot.checkpoints(j, 5),
            "slurm": snapshot.slurm(j, cfg),
        }
    if as_json:
        typer.echo(json.dumps(st, indent=2, default=str))
        return
    glance.show(st, reading, problem)


@app.command(rich_help_panel=RUN)
def get(
    what: str = typer.Argument(..., help="A sentinel's id, or `ups` for the host's UPS."),
    var: str | None = typer.Argument(None, help="One variable (battery_pct, mains, runtime_s, ...); all if left out."),
    config: Path = config_option("The bridge's TOML config."),
) -> None:
    """One value, plainly, for scripts (as `upsc ups@host var` prints one): `holdover get rack1 battery_pct`."""
    import difflib

    from holdover.journal import Journal
    from holdover.node.ups import read_once
    from holdover.web import snapshot

    cfg = load_config(config)
    if what == "ups":
        if not cfg.ups.enabled:
            raise fail(f"{config}: no [ups] to read (nut, apcupsd or runtime_s)")
        reading, problem = read_once(cfg.ups)
        if problem is not None:  # as upsc: the reason on stderr, a non-zero exit, nothing on stdout
            raise fail(problem, FAILED)
        found = snapshot.ups(cfg, reading, None)
    else:
        journal_exists(cfg)
        with Journal(cfg.journal.path, readonly=True) as j:
            every = {s["sid"]: s for s in snapshot.sentinels(j, [x.id for x in cfg.sentinels])}
        if what not in every:
            known = ", ".join(sorted(every)) or "none heard yet"
            raise fail(f"no sentinel {what!r} (known: {known}; `ups` for the host's UPS)")
        found = {k: v for k, v in every[what].items() if k not in ("targets", "last_event")}
    plain = {k: v for k, v in found.items() if not isinstance(v, dict | list)}

    def show(v: object) -> str:
        return "" if v is None else str(v).lower() if isinstance(v, bool) else str(v)

    if var is None:
        for k, v in plain.items():
            typer.echo(f"{k}: {show(v)}")
        return
    if var not in plain:
        near = difflib.get_close_matches(var, list(plain), n=1)
        raise fail(
            f"{what} has no {var!r}" + (f"; did you mean {near[0]}?" if near else f" (it has: {', '.join(plain)})")
        )
    typer.echo(show(plain[var]))


@app.command(rich_help_panel=RUN)
def outages(
    config: Path = config_option("The bridge's TOML config (for the journal)."),
    limit: int = typer.Option(20, help="How many, newest first."),
    days: float = typer.Option(365.0, help="Only outages that began in the last this many days."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Every power and uplink outage: when, how long, who saw it, which runs were saved at which step."""
    import time

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from holdover.events import duration
    from holdover.journal import Journal
    from holdover.web import outages as outages_mod

    if not days > 0:  # NaN too
        raise fail(f"--days {days:g}: give a number of days above 0")

    cfg = load_config(config)
    journal_exists(cfg)
    with Journal(cfg.journal.path, readonly=True) as j:
        found = outages_mod.history(j, limit, since=time.time() - days * 86400)
    if as_json:
        typer.echo(json.dumps(found, indent=2, default=str))
        return
    if not found:
        typer.echo(f"no outage in the last {days:g} days")
        return
    t = Table(title="outages, newest first")
    for col in ("began", "lasted", "what", "saved", "not saved"):
        t.add_column(col)
    for o in found:
        began = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(o["start"]))
        lasted = f"[red]{duration(o['length_s'])} so far[/red]" if o["open"] else duration(o["length_s"])
        saved = [f"{s['run']} @ step {s['step']} ({s['seconds'] or 0:.1f} s)" for s in o["saved"]]
        saved += [f"{r['run']} (gcore)" for r in o["rescued"]]
        lost = [r["run"] for r in o["lost"]]
        t.add_row(began, lasted, escape(o["what"]), escape(", ".join(saved) or "-"), escape(", ".join(lost) or "-"))
    Console().print(t)


@app.command(rich_help_panel=RUN)
def events(
    config: Path = config_option("The bridge's TOML config (for the journal)."),
    kind: str | None = typer.Option(None, help="Only this kind (mains_lost, failover, ...)."),
    sentinel: str | None = typer.Option(None, help="Only this sentinel ('node': this machine)."),
    limit: int = typer.Option(50, help="How many, newest last."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new events as they are journaled."),
    routine: bool = typer.Option(False, "--routine", help="Also heartbeats (otherwise counted at the end)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per line."),
) -> None:
    """The event journal, read directly: works while the bridge is down."""
    import time

    from holdover import events as kinds
    from holdover.journal import Event, Journal
    from holdover.web import snapshot

    cfg = load_config(config)
    if kind is not None and kind not in kinds.TABLE:
        import difflib

        near = difflib.get_close_matches(kind, list(kinds.TABLE), n=1)
        hint = f"did you mean {near[0]}?" if near else f"one of: {', '.join(sorted(kinds.TABLE))}"
        raise fail(f"--kind {kind}: no such event kind; {hint}")
    journal_exists(cfg)

    def show(e: Event) -> None:
        k = kinds.kind(e.kind)
        text = k.describe(sid=e.sid, **e.data)
        if as_json:
            typer.echo(json.dumps({"id": e.id, "rx_ts": e.rx_ts, "severity": k.severity, "text": text, **e.body}))
        else:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.rx_ts))
            typer.echo(f"{when}  {k.severity:8}  {e.sid:12}  {e.kind:20}  {text}")

    with Journal(cfg.journal.path, readonly=True) as j:
        exclude = () if routine or kind else tuple(kinds.ROUTINE)
        page = j.events(sid=sentinel, kind=kind, limit=limit, exclude=exclude)
        rows = list(reversed(page))
        for e in rows:
            show(e)
        if exclude and not as_json:
            n = sum(snapshot.folded(j, exclude, sentinel, page, limit).values())
            if n:
                sys.stdout.flush()  # the rows first, then the note apart from them (a terminal shows both)
                typer.echo(f"\n({n} heartbeats in that span not listed: --routine lists them)", err=True)
        last = rows[-1].id if rows else 0
        try:
            while follow:
                time.sleep(0.5)
                for e in reversed(j.events(sid=sentinel, kind=kind, limit=1000, after=last, exclude=exclude)):
                    show(e)
                    last = e.id
        except KeyboardInterrupt:
            pass


@app.command(rich_help_panel=OUTAGE)
def relay(
    sentinel: str = typer.Argument(..., help="The sentinel's id."),
    op: str = typer.Argument(..., help="on, off, pulse, or restart (the board reboots)."),
    ms: int = typer.Argument(0, help="For pulse: how long the relay stays on, in ms."),
    config: Path = config_option("The bridge's TOML config (broker and keys)."),
    timeout: float = typer.Option(10.0, help="Seconds to wait for the sentinel's answer."),
) -> None:
    """Switch a sentinel's relay with a signed command and print its answer."""
    from holdover.bridge import commands
    from holdover.firmware import protocol

    cfg = load_config(config)
    key = cfg.keys().get(sentinel)
    if key is None:
        raise commands.CommandError(f"no key for {sentinel!r} in {config}")
    try:
        ack = commands.send(cfg.mqtt, key, sentinel, op, ms, timeout)
    except protocol.ProtocolError as e:  # the firmware's own error: MicroPython knows no HoldoverError
        raise commands.CommandError(str(e)) from None
    what = f"{op} {ms} ms" if op == protocol.OP_PULSE else op
    relay_now = {True: "on", False: "off", None: "none"}[ack.get("relay")]
    if ack.get("ok"):
        typer.echo(f"{sentinel}: {what}: ok (relay now {relay_now})")
        return
    typer.echo(f"{sentinel}: {what}: refused: {commands.refusal(ack)} (relay {relay_now})", err=True)
    raise typer.Exit(FAILED)
