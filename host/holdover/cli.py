"""The `holdover` command."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import typer

from holdover import settings as settings_mod

app = typer.Typer(
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


def _logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _config(path: Path) -> settings_mod.Settings:
    """The bridge's config, or exit 2 naming every problem by key."""
    try:
        return settings_mod.load(path)
    except settings_mod.ConfigError as e:
        typer.echo(f"holdover: bad config: {e}", err=True)
        raise typer.Exit(2) from None


def _journal_exists(cfg: settings_mod.Settings) -> None:
    """The commands that read the journal directly: exit 2 if the bridge never made one."""
    if not cfg.journal.path.exists():
        typer.echo(f"holdover: no journal at {cfg.journal.path} yet (has the bridge run?)", err=True)
        raise typer.Exit(2)


@app.command()
def bridge(
    config: Path = typer.Option(..., "--config", "-c", help="The bridge's TOML config."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging."),
) -> None:
    """Run the host bridge: take sentinel events from MQTT, journal them and run hooks."""
    from holdover.bridge import Bridge

    _logging(verbose)
    cfg = _config(config)
    if not cfg.sentinels:
        typer.echo(
            f"holdover: {config}: no [[sentinels]]: the bridge would hear nobody. Make a key with "
            "`holdover keygen ID`; it prints the [[sentinels]] lines to add.",
            err=True,
        )
        raise typer.Exit(2)
    from holdover.web.server import run_with

    asyncio.run(run_with(Bridge(cfg), cfg.web))


@app.command()
def keygen(
    sentinel: str = typer.Argument(..., help="The sentinel's id (its sentinel_id on the board)."),
    directory: Path = typer.Option(Path("/etc/holdover"), "--dir", help="Where SENTINEL.key is written."),
    force: bool = typer.Option(False, help="Replace an existing key file (the board then needs the new key)."),
) -> None:
    """Make a sentinel's signing key: a 0600 file for the bridge, and the line for the board's config."""
    from holdover.board import keys

    try:
        path, key = keys.write(sentinel, directory, force)
    except keys.KeyFileError as e:
        typer.echo(f"holdover: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"wrote {path} (mode 0600, {keys.KEY_BYTES} random bytes as hex)")
    typer.echo("\nthe board's config.json:")
    typer.echo(f'  "sentinel_id": "{sentinel}",\n  "key": "{key}",')
    typer.echo("\nthe bridge's holdover.toml:")
    typer.echo(f'  [[sentinels]]\n  id = "{sentinel}"\n  key_file = "{path.resolve()}"')


@app.command("config-example")
def config_example() -> None:
    """Print a bridge config with every setting, its default and what it is for (holdover.toml.example)."""
    typer.echo(settings_mod.example_toml(), nl=False)


@app.command("broker-config")
def broker_config(
    config: Path = typer.Option(..., "--config", "-c", help="The bridge's TOML config (its sentinels get users)."),
    out: Path = typer.Option(Path("/etc/holdover/mosquitto"), help="Where mosquitto.conf, passwd and acl go."),
    listen: str = typer.Option("0.0.0.0", help="The broker's listening address (the LAN's side)."),
    port: int = typer.Option(1883, help="The broker's port."),
    persistence: Path = typer.Option(Path("/var/lib/mosquitto"), help="Mosquitto's persistence directory."),
    ha: bool = typer.Option(False, "--ha", help="Add a user for Home Assistant (reads state, switches relays)."),
    lan_address: str = typer.Option("", help="This broker's LAN address, for the sentinels' config lines."),
) -> None:
    """Write a Mosquitto config with a password per client and an ACL per sentinel, and print the
    lines that make the bridge's and each sentinel's configs match."""
    from holdover.bridge import broker_config as bc

    cfg = _config(config)
    try:
        w = bc.write(out, [s.id for s in cfg.sentinels], listen, port, persistence, ha)
    except (bc.BrokerConfigError, OSError) as e:
        typer.echo(f"holdover: broker-config: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"wrote {w.conf}, {w.passwd} ({len(w.passwords)} users, hashed), {w.acl}")
    typer.echo(f"run it: mosquitto -c {w.conf}")
    typer.echo(f"\n{config}: the bridge's [mqtt] section:")
    typer.echo(f'  username = "{bc.BRIDGE_USER}"\n  password_file = "{w.password_files[bc.BRIDGE_USER]}"')
    host = lan_address or "<this broker's LAN address>"
    for s in cfg.sentinels:
        mqtt = {"host": host, "port": port, "user": s.id, "password": w.passwords[s.id]}
        typer.echo(f'\nsentinel {s.id}, in its config.json:\n  "mqtt": {json.dumps(mqtt)}')
    if ha:
        typer.echo(f"\nHome Assistant's MQTT: user {bc.HA_USER}, password in {w.password_files[bc.HA_USER]}")


@app.command()
def doctor(
    config: Path = typer.Option(..., "--config", "-c", help="The bridge's TOML config."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    root: Path = typer.Option(Path("/"), hidden=True, help="Read /etc and /proc under this (tests)."),
) -> None:
    """Audit this training node before an outage: each cause of a lost run, pass / warn / fail and the fix.
    Exit status: 0 all pass, 1 a warning, 2 a failure."""
    from holdover.node.doctor import Doctor, worst

    checks = Doctor(_config(config), root=root).run()
    if as_json:
        typer.echo(json.dumps([c.as_dict() for c in checks], indent=1))
        raise typer.Exit(worst(checks))
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    style = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
    t = Table("check", "", "what was found", "the fix")
    for c in checks:
        fix = c.fix if c.status != "pass" else ""
        t.add_row(escape(c.name), f"[{style[c.status]}]{c.status}[/]", escape(c.detail), escape(fix))
    Console().print(t)
    raise typer.Exit(worst(checks))


@app.command("install-service")
def install_service(
    config: Path = typer.Option(..., "--config", "-c", help="The bridge's TOML config the service runs with."),
    unit_dir: Path = typer.Option(Path("/etc/systemd/system"), help="Where the unit file goes."),
    enable: bool = typer.Option(False, help="Also run systemctl daemon-reload and enable --now."),
) -> None:
    """Write a systemd unit for the bridge (Type=notify, watchdog, hardened) and check it with systemd-analyze."""
    from holdover import proc
    from holdover.node import systemd

    cfg = _config(config)
    path, _text = systemd.install(cfg, config, unit_dir)
    typer.echo(f"wrote {path}: holdover bridge --config {config.resolve()}, as root with only")
    typer.echo(f"  {', '.join(systemd.CAPABILITIES)}; the system read-only but for")
    typer.echo(f"  {', '.join(str(p) for p in systemd.writable_paths(cfg))}; watchdog {systemd.WATCHDOG_SEC} s")
    ok, said = systemd.verify(path)
    typer.echo("systemd-analyze verify: ok" if ok else f"systemd-analyze verify: {said}", err=not ok)
    if not ok:
        raise typer.Exit(1)
    steps = [["systemctl", "daemon-reload"], ["systemctl", "enable", "--now", systemd.UNIT_NAME]]
    if not enable:
        typer.echo("start it with: " + " && ".join(" ".join(s) for s in steps))
        return
    for step in steps:
        r = proc.run_sync(step, timeout=120)
        typer.echo(f"{' '.join(step)}: {r.describe()} {r.output.strip()}".rstrip())
        if not r.ok:
            raise typer.Exit(1)


@app.command()
def diagnose(
    config: Path = typer.Option(..., "--config", "-c", help="The bridge's TOML config ([failover], [diagnose])."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Walk each uplink hop by hop (link, gateway, targets), DNS, metadata, the kernel's words and
    the dongle: pass / warn / fail, the first failed hop named. Exit 0 all pass, 1 a warning, 2 a failure."""
    from pyroute2 import IPRoute, NetNS

    from holdover.node import diagnose as dg
    from holdover.node.doctor import RANK

    cfg = _config(config)
    fo = cfg.failover

    async def run() -> list[dg.Finding]:
        with ThreadPoolExecutor(1) as one:  # pyroute2: one thread for every use of the socket
            ipr = one.submit(lambda: NetNS(fo.netns) if fo.netns else IPRoute()).result()
            loop = asyncio.get_running_loop()
            try:
                return await dg.diagnose(cfg, ipr, lambda fn, *a: loop.run_in_executor(one, fn, *a))
            finally:
                one.submit(ipr.close).result()

    findings = asyncio.run(run())
    worst = max((RANK[f.status] for f in findings), default=0)
    if as_json:
        typer.echo(json.dumps(dg.summary(findings), indent=1))
        raise typer.Exit(worst)
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    style = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
    t = Table("check", "", "what was found")
    for f in findings:
        t.add_row(escape(f.check), f"[{style[f.status]}]{f.status}[/]", escape(f.detail))
    Console().print(t)
    raise typer.Exit(worst)


@app.command("check-config")
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
        raise typer.Exit(1)
    typer.echo(f"{path}: ok")


@app.command()
def flash(
    image: Path = typer.Argument(..., help="A full MicroPython image for the board (the .bin from micropython.org)."),
    port: str | None = typer.Option(
        None, "--port", "-p", help="The board's serial port; default: the one ESP32 board on USB."
    ),
    chip: str = typer.Option(
        "auto", "--chip", help="auto (from the image), esp32, esp32s2, esp32s3, esp32c3 or esp32c6."
    ),
    erase: bool = typer.Option(True, "--erase/--no-erase", help="Erase the whole flash first (the board's files too)."),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print what would be done and the esptool commands; touch nothing."
    ),
) -> None:
    """Write MicroPython to an ESP32 board with esptool, refusing an image built for another chip."""
    import shlex

    from holdover.board import flash as flash_mod

    try:
        plan = flash_mod.plan(image, port, chip, erase, dry_run=dry_run)
    except flash_mod.FlashError as e:
        typer.echo(f"holdover: {e}", err=True)
        raise typer.Exit(2) from None
    for line in plan.describe():
        typer.echo(line)
    if dry_run:
        typer.echo("the same by hand:")
        for argv in plan.esptool_argv():
            typer.echo("  " + shlex.join(argv))
        typer.echo("dry run: nothing was done")
        return
    try:
        flash_mod.flash(plan, say=typer.echo)
    except flash_mod.FlashError as e:
        typer.echo(f"holdover: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"done: next, holdover deploy --port {plan.port.device} --board config.json")


@app.command()
def deploy(
    board: Path = typer.Option(..., "--board", "-b", help="The board's config.json (checked first)."),
    port: str | None = typer.Option(
        None, "--port", "-p", help="The board's serial port; default: the one ESP32 board on USB."
    ),
    follow_s: float = typer.Option(20.0, "--follow", help="Seconds to watch the console after the reset."),
) -> None:
    """Check the config, compile the firmware for its chip, copy both (mpremote), check every file's
    hash on the board, reset it and watch it reach its broker."""
    from holdover.board import deploy as deploy_mod
    from holdover.board import flash as flash_mod

    try:
        device = flash_mod.pick_port(port).device
        result = deploy_mod.deploy(device, board, say=typer.echo, follow_seconds=follow_s)
    except (flash_mod.FlashError, deploy_mod.DeployError) as e:
        typer.echo(f"holdover: {e}", err=True)
        raise typer.Exit(2) from None
    if not result.reached_broker:
        raise typer.Exit(3)


@app.command()
def console(
    port: str | None = typer.Option(
        None, "--port", "-p", help="The board's serial port; default: the one ESP32 board on USB."
    ),
    board: Path | None = typer.Option(
        None, "--board", "-b", help="The board's config.json: its key checks the events."
    ),
    config: Path | None = typer.Option(
        None, "--config", "-c", help="Or the bridge's TOML config: every sentinel's key."
    ),
    seconds: float | None = typer.Option(None, "--seconds", help="Stop after this long (default: until Ctrl-C)."),
) -> None:
    """Show a board's USB serial console: log lines, and signed events checked with the sentinel's key."""
    from holdover.board import console as console_mod
    from holdover.board import flash as flash_mod

    keys: dict[str, bytes] = {}
    try:
        if config is not None:
            keys.update(settings_mod.load(config).keys())
        if board is not None:
            keys.update(console_mod.board_keys(json.loads(board.read_text())))
        device = flash_mod.pick_port(port).device
    except (settings_mod.ConfigError, flash_mod.FlashError, OSError, ValueError) as e:
        typer.echo(f"holdover: {e}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"{device}: Ctrl-C to stop", err=True)
    style = {"log": "", "event": "bold", "rejected": "bold red", "other": "dim"}
    from rich.console import Console
    from rich.markup import escape

    out = Console(highlight=False)
    try:
        console_mod.follow(
            device,
            lambda s: out.print(f"[{style[s.kind]}]{escape(s.text)}[/]" if style[s.kind] else escape(s.text)),
            keys,
            seconds,
        )
    except console_mod.ConsoleError as e:
        typer.echo(f"holdover: {e}", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        pass


@app.command()
def relay(
    sentinel: str = typer.Argument(..., help="The sentinel's id."),
    op: str = typer.Argument(..., help="on, off or pulse."),
    ms: int = typer.Argument(0, help="For pulse: how long the relay stays on, in ms."),
    config: Path = typer.Option(..., "--config", "-c", help="The bridge's TOML config (broker and keys)."),
    timeout: float = typer.Option(10.0, help="Seconds to wait for the sentinel's answer."),
) -> None:
    """Switch a sentinel's relay with a signed command and print its answer."""
    from holdover.bridge import commands
    from holdover.firmware import protocol

    try:
        cfg = settings_mod.load(config)
        key = cfg.keys().get(sentinel)
        if key is None:
            raise commands.CommandError(f"no key for {sentinel!r} in {config}")
        ack = commands.send(cfg.mqtt, key, sentinel, op, ms, timeout)
    except (settings_mod.ConfigError, commands.CommandError, protocol.ProtocolError) as e:
        typer.echo(f"holdover: {e}", err=True)
        raise typer.Exit(2) from None
    what = f"{op} {ms} ms" if op == protocol.OP_PULSE else op
    relay_now = {True: "on", False: "off", None: "none"}[ack.get("relay")]
    if ack.get("ok"):
        typer.echo(f"{sentinel}: {what}: ok (relay now {relay_now})")
        return
    typer.echo(f"{sentinel}: {what}: refused: {ack.get('reason')}: {ack.get('detail')} (relay {relay_now})", err=True)
    raise typer.Exit(1)


failover_app = typer.Typer(help="The node's uplink failover.", no_args_is_help=True)
app.add_typer(failover_app, name="failover")


@failover_app.command("status")
def failover_status(
    config: Path = typer.Option(..., "--config", "-c", help="The bridge's TOML config ([failover])."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Probe every uplink once and show which one carries traffic."""
    import json

    from pyroute2 import IPRoute, NetNS
    from rich.console import Console
    from rich.table import Table

    from holdover.node.failover import check

    cfg = _config(config)
    fo = cfg.failover
    if not fo.uplinks:
        typer.echo(f"holdover: {config} has no [failover] uplinks", err=True)
        raise typer.Exit(2)
    with NetNS(fo.netns) if fo.netns else IPRoute() as ipr:
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


@app.command()
def status(
    config: Path = typer.Option(..., "--config", "-c", help="The bridge's TOML config (for the journal)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Sentinels, protected runs and uplinks at a glance, from the journal: works while the bridge is down."""
    import json

    from rich.console import Console
    from rich.table import Table

    from holdover.journal import Journal
    from holdover.node import launch
    from holdover.web import snapshot

    cfg = _config(config)
    _journal_exists(cfg)
    with Journal(cfg.journal.path, readonly=True) as j:
        st = {
            "sentinels": snapshot.sentinels(j, [s.id for s in cfg.sentinels]),
            "runs": launch.recover(cfg.protect.registry),
            "uplinks": snapshot.uplinks(j),
            "checkpoints": snapshot.checkpoints(j, 5),
        }
    if as_json:
        typer.echo(json.dumps(st, indent=2, default=str))
        return
    out = Console()
    t = Table(title="sentinels")
    for col in ("sentinel", "status", "mains", "battery", "runtime", "uplink", "relay", "last event"):
        t.add_column(col)
    for s in st["sentinels"]:
        pct = f"{s['battery_pct']:.0f} %" if isinstance(s["battery_pct"], int | float) else "-"
        rt = f"{s['runtime_s'] // 60} min" if isinstance(s["runtime_s"], int) else "-"
        mains = {True: "on", False: "[red]LOST[/red]", None: "-"}[s["mains"]]
        last = s["last_event"]
        t.add_row(
            s["sid"],
            s["status"] or "never heard",
            mains,
            pct,
            rt,
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
    up = st["uplinks"]
    out.print(
        f"uplink: {up['active'] or 'primary (no failover recorded)'}"
        + (f" since {up['since_s']:.0f} s" if up["since_s"] else "")
    )


@app.command()
def events(
    config: Path = typer.Option(..., "--config", "-c", help="The bridge's TOML config (for the journal)."),
    kind: str | None = typer.Option(None, help="Only this kind (mains_lost, failover, ...)."),
    sentinel: str | None = typer.Option(None, help="Only this sentinel ('node': this machine)."),
    limit: int = typer.Option(50, help="How many, newest last."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new events as they are journaled."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per line."),
) -> None:
    """The event journal, read directly: works while the bridge is down."""
    import json
    import time

    from holdover import events as kinds
    from holdover.journal import Journal

    cfg = _config(config)
    _journal_exists(cfg)

    def show(e: object) -> None:
        k = kinds.kind(e.kind)  # type: ignore[attr-defined]
        text = k.describe(sid=e.sid, **e.data)  # type: ignore[attr-defined]
        if as_json:
            typer.echo(json.dumps({"id": e.id, "rx_ts": e.rx_ts, "severity": k.severity, "text": text, **e.body}))  # type: ignore[attr-defined]
        else:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.rx_ts))  # type: ignore[attr-defined]
            typer.echo(f"{when}  {k.severity:8}  {e.sid:12}  {e.kind:20}  {text}")  # type: ignore[attr-defined]

    with Journal(cfg.journal.path, readonly=True) as j:
        rows = list(reversed(j.events(sid=sentinel, kind=kind, limit=limit)))
        for e in rows:
            show(e)
        last = rows[-1].id if rows else 0
        try:
            while follow:
                time.sleep(0.5)
                for e in reversed(j.events(sid=sentinel, kind=kind, limit=1000, after=last)):
                    show(e)
                    last = e.id
        except KeyboardInterrupt:
            pass


@app.command("test-alert")
def test_alert(
    config: Path = typer.Option(..., "--config", "-c", help="The bridge's TOML config ([alerts])."),
) -> None:
    """Send one test alert through every configured channel and print each one's result."""
    import socket

    from holdover.bridge import notify

    cfg = _config(config)
    if not cfg.alerts.channels:
        typer.echo(f"holdover: {config} has no [[alerts.channels]]", err=True)
        raise typer.Exit(2)
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
        raise typer.Exit(1)


@app.command("ha-remove")
def ha_remove(
    sentinel: str = typer.Argument(..., help="The sentinel's id."),
    config: Path = typer.Option(..., "--config", "-c", help="The bridge's TOML config (for the broker)."),
    prefix: str = typer.Option("homeassistant", help="Home Assistant's discovery prefix."),
) -> None:
    """Remove a sentinel's Home Assistant entities (empty their retained discovery configs)."""
    from holdover.bridge import discovery

    try:
        cfg = settings_mod.load(config)
        removed = discovery.remove(cfg.mqtt, sentinel, prefix)
    except (settings_mod.ConfigError, discovery.DiscoveryError) as e:
        typer.echo(f"holdover: {e}", err=True)
        raise typer.Exit(2) from None
    if not removed:
        typer.echo(f"no discovery configs for {sentinel} under {discovery.node_filter(sentinel, prefix)}")
        return
    for t in removed:
        typer.echo(f"removed {t}")
    typer.echo(
        f"{len(removed)} entities removed; {sentinel} publishes them again on its next connect "
        'unless its board config has "ha": {"discovery": false}'
    )


@app.command()
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
    from holdover.board.emulator import Emulator, EmulatorError, parse_hostport

    def interrupted(signum: int, _frame: object) -> None:
        # SIGTERM (systemd, kill) ends the run as Ctrl-C does: the finally below stops the
        # interpreter's whole process group and removes the temporary state directory.
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)
    try:
        emulator = Emulator(
            config,
            parse_hostport(control),
            heap=heap,
            state_dir=state,
            serial=parse_hostport(serial) if serial else None,
        )
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
    hold: float = typer.Option(
        0.0, help="Keep everything up this many seconds at the end, to open the dashboard in a browser."
    ),
) -> None:
    """Run the whole chain locally: Mosquitto, an emulated sentinel, the bridge; cut and restore mains."""
    from holdover.lab.demo import run_demo

    raise typer.Exit(run_demo(debounce_ms=debounce_ms, hold_s=hold))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def launch(
    ctx: typer.Context,
    name: str = typer.Option(..., "--name", "-n", help="Run name (tmux session holdover-NAME, log NAME.log)."),
    ckpt: Path | None = typer.Option(None, "--ckpt", help="The run's checkpoint directory, for `recover`."),
    log_dir: Path | None = typer.Option(None, help="Where the output log goes (default: the state directory)."),
) -> None:
    """Run a training command inside tmux, logged to a file and registered for protection: launch -n NAME -- CMD..."""
    from holdover.node.launch import LaunchError
    from holdover.node.launch import launch as do_launch

    try:
        run = do_launch(name, list(ctx.args), ckpt_dir=ckpt, log_dir=log_dir)
    except LaunchError as e:
        typer.echo(f"holdover: {e}", err=True)
        raise typer.Exit(2) from None
    if run.ended == 0:
        typer.echo(f"{run.name} finished at once (exit 0); its output is in {run.log}")
        return
    typer.echo(f"launched {run.name}: tmux session {run.session}, pid {run.pid}, log {run.log}")
    typer.echo(f"attach with: tmux attach -t {run.session}")


@app.command()
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
        if r.get("resume"):
            console.print(f"[bold]resume {r['name']}:[/bold] {r['resume']}", soft_wrap=True, highlight=False)


@app.command()
def forget(name: str = typer.Argument(..., help="A run that is not running.")) -> None:
    """Drop a run from `holdover recover` (its launch record, exit status and registration)."""
    from holdover.node.launch import LaunchError
    from holdover.node.launch import forget as do_forget

    try:
        removed = do_forget(name)
    except LaunchError as e:
        typer.echo(f"holdover: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"forgot {name}: removed {', '.join(str(p) for p in removed) or 'nothing more'}")


@app.command()
def verify(directory: Path = typer.Argument(..., help="A checkpoint directory or a run's checkpoint root.")) -> None:
    """Check a checkpoint's files against its manifest (or find the newest good one under a root)."""
    from holdover.train import ckpt

    try:
        if (directory / ckpt.MANIFEST).exists():
            m = ckpt.verify(directory)
            typer.echo(f"{directory}: step {m.step}, {len(m.files)} files, {m.nbytes} bytes: OK")
            return
        found = ckpt.newest_verified(directory, log=lambda msg: typer.echo(msg, err=True))
    except ckpt.CheckpointError as e:
        typer.echo(f"holdover: {e}", err=True)
        raise typer.Exit(1) from None
    if found is None:
        typer.echo(f"holdover: no verified checkpoint under {directory}", err=True)
        raise typer.Exit(1)
    typer.echo(f"newest verified: {found[0]} (step {found[1].step}, {found[1].nbytes} bytes)")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
