"""A Debian 12 machine in a box: systemd as PID 1 under systemd-nspawn, on a throwaway overlay of
the image scripts/site-image builds, so Debian's packaged daemons run as their packages run them.

This host has no systemd, no system bus and no machined, hence `--register=no --keep-unit`, and
commands reach inside with `nsenter -a` on the box's systemd (never `machinectl`), under `env -i`
(nsenter passes the host's environment on: PIP_*, PYTHON* leaked into the box's pip) and
`timeout` (a command that hangs in a box must not hang the tier). Boxes that share a network are
started in a namespace of the tier's own (`nsenter --net`, never `ip netns exec`: that mounts a
fresh /sys, which hides the cgroups from nspawn) on an nspawn zone there; the host's own links are
never touched. ../shared/research/site_in_a_box.md has the trial this follows.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

BOXES = Path(os.environ.get("HOLDOVER_SITE_DIR", "/var/tmp/holdover-site")) / "boxes"
PATH = "/opt/holdover/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class BoxError(RuntimeError):
    pass


class Box:
    def __init__(self, name: str, image: Path, netns: str | None = None, addr: str | None = None) -> None:
        self.name = name
        self.image = image
        self.netns = netns  # a namespace of the tier's own, where the boxes' zone lives
        self.addr = addr  # this box's address on the zone, CIDR
        BOXES.mkdir(parents=True, exist_ok=True)
        self.base = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=BOXES))
        self.root = self.base / "root"
        self.console = self.base / "console.log"
        self.nspawn: subprocess.Popen[bytes] | None = None
        self.leader = 0

    def up(self, timeout: float = 60) -> Box:
        for d in ("upper", "work", "root"):
            (self.base / d).mkdir()
        lower, upper, work = self.image, self.base / "upper", self.base / "work"
        opts = f"lowerdir={lower},upperdir={upper},workdir={work}"
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(self.root)], check=True)
        # mmdebstrap copies the build host's name into the image: every box would be the same
        # machine to holdover (one MQTT client id for all their bridges), so each gets its own.
        (self.root / "etc/hostname").write_text(self.name + "\n")
        net = ["--network-zone=site"] if self.netns else ["--private-network"]
        argv = [
            "systemd-nspawn", "--boot", "-D", str(self.root), f"--machine={self.name}", "--register=no",
            "--keep-unit", "--console=pipe", "--kill-signal=SIGRTMIN+3", *net,
        ]  # fmt: skip
        if self.netns:
            argv = ["nsenter", f"--net=/run/netns/{self.netns}", *argv]
        with self.console.open("wb") as out:
            self.nspawn = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self.leader:
            self._alive()
            # nsenter execs nspawn, so its pid is the one started either way.
            r = subprocess.run(["pgrep", "-P", str(self.nspawn.pid), "-x", "systemd"], capture_output=True, text=True)
            pids = [int(p) for p in r.stdout.split()]
            self.leader = min(pids) if pids else 0
            if time.monotonic() > deadline:
                raise BoxError(f"{self.name}: no systemd in the box after {timeout:g} s: {self._console()}")
            time.sleep(0.05)
        state = ""
        while state not in ("running", "degraded"):
            self._alive()
            state = self.sh("systemctl is-system-running", check=False, timeout=10).strip()
            if time.monotonic() > deadline:
                failed = self.sh("systemctl --failed", check=False)
                raise BoxError(f"{self.name}: {state!r} after {timeout:g} s: {failed}")
            time.sleep(0.1)
        if self.addr:
            self.sh(f"ip link set host0 up && ip addr add {self.addr} dev host0")
        return self

    def run(self, script: str, timeout: float = 60) -> tuple[int, str]:
        """A bash script run as root in the box: its exit status, and its stdout and stderr."""
        argv = ["nsenter", "-t", str(self.leader), "-a", "env", "-i", f"PATH={PATH}", "HOME=/root", "LANG=C.UTF-8"]
        argv += ["timeout", "-k", "5", str(timeout), "bash", "-c", script]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 15)
        return r.returncode, r.stdout + r.stderr

    def sh(self, script: str, timeout: float = 60, check: bool = True) -> str:
        """`run`, its output; BoxError naming the script and what it said if it failed."""
        rc, out = self.run(script, timeout)
        if check and rc != 0:
            raise BoxError(f"{self.name}: `{script.strip()[:300]}` exited {rc}:\n{out[-3000:]}")
        return out

    def put(self, inside: str, src: Path) -> None:
        """A file or a directory of this host copied into the box (through the overlay)."""
        dest = self.root / inside.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dest, dirs_exist_ok=True)
        else:
            shutil.copy2(src, dest)

    def wait(self, script: str, timeout: float, what: str, explain: str = "") -> str:
        """Run `script` until it succeeds; its output. On a timeout, what `explain` prints says why."""
        deadline = time.monotonic() + timeout
        while True:
            rc, out = self.run(script, timeout=10)
            if rc == 0:
                return out
            if time.monotonic() > deadline:
                why = self.run(explain, timeout=20)[1][-4000:] if explain else ""
                raise BoxError(f"{self.name}: timed out waiting for {what}: {out[-1500:]}\n{why}")
            time.sleep(0.3)

    def _alive(self) -> None:
        if self.nspawn is not None and self.nspawn.poll() is not None:
            raise BoxError(f"{self.name}: systemd-nspawn exited {self.nspawn.returncode}: {self._console()}")

    def _console(self) -> str:
        return self.console.read_text(errors="replace")[-2000:] if self.console.exists() else ""

    def down(self) -> None:
        """Power off as `machinectl poweroff` would (SIGRTMIN+3 to its systemd), then clean up."""
        if self.nspawn is not None and self.nspawn.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                if self.leader:
                    os.kill(self.leader, signal.SIGRTMIN + 3)
            try:
                self.nspawn.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.nspawn.pid, signal.SIGKILL)
                self.nspawn.wait(10)
        subprocess.run(["umount", "-l", str(self.root)], capture_output=True)
        shutil.rmtree(self.base, ignore_errors=True)
        # nspawn leaves this behind when /run is not a tmpfs (this host's is not).
        shutil.rmtree(Path("/run/systemd/nspawn/propagate") / self.name, ignore_errors=True)

    def __enter__(self) -> Box:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()
