"""`holdover doctor`: audit a training node before the outage, not after.

Each check is one of the field report's causes of a lost run, answered pass / warn / fail with the
fix. It only reads: no sysctl, route or file of the machine is changed. `root` points the file
reads (/etc/ssh, /proc/sys, /proc/net/bonding) at a fixture tree for tests, the way prometheus'
process collector takes `proc=`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from holdover import proc
from holdover.events import duration
from holdover.journal import Journal
from holdover.mqtt_session import SessionError, session
from holdover.node import cadence, plan
from holdover.node import targets as targets_mod
from holdover.node.cadence import Cadence
from holdover.node.checks import FAIL, PASS, SKIP, WARN, Check
from holdover.node.ups import Runtime, UpsReading, read_once, runtime_from
from holdover.settings import Settings

# A sentinel states every 30 s by default; three missed in a row is not a slow network.
STALE_AFTER_S = 90.0
KEEPALIVE_MAX_S = 600  # NAT and stateful firewalls commonly forget an idle connection after 5-15 min
SESSION_KEEPERS = ("tmux", "screen")


class Doctor:
    def __init__(self, cfg: Settings, root: Path = Path("/"), broker_timeout: float = 3.0) -> None:
        self.cfg = cfg
        self.root = root
        self.broker_timeout = broker_timeout
        self._targets: list[targets_mod.Target] | None = None
        self._ups: UpsReading | None = None  # read by the UPS check, used by the checkpoint check
        self._ups_read: tuple[UpsReading | None, str | None] = (None, None)

    def run(self) -> list[Check]:
        return [
            self.sessions(),
            self.ssh_keepalive(),
            self.tcp_keepalive(),
            self.backup_uplink(),
            self.bonding(),
            *self.disk_space(),
            self.ups(),
            *self.checkpoint_fits(),
            *self.rescue_plan(),
            self.gdb(),
            self.broker(),
            self.one_bridge(),
            self.hooks(),
            *self.heartbeats(),
            self.journal_size(),
        ]

    def hooks(self) -> Check:
        name = "every hook's program is there"
        if not self.cfg.hooks:
            return Check(name, SKIP, "no [[hooks]]")
        missing = [f"{','.join(h.events)}: {p}" for h in self.cfg.hooks if (p := proc.missing_program(h.run))]
        if missing:
            return Check(name, FAIL, "; ".join(missing), "fix the [[hooks]] run line or install the script")
        return Check(name, PASS, f"{len(self.cfg.hooks)} hook(s), each program found")

    def _path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    def targets(self) -> list[targets_mod.Target]:
        if self._targets is None:
            self._targets, _problems = targets_mod.discover(self.cfg.protect)
        return self._targets

    # --- the runs -----------------------------------------------------------------------------

    def sessions(self) -> Check:
        name = "runs survive a dropped SSH session"
        runs = self.targets()
        if not runs:
            return Check(
                name,
                WARN,
                "no protected training run found",
                "start runs with `holdover launch` or register them with holdover.train.protect()",
            )
        bare = [t.name for t in runs if not _in_session_keeper(t.pid)]
        if bare:
            return Check(
                name,
                FAIL,
                f"not inside tmux or screen: {', '.join(bare)} (they die with the terminal that started them)",
                "relaunch with `holdover launch --name NAME -- CMD` (tmux, logged, protected)",
            )
        return Check(name, PASS, f"{len(runs)} run(s), each inside tmux or screen")

    def disk_space(self) -> list[Check]:
        out = []
        for t in self.targets():
            save = t.reg.last_save if t.reg else None
            name = f"room for the next checkpoint of {t.name}"
            if not t.ckpt_dir or save is None:
                out.append(Check(name, WARN, "no checkpoint yet: its size is unknown", "let it save once"))
                continue
            try:
                free = shutil.disk_usage(t.ckpt_dir).free
            except OSError as e:
                out.append(Check(name, FAIL, f"{t.ckpt_dir}: {e.strerror}", "create the checkpoint directory"))
                continue
            need = save.nbytes
            detail = f"{_gb(free)} free in {t.ckpt_dir}, the last checkpoint {_gb(need)}"
            fix = "free space or move the checkpoints; an emergency checkpoint needs it at once"
            if free < need:
                out.append(Check(name, FAIL, detail, fix))
            elif free < 2 * need:
                out.append(Check(name, WARN, detail + " (room for one more, not two)", fix))
            else:
                out.append(Check(name, PASS, detail))
        return out

    def checkpoint_fits(self) -> list[Check]:
        """The last checkpoint's duration against the host UPS's runtime, less the grace time the
        bridge waits and the margin it keeps."""
        rt = self._runtime()
        p = self.cfg.protect
        budget, source = rt.seconds - p.margin - p.grace, rt.said
        out = []
        for t in self.targets():
            save = t.reg.last_save if t.reg else None
            if save is None:
                continue
            name = f"an emergency checkpoint of {t.name} fits the UPS's runtime"
            detail = f"the last took {save.seconds:.0f} s; {budget:.0f} s left to save in ({source})"
            if save.seconds > budget:
                fix = "a bigger UPS, a faster checkpoint disk, or a shorter grace time in [protect]"
                out.append(Check(name, FAIL, detail, fix))
            elif save.seconds > budget / 2:
                out.append(Check(name, WARN, detail + ": little slack", "a slower disk day would not fit"))
            else:
                out.append(Check(name, PASS, detail))
        return out

    def rescue_plan(self) -> list[Check]:
        """Every run's save together, as the plan schedules them per disk, against the same runtime: each may
        fit alone while not all of them fit in turn (node/plan.py)."""
        p = plan.for_node(self.cfg.protect, self._runtime())
        if not p.fits and not p.cannot:
            return []
        name = "a cut now saves every protected run"
        if not p.cannot:
            return [Check(name, PASS, p.sentence())]
        fix = (
            "set [protect] max_loss_min so that a cut loses little of the runs that do not fit; "
            "or a bigger UPS, a faster checkpoint disk, or checkpoints on another disk"
        )
        # Only a run measured and shown not to fit fails, unless its loss is bounded; one never saved
        # yet, or a guessed runtime, warns.
        measured_out = any(r.save_s is not None for r, _why in p.cannot) and not self.cfg.protect.max_loss_min
        return [Check(name, FAIL if measured_out and not p.guess else WARN, p.sentence(), fix), *self.loss_bound(p)]

    def loss_bound(self, p: plan.Plan) -> list[Check]:
        """What a cut takes of each run the plan cannot save: at most [protect] max_loss_min where the
        run holds that bound (node/cadence.py sets it), else all since its newest checkpoint."""
        out = cadence.left_out(p)
        if not out:
            return []
        name = "a cut loses little of the runs it cannot save"
        bound_s = self.cfg.protect.max_loss_min * 60
        if not bound_s:
            ages = ", ".join(f"{r.name} {duration(r.age_s)}" for r, _ in p.cannot if r.name in out and r.age_s)
            detail = f"{', '.join(out)}: a cut loses all since the newest checkpoint" + (
                f" ({ages} now)" if ages else ""
            )
            fix = "set [protect] max_loss_min (e.g. 30): each such run then saves that often, behind its loop"
            return [Check(name, WARN, detail, fix)]
        said, status = [], PASS
        for run, why in out.items():
            held = [t.reg.bound for t in self.targets() if t.reg is not None and t.reg.name == run]
            if not held or any(b is None or b.get("max_loss_s") != bound_s for b in held):
                said.append(f"{run} does not hold the bound yet (the bridge tells it within {Cadence.EVERY_S:.0f} s)")
                status = FAIL if status == FAIL else WARN
                continue
            slowest = cadence.slowest([b for b in held if b is not None])
            said.append(cadence.sentence(run, slowest, why))
            if not slowest.get("meets"):
                status = FAIL
        fix = {
            PASS: "",
            WARN: "is `holdover bridge` running? (a Guard from an older holdover cannot hold one: upgrade the run)",
            FAIL: "a larger max_loss_min, a faster checkpoint disk, or a bigger UPS",
        }[status]
        return [Check(name, status, "; ".join(said), fix)]

    def ups(self) -> Check:
        """What sets an emergency's deadline: the host's UPS, read now as the bridge reads it."""
        name = "the host's UPS sets the deadline"
        u, default = self.cfg.ups, self.cfg.protect.runtime_default
        if not u.enabled:
            why = f"no [ups]: an emergency's deadline is [protect] runtime_default ({default:.0f} s), a guess"
            return Check(name, FAIL, why, '[ups] nut = "myups@127.0.0.1:3493" (upsc -l 127.0.0.1 lists the names)')
        if not u.source:
            why = f"[ups] runtime_s = {u.runtime_s:.0f} s: a fixed guess, not read from the UPS"
            return Check(name, WARN, why, "read the UPS through NUT: [ups] nut (or apcupsd)")
        self._ups, problem = self._ups_read = read_once(u)
        if self._ups is None:
            if u.apcupsd:
                return Check(
                    name, FAIL, str(problem), f"is apcupsd running with NETSERVER on? (apcaccess -h {u.apcupsd})"
                )
            return Check(name, FAIL, str(problem), "is upsd running, and the UPS's name right? (upsc -l HOST)")
        if self._ups.runtime_s is None:
            why = f"{u.source}: {self._ups.describe()}: the deadline falls back to runtime_default, a guess"
            return Check(name, WARN, why, "set [ups] runtime_s to the UPS's runtime at your load")
        return Check(name, PASS, f"{u.source}: {self._ups.describe()}")

    def _runtime(self) -> Runtime:
        # The UPS check's reading; a fixed [ups] runtime_s is read without a UPS.
        u = self.cfg.ups
        r, problem = self._ups_read if u.source else read_once(u)
        return runtime_from(u, r, problem, self.cfg.protect.runtime_default)

    def gdb(self) -> Check:
        name = "gcore can dump a run that cannot save"
        if not self.cfg.protect.gcore:
            return Check(name, SKIP, "[protect] gcore = false")
        if shutil.which("gdb") is None:
            return Check(name, FAIL, "gdb is not installed (gcore comes with it)", "apt-get install gdb")
        scope = _read(self._path("/proc/sys/kernel/yama/ptrace_scope"))
        if scope == "3":
            return Check(name, FAIL, "kernel.yama.ptrace_scope = 3: no process may be traced", "boot with 0-2")
        if scope == "2" and os.geteuid() != 0:
            return Check(name, FAIL, "ptrace_scope 2 and not root", "run the bridge as root (its service is)")
        return Check(name, PASS, f"gdb found; ptrace_scope {scope or 'absent (no Yama)'}")

    # --- the network ----------------------------------------------------------------------------

    def ssh_keepalive(self) -> Check:
        name = "SSH sessions survive idle firewalls"
        files = [self._path("/etc/ssh/sshd_config"), *sorted(self._path("/etc/ssh/sshd_config.d").glob("*.conf"))]
        if not files[0].exists():
            return Check(name, SKIP, "no sshd_config here")
        value = None
        for f in files:
            for line in (_read(f) or "").splitlines():
                words = line.split("#", 1)[0].split()
                if len(words) >= 2 and words[0].lower() == "clientaliveinterval" and value is None:
                    value = words[1]  # sshd takes the first value it reads
        fix = "ClientAliveInterval 60 and ClientAliveCountMax 10 in /etc/ssh/sshd_config.d/keepalive.conf"
        if value is None or value in ("0", "0s"):
            return Check(name, WARN, "sshd sends no keepalives: an idle session is cut by NAT or a firewall", fix)
        return Check(name, PASS, f"ClientAliveInterval {value}")

    def tcp_keepalive(self) -> Check:
        name = "idle TCP connections are kept alive"
        raw = _read(self._path("/proc/sys/net/ipv4/tcp_keepalive_time"))
        if raw is None or not raw.isdigit():
            return Check(name, SKIP, "net.ipv4.tcp_keepalive_time unreadable")
        fix = f"net.ipv4.tcp_keepalive_time = 300 in /etc/sysctl.d/90-keepalive.conf (at most {KEEPALIVE_MAX_S})"
        if int(raw) > KEEPALIVE_MAX_S:
            return Check(name, WARN, f"net.ipv4.tcp_keepalive_time = {raw} s: idle sockets die at middleboxes", fix)
        return Check(name, PASS, f"net.ipv4.tcp_keepalive_time = {raw} s")

    def backup_uplink(self) -> Check:
        name = "a healthy backup uplink"
        fo = self.cfg.failover
        if not fo.uplinks:
            return Check(
                name,
                WARN,
                "no [failover] uplinks: a dead uplink stops every run that needs the network",
                "a USB NIC or a 4G dongle as a second uplink; see docs/failover.md",
            )
        from holdover.node.failover import check
        from holdover.node.netlink import open_handle

        try:
            with open_handle(fo.netns) as ipr:
                st = _off_loop(lambda: check(fo, ipr))
        except Exception as e:  # netlink or a probe's setup: reported, not raised
            return Check(name, FAIL, f"cannot probe the uplinks: {e}", "holdover failover status says more")
        failing = [u["name"] for u in st["uplinks"][1:] if not u["up"]]
        primary = st["uplinks"][0]
        if failing:
            return Check(name, FAIL, f"backup uplink(s) failing their probes: {', '.join(failing)}", "check the link")
        note = "" if primary["up"] else f"; the primary {primary['name']} is failing now"
        return Check(name, PASS if primary["up"] else WARN, f"{len(st['uplinks']) - 1} backup(s) answering{note}")

    def bonding(self) -> Check:
        name = "bonded links have all their slaves"
        bonds = sorted(self._path("/proc/net/bonding").glob("*"))
        if not bonds:
            return Check(name, SKIP, "no bonding on this node")
        down = []
        for bond in bonds:
            slave = None
            for line in (_read(bond) or "").splitlines():
                key, _, value = line.partition(":")
                if key.strip() == "Slave Interface":
                    slave = value.strip()
                elif key.strip() == "MII Status" and slave is not None and value.strip() != "up":
                    down.append(f"{bond.name}: {slave} {value.strip()}")
        if down:
            return Check(name, FAIL, f"redundancy gone: {'; '.join(down)}", "reseat or replace the link")
        return Check(name, PASS, f"{', '.join(b.name for b in bonds)}: every slave up")

    def broker(self) -> Check:
        name = "the broker answers"
        m = self.cfg.mqtt
        where = f"{m.host}:{m.port}"
        problem = _mqtt_connect(m.host, m.port, m.username, m.password, self.broker_timeout)
        if problem:
            return Check(name, FAIL, f"{where}: {problem}", "is Mosquitto running there? holdover broker-config")
        return Check(name, PASS, f"{where} accepted the bridge's login")

    def one_bridge(self) -> Check:
        """Two bridges for one node (a manual run beside the service) take each other's broker
        session every two seconds and would both run every hook: found by the journal they share."""
        name = "one bridge runs for this node"
        journal = str(self.cfg.journal.path.resolve())
        found = sorted(_bridges_on(journal))
        if not found:  # whether one ran lately, the sentinels' checks say
            return Check(name, SKIP, f"no bridge running with {journal} open")
        if len(found) > 1:
            who = "; ".join(f"pid {pid}: {cmd}" for pid, cmd in found)
            return Check(
                name,
                FAIL,
                f"{len(found)} bridges share {journal} and the client id {self.cfg.client_id}: {who}",
                "stop the one started by hand (the service's is in `systemctl status holdover-bridge`)",
            )
        return Check(name, PASS, f"pid {found[0][0]}")

    def heartbeats(self) -> list[Check]:
        out = []
        now = time.time()
        with _journal(self.cfg) as j:
            for s in self.cfg.sentinels:
                name = f"sentinel {s.id} is heard"
                row = j.sentinel(s.id) if j else None
                if not row:
                    out.append(Check(name, FAIL, "never heard by this bridge", "power it and check its config"))
                    continue
                seen = row.get("seen_ts") or row.get("status_ts")
                if row.get("status") == "offline":
                    out.append(Check(name, FAIL, f"offline (its last will) {_ago(now, seen)}", "is it powered?"))
                elif row.get("status") == "serial only":
                    why = f"off the network, heard over USB serial only, last {_ago(now, seen)}"
                    out.append(Check(name, WARN, why, "check its WiFi and the broker (holdover diagnose)"))
                elif seen is None or now - seen > STALE_AFTER_S:
                    out.append(Check(name, FAIL, f"last heard {_ago(now, seen)}", "is the bridge running?"))
                else:
                    out.append(Check(name, PASS, f"online, last heard {_ago(now, seen)}"))
        return out

    def journal_size(self) -> Check:
        name = "the journal's size is bounded"
        path, days = self.cfg.journal.path, self.cfg.journal.keep_routine_days
        try:
            size = path.stat().st_size + sum(
                p.stat().st_size for p in (path.with_name(path.name + s) for s in ("-wal", "-shm")) if p.exists()
            )
        except OSError:
            return Check(name, SKIP, f"no journal at {path} yet")
        n = max(1, len(self.cfg.sentinels))
        if not days:
            # 2,880 heartbeats a day each at 143 bytes a row with its index (20,000 journaled and
            # measured here): about 12 MB a month each.
            why = f"{path}: {size / 1e6:.1f} MB, heartbeats kept forever (~{12 * n} MB a month for {n} sentinel(s))"
            return Check(name, WARN, why, "[journal] keep_routine_days = 7")
        return Check(name, PASS, f"{path}: {size / 1e6:.1f} MB; heartbeats and refused messages kept {days:g} days")


def _in_session_keeper(pid: int) -> bool:
    with contextlib.suppress(psutil.Error):
        for parent in psutil.Process(pid).parents():
            if parent.name().split(":")[0].lower() in SESSION_KEEPERS:
                return True
    return False


def _bridges_on(journal: str) -> list[tuple[int, str]]:
    """Processes running `holdover bridge` with this journal open: (pid, command line)."""
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        argv = p.info["cmdline"] or []
        if "bridge" not in argv or not any("holdover" in a for a in argv):
            continue
        with contextlib.suppress(psutil.Error):
            if any(f.path == journal for f in p.open_files()):
                out.append((p.info["pid"], " ".join(argv)))
    return out


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def _ago(now: float, ts: float | None) -> str:
    return "never" if ts is None else f"{now - ts:.0f} s ago"


@contextlib.contextmanager
def _journal(cfg: Settings):  # type: ignore[no-untyped-def]
    if not cfg.journal.path.exists():
        yield None
        return
    with Journal(cfg.journal.path, readonly=True) as j:
        yield j


def _off_loop(fn: Any) -> Any:
    """pyroute2's sync API refuses to run inside a running event loop; a thread has none."""
    box: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as e:  # handed back to the caller
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if errors:
        raise errors[0]
    return box[0]


def _mqtt_connect(host: str, port: int, user: str, password: str, timeout: float) -> str | None:
    """None if the broker accepts this login, else what went wrong, in words."""
    try:
        with session(host, port, user, password, mqtt5=True, timeout=timeout):
            return None
    except SessionError as e:
        return e.reason
