"""`holdover launch` / `recover` with a real tmux server (private to the test) and the toy run."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from holdover.node.launch import LaunchError, forget, launch, recover, sessions
from holdover.train import ckpt, registry
from support import HOLDOVER, wait_for

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


@pytest.fixture
def private_tmux(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TMUX_TMPDIR", str(tmp_path / "tmux"))  # a tmux server of the test's own
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("TMUX", raising=False)
    (tmp_path / "tmux").mkdir()
    yield
    subprocess.run(["tmux", "kill-server"], capture_output=True)


def test_launch_logs_registers_and_recover_says_how_to_resume(tmp_path: Path, private_tmux) -> None:
    reg = tmp_path / "reg"
    ck = tmp_path / "ckpt"
    argv = [sys.executable, "-m", "holdover.train.toy", "--ckpt", str(ck), "--steps", "100000", "--step-sleep", "0.02"]
    run = launch("exp1", argv, ckpt_dir=ck, registry_dir=reg)
    assert run.session == "holdover-exp1" and run.session in sessions()
    path = registry.registration_path(reg, "exp1")

    def hooked():
        r = registry.Registration.from_json(path.read_text())
        return r if r.socket else None

    r = wait_for(hooked, 30, "the run's own registration (with its socket)")
    assert r.pid == run.pid  # exec: the pane process is the training command itself
    assert r.tmux == "holdover-exp1"
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(30)
        s.connect(r.socket)
        s.sendall(registry.encode({"op": "save", "id": "x", "reason": "test"}))
        lines = []
        for line in s.makefile("rb"):
            lines.append(json.loads(line))
            if lines[-1]["state"] in ("done", "failed"):
                break
        assert lines[-1]["state"] == "done"
    wait_for(lambda: '"step": 3' in run.log.read_text(), 30, "output in the log file")
    with pytest.raises(LaunchError, match="still running"):
        launch("exp1", argv, ckpt_dir=ck, registry_dir=reg)

    runs = {x["name"]: x for x in recover(reg)}
    assert runs["exp1"]["state"] == "running" and "resume" not in runs["exp1"]

    subprocess.run(["kill", "-9", str(run.pid)], check=True)  # the outage
    wait_for(lambda: not registry.pid_alive(run.pid), 10, "the run to die")
    # tmux marks the pane dead a moment after its process is gone (seen: still "running" once the
    # pid was gone, in a clean-clone run): recover is asked until it has seen the end.
    got = wait_for(lambda: next((x for x in recover(reg) if x["state"] != "running"), None), 10, "recover seeing it")
    assert (got["state"], got["how"]) == ("killed", "signal SIGKILL")
    assert got["checkpoint"]["step"] == lines[-1]["step"]
    assert Path(got["checkpoint"]["dir"]) == ckpt.candidates(ck)[0]
    # Launched from here, and by the full path: after `make`, holdover is not on PATH.
    assert got["resume"].startswith(f"cd {Path.cwd()} && {HOLDOVER} launch --name exp1 --ckpt ")
    assert "holdover.train.toy" in got["resume"]
    # The dead pane is kept (remain-on-exit) but does not block a relaunch under the same name.
    again = launch("exp1", [sys.executable, "-c", "print('again')"], registry_dir=reg)
    assert again.ended == 0  # it finished within the launch's settling second
    wait_for(lambda: "again" in again.log.read_text(), 10, "the relaunched run's output")


def test_launch_refuses_bad_names_and_empty_commands(private_tmux) -> None:
    with pytest.raises(LaunchError, match="run name"):
        launch("a/b", ["true"])
    with pytest.raises(LaunchError, match="no command"):
        launch("ok", [])


def test_a_command_that_fails_at_once_is_reported_with_its_status_and_words(tmp_path: Path, private_tmux) -> None:
    reg = tmp_path / "reg"
    with pytest.raises(LaunchError, match=r"/nonexistent/python: no such command"):
        launch("typo", ["/nonexistent/python", "train.py"], registry_dir=reg)
    with pytest.raises(LaunchError, match=r"exited at once with status 2:\n.*can't open file .*/no_such_train.py"):
        launch("missing", [sys.executable, "no_such_train.py"], registry_dir=reg)
    with pytest.raises(LaunchError, match=r"exited at once with status 1:(.|\n)*ModuleNotFoundError"):
        launch("broken", [sys.executable, "-c", "import no_such_module_here"], registry_dir=reg)
    assert recover(reg) == [] and sessions() == set()  # nothing left behind to recover
    env = {**os.environ, "HOLDOVER_REGISTRY": str(reg)}
    cmd = [HOLDOVER, "launch", "-n", "typo2", "--", "/nonexistent/x"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert out.returncode == 2 and "/nonexistent/x: no such command" in out.stderr and "tmux" not in out.stderr


def test_recover_tells_finished_failed_and_killed_apart_and_resumes_only_the_unfinished(
    tmp_path: Path, private_tmux
) -> None:
    reg = tmp_path / "reg"
    slow = "import sys, time; time.sleep(float(sys.argv[2])); sys.exit(int(sys.argv[1]))"
    launch("done", [sys.executable, "-c", slow, "0", "1.5"], registry_dir=reg)
    launch("crashed", [sys.executable, "-c", slow, "3", "1.5"], registry_dir=reg)
    shot = launch("shot", ["sleep", "60"], registry_dir=reg)
    subprocess.run(["kill", "-9", str(shot.pid)], check=True)
    wait_for(lambda: {r["name"]: r["state"] for r in recover(reg)}.get("crashed") == "failed", 10, "the runs to end")
    # A power cut: tmux dies with everything in it, so no hook records the end.
    cut = launch("cut", ["sleep", "60"], registry_dir=reg)
    subprocess.run(["tmux", "kill-server"], check=True)
    wait_for(lambda: not registry.pid_alive(cut.pid), 10, "the pane to die with its server")
    runs = {r["name"]: r for r in recover(reg)}
    assert (runs["done"]["state"], runs["done"]["how"]) == ("finished", "exit 0") and "resume" not in runs["done"]
    assert (runs["crashed"]["state"], runs["crashed"]["how"]) == ("failed", "exit 3")
    assert (runs["shot"]["state"], runs["shot"]["how"]) == ("killed", "signal SIGKILL")
    assert runs["cut"]["state"] == "killed" and "no exit recorded" in runs["cut"]["how"]
    # The printed command works as pasted, by a shell that has no holdover on its PATH.
    env = {**os.environ, "PATH": "/usr/bin:/bin", "HOLDOVER_REGISTRY": str(reg)}
    r = subprocess.run(["bash", "-c", runs["crashed"]["resume"]], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and "launched crashed" in r.stdout, r.stderr  # alive past the settling second
    with pytest.raises(LaunchError, match="running"):
        forget("crashed", reg)
    assert forget("done", reg) and "done" not in {r["name"] for r in recover(reg, everything=True)}


def test_a_run_started_without_holdover_launch_is_running_not_orphaned(tmp_path: Path, private_tmux) -> None:
    # sbatch, a plain shell, the demo: no tmux session was ever there to lose.
    reg = tmp_path / "reg"
    me = registry.Registration("plain", os.getpid(), "", str(tmp_path / "ckpt"), 12, [], "/", 0.0)
    registry.write_registration(reg, me)
    [run] = [r for r in recover(reg) if r["name"] == "plain"]
    assert (run["state"], run["how"]) == ("running", "")


def test_a_verified_checkpoint_is_read_once_however_often_runs_are_listed(
    tmp_path: Path, private_tmux, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The dashboard and Home Assistant list runs every 30 s: the newest checkpoint is hashed once,
    # a new one when it comes, and a damaged newer one is passed over for the verified one.
    import holdover.node.launch as launch_module

    reads: list[str] = []
    real = ckpt.verify
    monkeypatch.setattr(ckpt, "verify", lambda p, *a, **k: reads.append(Path(p).name) or real(p, *a, **k))
    reg, root = tmp_path / "reg", tmp_path / "ckpt"
    registry.write_registration(reg, registry.Registration("r", os.getpid(), "", str(root), 12, [], "/", 0.0))
    weights = [ckpt.Tensor.from_buffer("w", "U8", [4096], bytes(range(256)) * 16)]
    ckpt.save(root, 1, [ckpt.Shard("shard_000.safetensors", weights)])
    for _ in range(3):
        assert recover(reg)[0]["checkpoint"]["step"] == 1
    assert reads == ["step_000000001"], reads
    d2, _ = ckpt.save(root, 2, [ckpt.Shard("shard_000.safetensors", weights)])
    assert recover(reg)[0]["checkpoint"]["step"] == 2 and reads[-1] == d2.name
    d3, _ = ckpt.save(root, 3, [ckpt.Shard("shard_000.safetensors", weights)])
    with open(d3 / "shard_000.safetensors", "r+b") as f:  # a flipped byte in the newest
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))
    assert recover(reg)[0]["checkpoint"]["step"] == 2
    assert recover(reg)[0]["checkpoint"]["step"] == 2 and reads.count(d3.name) == 2  # a damaged one is not kept
    assert not any(key[0] == str(d3) for key in launch_module._VERIFIED)
