"""`holdover launch` and `holdover recover`: runs that outlive an SSH session, and the way back after an outage.

A launched run lives in a tmux session (an SSH drop or a dead uplink no longer kills it), its whole
output goes to a log file, and it is registered for protection even if the script does not use
holdover.train (then the bridge can only signal and gcore it). A launch record keeps the command
and directory, so `recover` can print the exact command that resumes the run.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from holdover import proc
from holdover.errors import FAILED, USAGE, HoldoverError
from holdover.files import write_atomic
from holdover.node import cadence, tmux
from holdover.train import ckpt, job, registry

SESSION_PREFIX = "holdover-"


class LaunchError(HoldoverError):
    exit_code = USAGE


def state_home() -> Path:
    if os.geteuid() == 0 and not os.environ.get("XDG_STATE_HOME"):
        return Path("/var/lib/holdover")
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "holdover"


def _tmux(*args: str, check: bool = True) -> proc.Result:
    try:
        return tmux.tmux(*args, check=check)
    except tmux.TmuxError as e:
        raise LaunchError(str(e)) from None


def sessions() -> set[str]:
    return tmux.sessions()


@dataclass
class Launched:
    name: str
    session: str
    pid: int
    log: Path
    record: Path
    ended: int | None = None  # the exit status, for a command that finished at once (0 only: others raise)


# A command still running this long after its start has got past what makes most fail at once
# (a typo, a missing file, an import error); the launch waits that long to tell the user.
SETTLE_S = 1.0


def holdover_command() -> str:
    """The `holdover` of this installation, by its full path: commands printed for pasting, and
    units, must not depend on a PATH (after `make`, .venv/bin is not on it)."""
    here = Path(sys.executable).parent / "holdover"
    return str(here) if here.exists() else (shutil.which("holdover") or "holdover")


def exit_path(name: str) -> Path:
    """Where tmux's pane-died hook writes how the run ended: "STATUS:SIGNAL" (one of them empty)."""
    return state_home() / "runs" / f"{name}.exit"


def launch(
    name: str,
    argv: list[str],
    ckpt_dir: Path | None = None,
    log_dir: Path | None = None,
    registry_dir: Path | None = None,
    cwd: Path | None = None,
) -> Launched:
    if not name or any(c in name for c in "/.:") or name != name.strip():
        raise LaunchError(f"run name {name!r}: use letters, digits, - and _")
    if not argv:
        raise LaunchError("no command given (holdover launch --name NAME -- CMD ...)")
    cwd = (cwd or Path.cwd()).resolve()
    if shutil.which(argv[0], path=os.environ.get("PATH", "") + os.pathsep + str(cwd)) is None:
        raise LaunchError(f"{argv[0]}: no such command (not on PATH, not an executable file)")
    session = SESSION_PREFIX + name
    if session in sessions():
        dead = _tmux("display-message", "-p", "-t", session, "#{pane_dead}", check=False).output.strip()
        if dead != "1":
            raise LaunchError(f"a run named {name!r} is still running in tmux session {session}")
        _tmux("kill-session", "-t", session)  # the previous run's pane, kept after it ended
    reg_dir = registry_dir or registry.default_registry()
    home = state_home()
    log = (log_dir or home / "logs") / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {"HOLDOVER_RUN_NAME": name, "HOLDOVER_TMUX_SESSION": session, "HOLDOVER_REGISTRY": str(reg_dir)}
    ended = exit_path(name)
    ended.parent.mkdir(parents=True, exist_ok=True)
    ended.unlink(missing_ok=True)
    go = f"holdover-go-{name}-{secrets.token_hex(4)}"
    # The pane waits for `go` until remain-on-exit and the exit hook are set: a command that exits
    # at once would otherwise take its session, status and last words with it.
    # exec: the pane's process *is* the training command (its pid is what gets signalled and dumped);
    # tee keeps the output visible in the pane and appends it to the log from the first byte.
    # tee ignores SIGHUP: when a command dies at once, its pane's hangup must not take its last words.
    tee = f"trap '' HUP; exec tee -a {shlex.quote(str(log))}"
    inner = f"tmux wait-for {go}; exec {shlex.join(argv)} > >({tee}) 2>&1"
    args = ["new-session", "-d", "-s", session, "-c", str(cwd)]
    for k, v in env.items():
        args += ["-e", f"{k}={v}"]
    _tmux(*args, "bash", "-c", inner)
    _tmux("set-option", "-t", session, "remain-on-exit", "on")  # the exit status and last lines stay readable
    # How it ended, on disk: after a power cut tmux and its panes are gone, this file is not.
    record_end = f"run-shell \"echo '#{{pane_dead_status}}:#{{pane_dead_signal}}' > '{ended}'\""
    _tmux("set-hook", "-t", session, "pane-died", record_end)
    pid = int(_tmux("display-message", "-p", "-t", session, "#{pane_pid}").output.strip())
    _tmux("wait-for", "-S", go)
    record = home / "runs" / f"{name}.json"
    record.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(
        record,
        json.dumps(
            {
                "name": name,
                "argv": argv,
                "cwd": str(cwd),
                "log": str(log),
                "session": session,
                "ckpt_dir": str(ckpt_dir) if ckpt_dir else None,
                "registry": str(reg_dir),
                "launched": time.time(),
                "pid": pid,
            },
            indent=1,
        ),
    )
    reg_path = registry.registration_path(reg_dir, name)
    # A placeholder registration: a script using holdover.train replaces it with its socket.
    registry.write_registration(
        reg_dir,
        registry.Registration(
            name=name,
            pid=pid,
            socket="",
            ckpt_dir=str(ckpt_dir or ""),
            signal=int(signal.SIGUSR2),
            argv=argv,
            cwd=str(cwd),
            started=time.time(),
            tmux=session,
        ),
    )
    try:
        ended_at_once = _settle(name, session, argv, log)
    except LaunchError:
        # Said at once to the person who launched it: no run to recover, no registration to protect.
        for path in (record, reg_path, ended):
            path.unlink(missing_ok=True)
        _tmux("kill-session", "-t", session, check=False)
        raise
    return Launched(name, session, pid, log, reg_path, ended_at_once)


def _pane_end(session: str, wait_s: float = 0.0) -> tuple[bool, str, str]:
    """(dead, exit status, signal) of the session's pane, as tmux knows it.

    tmux built with utempter (Debian's) can miss the SIGCHLD of a pane's process while its
    utempter helper runs: the pane shows dead (its pty closed) with no status, the process stays
    a zombie and the pane-died hook waits. Any other child of tmux exiting makes it reap, so a
    `run-shell true` is the nudge."""
    fmt = "#{pane_dead}:#{pane_dead_status}:#{pane_dead_signal}"
    start = time.monotonic()
    nudged = False
    while True:
        r = _tmux("display-message", "-p", "-t", session, fmt, check=False)
        dead, status, sig = (r.output.strip() if r.ok else "0::").split(":")
        if status or sig:
            return True, status, sig
        waited = time.monotonic() - start
        if dead != "1" and waited >= wait_s:  # alive, or its pty not closed within wait_s
            return False, "", ""
        if waited >= wait_s + 1.0:  # dead, and tmux cannot say how
            return True, "", ""
        if dead == "1" and not nudged:
            _tmux("run-shell", "true", check=False)
            nudged = True
        time.sleep(0.05)


def _settle(name: str, session: str, argv: list[str], log: Path) -> int | None:
    """None if the command is still running after SETTLE_S; 0 if it finished cleanly by then;
    a LaunchError with its status and last lines if it failed."""
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        time.sleep(0.05)
        dead, status, sig = _pane_end(session)
        if not dead:
            continue
        if status == "0":
            return 0
        time.sleep(0.1)  # tee's last bytes
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-5:]) if log.exists() else ""
        what = f"status {status}" if status else f"signal {_signame(sig)}"
        raise LaunchError(f"{argv[0]} exited at once with {what}" + (f":\n{tail}" if tail else " (no output)"))
    return None


def _signame(sig: str) -> str:
    try:
        return signal.Signals(int(sig)).name
    except ValueError:
        return sig or "?"


FINISHED_KEEP_S = 7 * 86400  # a run that finished is listed this long (all of them with --all)


def _ending(name: str, session: str | None) -> tuple[str, str, float | None]:
    """(state, how, when) of a run whose process is gone: from what tmux's hook wrote, or from
    its dead pane while tmux still has it (the hook may not have run yet)."""
    path = exit_path(name)
    try:
        status, _, sig = path.read_text().strip().partition(":")
        when: float | None = path.stat().st_mtime
    except OSError:
        # Its process is gone; its pane dies once the log's tee lets go of the terminal.
        dead, status, sig = _pane_end(session, wait_s=2.0) if session else (False, "", "")
        if not dead:
            return "killed", "no exit recorded: a power cut, a reboot, or tmux itself killed", None
        if not status and not sig:
            return "killed", "it just ended; tmux has not said how yet", None
        when = time.time()
    if status == "0":
        return "finished", "exit 0", when
    if status:
        return "failed", f"exit {status}", when
    return "killed", f"signal {_signame(sig)}", when


# A committed checkpoint never changes: its MANIFEST.json, written last, names every byte. The
# bridge lists runs every 30 s for the dashboard and Home Assistant, and each listing would read
# every byte of each run's newest checkpoint again (3 s for 4 GB here); once verified, a
# checkpoint is taken as verified while its manifest is the same file. `holdover recover` and
# resume() run in a process of their own and verify afresh.
_VERIFIED: dict[tuple[str, int, int, int], ckpt.Manifest] = {}
_VERIFIED_MAX = 256


def _newest_verified(root: Path) -> tuple[Path, ckpt.Manifest] | None:
    for p in ckpt.candidates(root):
        try:
            st = (p / ckpt.MANIFEST).stat()
            key = (str(p), st.st_ino, st.st_size, st.st_mtime_ns)
            if key not in _VERIFIED:
                if len(_VERIFIED) >= _VERIFIED_MAX:
                    _VERIFIED.pop(next(iter(_VERIFIED)))
                _VERIFIED[key] = ckpt.verify(p)
            return p, _VERIFIED[key]
        except (OSError, ckpt.CheckpointError):
            continue  # damaged or gone meanwhile: the next older one
    return None


def recover(registry_dir: Path | None = None, everything: bool = False) -> list[dict[str, Any]]:
    """Every run holdover knows of: running, orphaned (alive without its tmux session), finished,
    failed or killed; its newest verified checkpoint; and, for an unfinished one that is gone, the
    command that resumes it. Runs that finished more than a week ago only with `everything`."""
    reg_dir = registry_dir or registry.default_registry()
    regs, _problems = registry.read_registrations(reg_dir)
    live_sessions = sessions()
    runs: dict[str, dict[str, Any]] = {}
    records = state_home() / "runs"
    for p in sorted(records.glob("*.json")) if records.is_dir() else []:
        try:
            rec = json.loads(p.read_text())
            runs[rec["name"]] = {
                "name": rec["name"],
                "argv": rec["argv"],
                "cwd": rec["cwd"],
                "ckpt_dir": rec.get("ckpt_dir"),
                "session": rec.get("session"),
                "pid": rec.get("pid"),
                "log": rec.get("log"),
            }
        except (OSError, ValueError, KeyError):
            continue
    for r in sorted(regs, key=lambda r: -r.rank):  # rank order: the lowest rank here names the run's pid
        run = runs.setdefault(r.name, {"name": r.name, "argv": r.argv, "cwd": r.cwd, "session": r.tmux, "log": None})
        run.update(pid=r.pid, ckpt_dir=r.ckpt_dir or run.get("ckpt_dir"), session=r.tmux or run.get("session"))
        run["job"] = r.job
        if r.bound is not None:  # the loss bound the bridge set (node/cadence.py), as its slowest rank keeps it
            run["bound"] = cadence.slowest([b for b in (run.get("bound"), r.bound) if b is not None])
        if r.world > 1:
            run["world"] = r.world
            alive = r.alive()
            run.setdefault("ranks", []).insert(0, {"rank": r.rank, "pid": r.pid, "alive": alive})
            if r.ckpt_dir:
                run["job_root"] = str(Path(r.ckpt_dir).parent)
    out = []
    holdover = shlex.quote(holdover_command())
    for run in runs.values():
        pid = run.get("pid")
        alive = bool(pid) and registry.pid_alive(int(pid))
        if alive:
            # Orphaned only when it had a tmux session (holdover launch) and lost it; a run started
            # some other way (sbatch, a plain shell, the demo) and alive is simply running.
            lost_tmux = bool(run.get("session")) and run["session"] not in live_sessions
            run["state"], run["how"] = ("orphaned", "alive, its tmux session gone") if lost_tmux else ("running", "")
        else:
            live = run.get("session") if run.get("session") in live_sessions else None
            run["state"], run["how"], ended = _ending(run["name"], live)
            if run["state"] == "finished" and not everything and ended and time.time() - ended > FINISHED_KEEP_S:
                continue
        newest = None
        if run.get("ckpt_dir"):
            found = _newest_verified(Path(run["ckpt_dir"]))
            if found:
                newest = {
                    "dir": str(found[0]),
                    "step": found[1].step,
                    "bytes": found[1].nbytes,
                    "age_s": round(time.time() - found[1].created, 1),
                }
        run["checkpoint"] = newest
        if run.get("job_root"):
            run["multi"] = job.read(Path(run.pop("job_root"))).as_dict()
        if not alive and run["state"] != "finished":
            ck = f" --ckpt {shlex.quote(run['ckpt_dir'])}" if run.get("ckpt_dir") else ""
            name, cwd = shlex.quote(run["name"]), shlex.quote(run["cwd"])
            run["resume"] = f"cd {cwd} && {holdover} launch --name {name}{ck} -- {shlex.join(run['argv'])}"
        out.append(run)
    return sorted(out, key=lambda r: r["name"])


def forget(name: str, registry_dir: Path | None = None) -> list[Path]:
    """Drop a run that is not running from what recover lists; the files removed."""
    reg_dir = registry_dir or registry.default_registry()
    known = {r["name"]: r for r in recover(reg_dir, everything=True)}
    if name not in known:
        raise LaunchError(f"no run named {name!r} (holdover recover --all lists them)", exit_code=FAILED)
    if known[name]["state"] in ("running", "orphaned"):
        raise LaunchError(
            f"{name!r} is {known[name]['state']} (pid {known[name]['pid']}): stop it first", exit_code=FAILED
        )
    regs = [*reg_dir.glob(f"{name}.json"), *reg_dir.glob(f"{name}.rank*.json")]
    paths = [state_home() / "runs" / f"{name}.json", exit_path(name), *regs]
    removed = []
    for path in paths:
        try:
            path.unlink()
            removed.append(path)
        except FileNotFoundError:
            pass
    return removed
