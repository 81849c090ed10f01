"""The room a training process has before the OOM killer: the least of MemAvailable and its memory
cgroup's limit less its working set (v2 and v1; page cache the kernel reclaims first not counted)."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from holdover.train import memory

GB = 1 << 30


def _tree(tmp: Path, proc: str, files: dict[str, str]) -> tuple[Path, Path]:
    (tmp / "proc").write_text(proc)
    for rel, text in files.items():
        (tmp / "cg" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / "cg" / rel).write_text(text)
    return tmp / "proc", tmp / "cg"


def test_a_slurm_job_s_v2_cgroup_limit_is_the_room_not_the_machine_s(tmp_path: Path) -> None:
    proc, root = _tree(
        tmp_path,
        "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n",
        {
            "system.slice/slurmstepd.scope/job_42/step_0/user/task_0/memory.max": f"{8 * GB}\n",
            "system.slice/slurmstepd.scope/job_42/step_0/user/task_0/memory.current": f"{6 * GB}\n",
            "system.slice/slurmstepd.scope/job_42/step_0/user/task_0/memory.stat": f"anon 1\ninactive_file {GB}\n",
        },
    )
    # 8 GB limit, 6 GB used of which 1 GB is cache the kernel drops first: 3 GB left.
    assert memory.room(proc, root) == min(3 * GB, psutil.virtual_memory().available)


def test_a_v1_memory_controller_inside_a_cgroup_namespace_reads_its_root(tmp_path: Path) -> None:
    # /proc/self/cgroup names the host's path; the mount shows the process's own cgroup as root.
    proc, root = _tree(
        tmp_path,
        "5:cpu,cpuacct:/\n4:memory:/docker/abc\n0::/\n",
        {
            "memory/memory.limit_in_bytes": f"{2 * GB}\n",
            "memory/memory.usage_in_bytes": f"{GB + GB // 2}\n",
            "memory/memory.stat": f"cache 9\ntotal_inactive_file {GB // 4}\n",
        },
    )
    assert memory.room(proc, root) == min(GB // 2 + GB // 4, psutil.virtual_memory().available)


@pytest.mark.parametrize(
    ("proc", "files"),
    [
        ("0::/\n", {"memory.max": "max\n", "memory.current": "123\n"}),
        (
            "4:memory:/\n",
            {"memory/memory.limit_in_bytes": "9223372036854771712\n", "memory/memory.usage_in_bytes": "5\n"},
        ),
        ("0::/\n", {}),  # no controller files to read (a restricted /sys)
        ("garbled", {}),
    ],
    ids=["v2-max", "v1-unlimited", "unreadable", "garbled"],
)
def test_without_a_limit_the_room_is_memavailable(tmp_path: Path, proc: str, files: dict[str, str]) -> None:
    p, root = _tree(tmp_path, proc, files)
    got = memory.room(p, root)
    assert abs(got - psutil.virtual_memory().available) < 256 << 20  # read a moment apart


def test_this_machine_has_room_and_no_more_than_it_has() -> None:
    assert 0 < memory.room() <= psutil.virtual_memory().total
