"""How much more memory this process can take before something gets killed.

The machine's MemAvailable is not the answer for a training job under Slurm (ConstrainRAMSpace)
or in a container: there the kernel's OOM killer acts on the job's cgroup at its own limit, with
the machine half empty. So the room is the least of MemAvailable and, for every limited cgroup the
process is in (v2 `memory.max`, v1 `memory.limit_in_bytes`), its limit less its working set (usage
less the inactive file pages the kernel reclaims before killing anything, as the kubelet counts it).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import psutil

CGROUP = Path("/sys/fs/cgroup")
NO_LIMIT = 1 << 60  # v1 says "no limit" with a huge page-rounded number, v2 with "max"


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return NO_LIMIT
    with contextlib.suppress(ValueError):
        return int(text)
    return None


def _stat(path: Path, key: str) -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    return 0


def _cgroup_room(proc_cgroup: Path, root: Path) -> int | None:
    """Room left under the process's memory cgroup, if it has a limit."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _id, controllers, path = parts
        if controllers == "":  # v2: one unified hierarchy
            files, base = ("memory.max", "memory.current", "inactive_file"), root
        elif "memory" in controllers.split(","):
            files, base = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"), root / "memory"
        else:
            continue
        # Inside a cgroup namespace the process's own cgroup is mounted as the root, while
        # /proc/self/cgroup may still name the path from the host's root.
        for d in (base / path.lstrip("/"), base):
            limit = _read_int(d / files[0])
            usage = _read_int(d / files[1])
            if limit is None or usage is None:
                continue
            if limit >= NO_LIMIT:
                break
            return max(0, limit - (usage - _stat(d / "memory.stat", files[2])))
    return None


def room(proc_cgroup: Path = Path("/proc/self/cgroup"), cgroup_root: Path = CGROUP) -> int:
    """Bytes this process can still allocate and touch without the OOM killer, as best known."""
    available = psutil.virtual_memory().available
    limited = _cgroup_room(proc_cgroup, cgroup_root)
    return available if limited is None else min(available, limited)
