"""A private Mosquitto on a free loopback port, for the demo, the tests and the benchmarks.

It never touches a system-wide broker: its own config, port and persistence file live in
a directory of its own, so it can be stopped and started again on the same port.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

from holdover import proc
from holdover.bridge.broker_config import NODELAY
from holdover.errors import HoldoverError

INSTALL_HINT = "Mosquitto is not installed: run `apt-get install mosquitto` (as root)."


class BrokerError(HoldoverError, RuntimeError):
    pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def mosquitto_binary() -> str:
    for cand in (shutil.which("mosquitto"), "/usr/sbin/mosquitto"):
        if cand and Path(cand).exists():
            return cand
    raise BrokerError(INSTALL_HINT)


class Broker:
    def __init__(
        self, port: int | None = None, workdir: Path | None = None, extra_conf: str = "", auth: str = ""
    ) -> None:
        """`auth`: the lines that replace anonymous access (broker_config.auth: passwords and an ACL)."""
        self.host = "127.0.0.1"
        self._chosen = port is None  # free_port()'s: another may be taken if someone took this one
        self.port = port or free_port()
        self._own_dir = workdir is None
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="holdover-mosquitto-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.conf = self.dir / "mosquitto.conf"
        self.log = self.dir / "mosquitto.log"
        self.store = self._store()
        self._rest = [
            NODELAY,  # as `holdover broker-config` writes it for a site
            auth or "allow_anonymous true\n",
            f"persistence true\npersistence_location {self.store}/\n",
            "log_dest stderr\nlog_type error\nlog_type warning\nlog_type notice\n",
            extra_conf,
        ]
        self._write_conf()
        self.proc: subprocess.Popen[bytes] | None = None

    def _write_conf(self) -> None:
        self.conf.write_text("".join([f"listener {self.port} {self.host}\n", *self._rest]))

    @staticmethod
    def _store() -> Path:
        """Where it saves its sessions. Started as root, mosquitto drops to its packaged `mosquitto`
        user, as Debian runs it: the store is that user's, in a directory it can reach (a test's
        own directory sits under root's 0700 tree), so a persistence that fails is seen here first."""
        store = Path(tempfile.mkdtemp(prefix="holdover-mosquitto-store-", dir="/tmp"))
        if os.geteuid() == 0:
            try:
                owner = pwd.getpwnam("mosquitto")
            except KeyError:
                raise BrokerError(f"no `mosquitto` user: {INSTALL_HINT}") from None
            os.chown(store, owner.pw_uid, owner.pw_gid)
        return store

    def start(self) -> Broker:
        binary = mosquitto_binary()
        attempt = 0
        while True:
            logged = self.log.stat().st_size if self.log.exists() else 0
            with self.log.open("ab") as logf:
                self.proc = proc.spawn([binary, "-c", str(self.conf)], stdout=logf, stderr=logf)
            if self._listening(10):
                self._chosen = False  # its clients know this port now: a restart keeps it
                return self
            self.stop()
            said = self.log.read_bytes()[logged:].decode(errors="replace")
            # free_port() let its port go, and under a parallel run another process may bind it
            # first: then a connect alone met that process, and the bridge and the sentinel talked
            # to it, hearing nothing. Only that is retried, on a fresh port, before anyone uses it.
            if not (self._chosen and "in use" in said and attempt < 2):
                raise BrokerError(f"mosquitto did not start; its log:\n{said[-2000:]}")
            self.port = free_port()
            self._write_conf()
            attempt += 1

    def _listening(self, timeout: float) -> bool:
        """Our mosquitto listening on the port (not merely someone), or False once it has exited."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            with contextlib.suppress(psutil.Error):
                for c in psutil.Process(self.proc.pid).net_connections("tcp"):
                    if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == self.port:
                        return True
            time.sleep(0.02)
        return False

    def stop(self, forget: bool = False) -> None:
        """Stop it; `forget` also drops what it saved, as a broker without persistence (Mosquitto's
        default) loses every session and queued message."""
        if self.proc is not None:
            proc.stop(self.proc, grace=10)  # SIGTERM first: mosquitto saves its persistence file on the way out
        self.proc = None
        if forget:
            (self.store / "mosquitto.db").unlink(missing_ok=True)

    def restart(self, down_for: float = 0.0) -> None:
        self.stop()
        time.sleep(down_for)
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.store, ignore_errors=True)
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Broker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
