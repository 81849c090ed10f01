"""NUT's own upsd and dummy-ups, run here: UPSes whose variables a test, a bench or the demo writes.

Debian's nut-server, started as its packaged services start it but by hand: the binaries in
/lib/nut (the /usr/sbin wrappers refuse to run unless /etc/nut/nut.conf's MODE allows it),
foregrounded (-F) so this process owns them, each dropping to the packaged `nut` user as it does
on a server, with NUT_CONFPATH, NUT_STATEPATH and NUT_ALTPIDPATH in directories of their own so
several can run at once. Those directories are laid out as Debian lays out /etc/nut and /run/nut
(root:nut 0750 with its files 0640; the state nut's own), outside the test's directory, which
`nut` cannot enter: a file NUT cannot read fails here as it would on a server. `dummy-ups` serves
the `var: value` lines of a .dev file and reads it again when it changes; `set()` replaces the
file atomically, so upsd never serves half of one.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from holdover import proc
from holdover.bridge.nut_serve import write_dev
from holdover.lab.broker import free_port
from holdover.node.nut_client import NutClient, NutError

NUT_BIN = Path("/lib/nut")


def available() -> bool:
    return (NUT_BIN / "upsd").exists() and (NUT_BIN / "dummy-ups").exists()


def nut_dir(prefix: str, *, nut_writes: bool = False) -> Path:
    """A directory NUT's user can read (root:nut 0750, as /etc/nut) or also write (nut's own, as /run/nut)."""
    where = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    for_nut(where, mode=0o770 if nut_writes else 0o750)
    if nut_writes:
        os.chown(where, pwd.getpwnam("nut").pw_uid, grp.getgrnam("nut").gr_gid)
    return where


def for_nut(path: Path, mode: int = 0o640) -> None:
    """root:nut and `mode`: what Debian's NUT packaging gives its config files."""
    os.chown(path, 0, grp.getgrnam("nut").gr_gid)
    path.chmod(mode)


class NutServer:
    def __init__(
        self,
        workdir: Path,
        upses: dict[str, dict[str, str]],
        users: dict[str, str] | None = None,
        port: int | None = None,
        confdir: Path | None = None,
    ) -> None:
        self.dir = Path(workdir)  # the daemons' logs
        self.confdir = confdir  # NUT's config made elsewhere (`holdover nut-config`): run it as it is
        self.upses = {name: dict(v) for name, v in upses.items()}
        self.users = users or {}  # upsd.users: name -> password (upsmon secondary)
        self.port = port or free_port()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.etc = self.confdir or nut_dir("holdover-nut-etc-")
        # The drivers' sockets live here: a short path, as sun_path holds 108 bytes and pytest's
        # directories are longer than that.
        self.state = nut_dir("holdover-nut-", nut_writes=True)

    @property
    def env(self) -> dict[str, str]:
        state = str(self.state)
        conf = str(self.etc)
        return {**os.environ, "NUT_CONFPATH": conf, "NUT_STATEPATH": state, "NUT_ALTPIDPATH": state}

    def dev(self, ups: str) -> Path:
        return self.etc / f"{ups}.dev"

    def _write_configs(self) -> None:
        section = '[{}]\n  driver = dummy-ups\n  port = {}\n  pollinterval = 1\n  desc = "holdover lab"\n'
        users = "".join(f"[{u}]\n  password = {p}\n  upsmon secondary\n" for u, p in self.users.items())
        for name, text in (
            ("nut.conf", "MODE=netserver\n"),
            ("ups.conf", "".join(section.format(name, self.dev(name)) for name in self.upses)),
            ("upsd.conf", f"LISTEN 127.0.0.1 {self.port}\n"),
            ("upsd.users", users),
        ):
            (self.etc / name).write_text(text)
            for_nut(self.etc / name)
        for name, found in self.upses.items():
            self.set(name, **found)

    def set(self, ups: str, **found: str) -> None:
        """Replace the UPS's variables (`ups.status="OB DISCHRG"`, ...): NUT serves them within a second."""
        self.upses[ups] = {k.replace("_", "."): str(v) for k, v in found.items()}
        lines = "".join(f"{k}: {v}\n" for k, v in self.upses[ups].items())
        write_dev(self.dev(ups), lines)

    def start(self, timeout: float = 15.0) -> NutServer:
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.confdir is None:
            self._write_configs()
        for name in self.upses:
            self.procs[name] = self._spawn([str(NUT_BIN / "dummy-ups"), "-a", name, "-F"], name)
        self.procs["upsd"] = self._spawn([str(NUT_BIN / "upsd"), "-F"], "upsd")
        deadline = time.monotonic() + timeout
        for name in self.upses:
            while True:
                try:
                    if self.read(name).get("ups.status", "WAIT") != "WAIT":
                        break
                except NutError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    logs = " / ".join(f"{p.name}: {p.read_text()[-300:]!r}" for p in self.dir.glob("*.log"))
                    raise RuntimeError(f"NUT did not serve {name} within {timeout:g} s: {logs}")
                time.sleep(0.1)
        return self

    def read(self, ups: str) -> dict[str, str]:
        """What upsd serves of `ups` now, as `upsc` would print it; NutError if it cannot say."""
        with NutClient("127.0.0.1", self.port, 1.0) as c:
            c.connect()
            return c.list_vars(ups)

    def _spawn(self, argv: list[str], log: str) -> subprocess.Popen[bytes]:
        out = (self.dir / f"{log}.log").open("ab")
        return proc.spawn(argv, env=self.env, stdout=out, stderr=subprocess.STDOUT)

    def stop_upsd(self) -> None:
        """upsd gone (the drivers stay): what a client sees when the NUT server dies."""
        self._kill("upsd")

    def _kill(self, name: str) -> None:
        p = self.procs.pop(name, None)
        if p is not None:
            proc.stop(p, grace=5)

    def stop(self) -> None:
        for name in list(self.procs):
            self._kill(name)
        shutil.rmtree(self.state, ignore_errors=True)
        if self.confdir is None:
            shutil.rmtree(self.etc, ignore_errors=True)

    def __enter__(self) -> NutServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Upsmon:
    """NUT's own upsmon as a secondary, as every other machine in a lab runs it: polling each second
    (POLLFREQ 1, its fastest), its NOTIFYCMD writing `<epoch seconds> <NOTIFYTYPE>` per line to
    `notified`, its SHUTDOWNCMD touching `shutdown`. Nothing is shut down here."""

    def __init__(self, workdir: Path, monitor: str) -> None:
        self.dir = Path(workdir)  # its log
        self.monitor = monitor  # MONITOR ups@host:port 1 user password secondary
        # Its NOTIFYCMD runs in upsmon's unprivileged half, as `nut`: what it writes is nut's.
        self.run = nut_dir("holdover-upsmon-", nut_writes=True)
        self.notified = self.run / "notified"
        self.shutdown = self.run / "shutdown"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Upsmon:
        w = self.run
        self.dir.mkdir(parents=True, exist_ok=True)
        (w / "notify.sh").write_text(f'#!/bin/bash\necho "$EPOCHREALTIME $NOTIFYTYPE" >> {self.notified}\n')
        (w / "shutdown.sh").write_text(f"#!/bin/sh\necho shutdown >> {self.shutdown}\n")
        for f in ("notify.sh", "shutdown.sh"):
            for_nut(w / f, 0o750)
        flags = "".join(
            f"NOTIFYFLAG {k} EXEC\n" for k in ("ONLINE", "ONBATT", "LOWBATT", "FSD", "COMMBAD", "COMMOK", "NOCOMM")
        )
        conf = (
            f'{self.monitor}\nMINSUPPLIES 1\nSHUTDOWNCMD "{w}/shutdown.sh"\nNOTIFYCMD {w}/notify.sh\n'
            f"POLLFREQ 1\nPOLLFREQALERT 1\nHOSTSYNC 5\nDEADTIME 5\nFINALDELAY 0\n"
            f"POWERDOWNFLAG {w}/killpower\n{flags}"
        )
        (w / "upsmon.conf").write_text(conf)
        for_nut(w / "upsmon.conf")
        env = {"NUT_CONFPATH": str(w), "NUT_STATEPATH": str(w), "NUT_ALTPIDPATH": str(w), "PATH": "/usr/bin:/bin"}
        log = (self.dir / "upsmon.log").open("ab")
        # upsmon keeps its pid in /run/nut whatever the environment says (NUT_ALTPIDPATH is for the
        # drivers and upsd), and a second one refuses to run ("a previous upsmon instance is
        # already running"): each gets a /run/nut of its own, a machine of its own as far as it knows.
        run = f"mount --bind {w} /run/nut && exec {NUT_BIN / 'upsmon'} -F"
        self.proc = proc.spawn(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", run], env=env, stdout=log, stderr=log
        )
        return self

    def said(self) -> list[tuple[float, str]]:
        """Every notification so far: (when, ONBATT / ONLINE / LOWBATT / FSD)."""
        if not self.notified.exists():
            return []
        out = []
        for line in self.notified.read_text().splitlines():
            when, _, kind = line.partition(" ")
            out.append((float(when), kind))
        return out

    def stop(self) -> None:
        self._end()
        shutil.rmtree(self.run, ignore_errors=True)

    def _end(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        # upsmon is two processes (a privileged parent, an unprivileged child): its group ends both.
        proc.stop(self.proc, grace=10)

    def __enter__(self) -> Upsmon:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
