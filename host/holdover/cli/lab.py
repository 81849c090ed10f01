"""The lab's commands: the firmware in the MicroPython unix port, the whole chain as a demo, and
`holdover lab ...` to play with a held demo."""

from __future__ import annotations

import signal
from pathlib import Path

import typer

from holdover.cli.common import LAB, fail, wing

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
    ups: bool = typer.Option(
        False, "--ups", help="The host's UPS through NUT's own upsd, and a NUT client following the sentinel (root)."
    ),
    cluster: bool = typer.Option(
        False,
        "--cluster",
        help="A power cut on a 2-node Slurm cluster of Debian's own daemons in namespaces, a torch job on it (root).",
    ),
) -> None:
    """Run the whole chain locally: Mosquitto, an emulated sentinel, the bridge; cut and restore mains."""
    if ups and cluster:
        raise typer.BadParameter("one at a time: --ups or --cluster")
    if cluster:
        from holdover.lab.demo_cluster import run_cluster_demo

        raise typer.Exit(run_cluster_demo(hold_s=hold))
    if ups:
        from holdover.lab.demo_ups import run_ups_demo

        raise typer.Exit(run_ups_demo(hold_s=hold))
    from holdover.lab.demo import run_demo

    raise typer.Exit(run_demo(debounce_ms=debounce_ms, hold_s=hold))


play = typer.Typer(
    help="Play with a held demo (holdover demo --hold prints these with its port): cut the mains, flicker it, "
    "drop the WiFi or the uplink beyond it.",
    no_args_is_help=True,
)
app.add_typer(play, name="lab", rich_help_panel=LAB)
PORT = typer.Option(..., "--port", "-p", help="The held demo's control port (the demo prints it).")


def _ask(port: int, said: str, **cmd: object) -> None:
    from holdover.lab.controls import ask

    ask(port, cmd)
    typer.echo(f"done: {said}")


def _switch(value: str, on: str, off: str) -> bool:
    if value not in (on, off):
        raise fail(f"{value!r}: say {on} or {off}")
    return value == on


@play.command("mains")
def lab_mains(state: str = typer.Argument(..., help="off (a cut) or on"), port: int = PORT) -> None:
    """Cut the emulated sentinel's mains, or bring it back."""
    _ask(port, f"mains {state}", mains=_switch(state, "on", "off"))


@play.command("flicker")
def lab_flicker(
    ms: int = typer.Argument(100, min=1, max=2000, help="How long the mains is gone, ms."), port: int = PORT
) -> None:
    """A gap in the mains this long, timed on the board's own clock: under the debounce, a dip."""
    _ask(port, f"a {ms} ms flicker", dip_ms=ms)


@play.command("wifi")
def lab_wifi(state: str = typer.Argument(..., help="off or on"), port: int = PORT) -> None:
    """The sentinel's WiFi access point gone (MQTT silent; serial still speaks), or back."""
    _ask(port, f"wifi {state}", wlan=_switch(state, "on", "off"))


@play.command("uplink")
def lab_uplink(state: str = typer.Argument(..., help="down or up"), port: int = PORT) -> None:
    """The internet beyond the LAN gone (the sentinel's probe targets stop answering), or back."""
    _ask(port, f"uplink {state}", uplink=_switch(state, "up", "down"))
