"""`holdover launch` and `holdover recover`: runs that outlive an SSH session, and the way back after an outage.

A launched run lives in a tmux session (an SSH drop or a dead uplink no longer kills it), its whole
output goes to a log file, and it is registered for protection even if the script does not use
holdover.train (then the bridge can only signal and gcore it). A launch record keeps the command
and directory, so `recover` can print the exact command that resumes the run.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from holdover import proc
from holdover.node import tmux
from holdover.train import ckpt, registry

SESSION_PREFIX = "holdover-"


class LaunchError(Exception):
    pass


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
    cwd = (cwd or Path.cwd()).resolve()
    env = {"HOLDOVER_RUN_NAME": name, "HOLDOVER_TMUX_SESSION": session, "HOLDOVER_REGISTRY": str(reg_dir)}
    # exec: the pane's process *is* the training command (its pid is what gets signalled and dumped);
    # tee keeps the output visible in the pane and appends it to the log from the first byte.
    inner = f"exec {shlex.join(argv)} > >(exec tee -a {shlex.quote(str(log))}) 2>&1"
    args = ["new-session", "-d", "-s", session, "-c", str(cwd)]
    for k, v in env.items():
        args += ["-e", f"{k}={v}"]
    _tmux(*args, "bash", "-c", inner)
    _tmux("set-option", "-t", session, "remain-on-exit", "on")  # the exit status and last lines stay readable
    pid = int(_tmux("display-message", "-p", "-t", session, "#{pane_pid}").output.strip())
    record = home / "runs" / f"{name}.json"
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(
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
        )
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
    return Launched(name, session, pid, log, reg_path)


def recover(registry_dir: Path | None = None) -> list[dict[str, Any]]:
    """Every run holdover knows of: is it alive, where, its newest verified checkpoint, how to resume it."""
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
    for r in regs:
        run = runs.setdefault(r.name, {"name": r.name, "argv": r.argv, "cwd": r.cwd, "session": r.tmux, "log": None})
        run.update(pid=r.pid, ckpt_dir=r.ckpt_dir or run.get("ckpt_dir"), session=r.tmux or run.get("session"))
    out = []
    for run in runs.values():
        pid = run.get("pid")
        alive = bool(pid) and registry.pid_alive(int(pid))
        in_tmux = bool(run.get("session")) and run["session"] in live_sessions
        run["state"] = ("running" if in_tmux else "orphaned (alive, no tmux session)") if alive else "stopped"
        newest = None
        if run.get("ckpt_dir"):
            found = ckpt.newest_verified(run["ckpt_dir"], log=lambda m: None)
            if found:
                newest = {
                    "dir": str(found[0]),
                    "step": found[1].step,
                    "bytes": found[1].nbytes,
                    "age_s": round(time.time() - found[1].created, 1),
                }
        run["checkpoint"] = newest
        if not alive:
            ck = f" --ckpt {shlex.quote(run['ckpt_dir'])}" if run.get("ckpt_dir") else ""
            name, cwd = shlex.quote(run["name"]), shlex.quote(run["cwd"])
            run["resume"] = f"cd {cwd} && holdover launch --name {name}{ck} -- {shlex.join(run['argv'])}"
        out.append(run)
    return sorted(out, key=lambda r: r["name"])
