"""The bridge as a systemd service: its unit file, and sd_notify readiness and watchdog pings.

sd_notify is written out here (a datagram to $NOTIFY_SOCKET, sd_notify(3)): the protocol is a
dozen lines, and the libraries that wrap it either need libsystemd's headers to build
(systemd-python) or are unmaintained (sdnotify).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
from collections.abc import Callable, Mapping
from pathlib import Path

from holdover import proc
from holdover.files import write_atomic
from holdover.node import launch
from holdover.settings import Settings

log = logging.getLogger("holdover.systemd")

UNIT_NAME = "holdover-bridge.service"
WATCHDOG_SEC = 30

# What the bridge needs as root, and nothing more: gcore and cuda-checkpoint attach to training
# processes of any user (SYS_PTRACE); it signals them (KILL), reads their registrations and talks
# on their sockets (DAC_OVERRIDE); failover changes routes (NET_ADMIN) and probes bound to each
# uplink, by ICMP where unprivileged echo is off (NET_RAW).
CAPABILITIES = ("CAP_SYS_PTRACE", "CAP_KILL", "CAP_DAC_OVERRIDE", "CAP_NET_ADMIN", "CAP_NET_RAW")


STATE_DIR = Path("/var/lib/holdover")  # the service's working directory: relative config paths land here


def writable_paths(cfg: Settings) -> list[Path]:
    """What the bridge writes: the journal's directory and the rescue dumps (relative paths are
    taken from STATE_DIR, the unit's working directory)."""
    return [STATE_DIR / cfg.journal.path.parent, STATE_DIR / cfg.protect.rescue_dir]


def unit(exec_start: list[str], writable: list[Path], config: Path) -> str:
    """The unit file. `writable`: the only paths it may write (the journal, the rescue dumps);
    everything else of the system is read-only to it."""
    caps = " ".join(CAPABILITIES)
    cmd = " ".join(_quote(a) for a in exec_start)
    # "-": a path that does not exist yet (no rescue has run) must not stop the service starting.
    paths = " ".join(_quote(f"-{p}") for p in sorted(set(writable)))
    return f"""# Written by `holdover install-service` from {config}.
[Unit]
Description=holdover bridge: saves training runs when mains power or the uplink fails
After=network-online.target mosquitto.service
Wants=network-online.target

[Service]
Type=notify
NotifyAccess=main
ExecStart={cmd}
WorkingDirectory={STATE_DIR}
Restart=on-failure
RestartSec=2
# The bridge pings only from its own event loop: a wedged loop is restarted within this.
WatchdogSec={WATCHDOG_SEC}
# A rescue in progress is journaled; the next start resumes it. Give a clean stop time to say so.
TimeoutStopSec=30
KillMode=mixed

# Root, with only these capabilities left (why each: holdover.node.systemd.CAPABILITIES).
CapabilityBoundingSet={caps}
NoNewPrivileges=yes
ProtectSystem=strict
ReadWritePaths={paths}
StateDirectory=holdover
RuntimeDirectory=holdover
RuntimeDirectoryPreserve=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectKernelTunables=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
RestrictNamespaces=~user
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK
SystemCallArchitectures=native
# Not PrivateTmp, ProtectHome or PrivateDevices: the training runs it protects keep their
# sockets, checkpoints and /dev/shm where their users put them.

[Install]
WantedBy=multi-user.target
"""


def _quote(s: str) -> str:
    return f'"{s}"' if any(c.isspace() for c in s) else s


def install(cfg: Settings, config: Path, unit_dir: Path) -> tuple[Path, str]:
    """Write the unit for a bridge run with `config`; (its path, its text)."""
    config = config.resolve()
    text = unit([launch.holdover_command(), "bridge", "--config", str(config)], writable_paths(cfg), config)
    unit_dir.mkdir(parents=True, exist_ok=True)
    path = unit_dir / UNIT_NAME
    write_atomic(path, text)  # systemd may read it at any moment (a daemon-reload elsewhere)
    return path, text


def verify(path: Path) -> tuple[bool, str]:
    """`systemd-analyze verify` on a unit file: what systemd itself thinks of it."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        return False, "systemd-analyze is not installed"
    r = proc.run_sync([tool, "verify", str(path)], timeout=60)
    # An unknown key is only a warning to it (exit 0), and a unit with one is still wrong.
    return r.ok and not r.output.strip(), r.output.strip()


class Notifier:
    """sd_notify(3): readiness, status and watchdog pings to systemd; silent outside systemd."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.address = env.get("NOTIFY_SOCKET", "")
        if self.address.startswith("@"):
            self.address = "\0" + self.address[1:]  # an abstract socket
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        mine = not pid or pid == str(os.getpid())  # the watchdog may be meant for another process
        self.watchdog_s = int(usec) / 1e6 if usec.isdigit() and int(usec) > 0 and mine else 0.0
        self._sock: socket.socket | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, **fields: str | int) -> bool:
        if not self.address:
            return False
        msg = "\n".join(f"{k.upper()}={v}" for k, v in fields.items()).encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.sendto(msg, self.address)
            return True
        except OSError as e:
            log.warning("sd_notify to %r failed: %s", self.address, e)
            return False

    async def watchdog(self, healthy: Callable[[], str | None], status: Callable[[], str] | None = None) -> None:
        """WATCHDOG=1 at a third of the interval while `healthy()` says nothing is wrong (it
        returns the problem, or None), with a fresh STATUS= for `systemctl status`. From the
        loop's own task: if the loop wedges, pings stop and systemd restarts the bridge."""
        if not self.watchdog_s:
            return
        while True:
            problem = healthy()
            if problem is None:
                self.send(watchdog=1, **({"status": status()} if status else {}))
            else:
                log.warning("watchdog: not pinging systemd: %s", problem)
            await asyncio.sleep(self.watchdog_s / 3)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
