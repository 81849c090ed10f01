"""`holdover launch` / `recover` with a real tmux server (private to the test) and the toy run."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import wait_for
from holdover.node.launch import LaunchError, launch, recover, sessions
from holdover.train import ckpt, registry

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
    got = recover(reg)[0]
    assert got["state"] == "stopped"
    assert got["checkpoint"]["step"] == lines[-1]["step"]
    assert Path(got["checkpoint"]["dir"]) == ckpt.candidates(ck)[0]
    assert got["resume"].startswith(f"cd {Path.cwd()} && ")  # launched from here
    assert "holdover launch --name exp1 --ckpt" in got["resume"] and "holdover.train.toy" in got["resume"]
    # The dead pane is kept (remain-on-exit) but does not block a relaunch under the same name.
    again = launch("exp1", [sys.executable, "-c", "print('again')"], registry_dir=reg)
    wait_for(lambda: "again" in again.log.read_text(), 10, "the relaunched run's output")


def test_launch_refuses_bad_names_and_empty_commands(private_tmux) -> None:
    with pytest.raises(LaunchError, match="run name"):
        launch("a/b", ["true"])
    with pytest.raises(LaunchError, match="no command"):
        launch("ok", [])
