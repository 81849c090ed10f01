"""Training processes the bridge protects: registered runs, and processes matched by command line or tmux."""

from __future__ import annotations

import fnmatch
import re
import signal
from dataclasses import dataclass
from pathlib import Path

import psutil

from holdover.node import tmux
from holdover.settings import ProtectSettings
from holdover.train import registry

SHELLS = {"sh", "bash", "zsh", "fish", "dash", "tmux", "tee", "script"}


@dataclass
class Target:
    name: str
    pid: int
    source: str  # registration | cmdline | tmux
    socket: str | None = None
    ckpt_dir: str | None = None
    signal: int = int(signal.SIGUSR2)
    reg: registry.Registration | None = None

    @property
    def key(self) -> str:
        return f"{self.name}:{self.pid}"


def registry_dir(settings: ProtectSettings) -> Path:
    return settings.registry or registry.default_registry()


def discover(settings: ProtectSettings) -> tuple[list[Target], list[str]]:
    """Live targets, and problems worth a log line (unreadable or stale registrations)."""
    regs, problems = registry.read_registrations(registry_dir(settings))
    found: dict[int, Target] = {}
    for r in regs:
        if not r.alive():
            problems.append(f"registration {r.name} names pid {r.pid}, which is gone or now another process (stale)")
            continue
        label = r.name if r.rank == 0 else f"{r.name}.rank{r.rank}"
        found[r.pid] = Target(label, r.pid, "registration", r.socket or None, r.ckpt_dir, r.signal or 0, r)
    sig = int(getattr(signal, settings.signal))
    if settings.match_cmdline:
        pats = [re.compile(p) for p in settings.match_cmdline]
        for proc in psutil.process_iter(["pid", "cmdline", "name"]):
            cmd = " ".join(proc.info.get("cmdline") or [])
            if proc.info["pid"] not in found and cmd and any(p.search(cmd) for p in pats):
                found[proc.info["pid"]] = Target(
                    f"{proc.info['name']}-{proc.info['pid']}", proc.info["pid"], "cmdline", signal=sig
                )
    if settings.match_tmux:
        for session, pid in tmux.panes():
            if not any(fnmatch.fnmatch(session, g) for g in settings.match_tmux):
                continue
            for p in _workers(pid):
                if p not in found:
                    found[p] = Target(f"tmux:{session}", p, "tmux", signal=sig)
    return sorted(found.values(), key=lambda t: t.name), problems


def _workers(pane_pid: int) -> list[int]:
    """The topmost non-shell processes under a tmux pane (the training command, not its shell)."""
    try:
        root = psutil.Process(pane_pid)
    except psutil.Error:
        return []
    out: list[int] = []
    frontier = [root]
    while frontier:
        p = frontier.pop()
        try:
            if p.name() not in SHELLS:
                out.append(p.pid)
                continue
            frontier.extend(p.children())
        except psutil.Error:
            continue
    return out
