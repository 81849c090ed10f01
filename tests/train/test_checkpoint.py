"""The checkpoint format and the training-side hook, on real files and real processes (CPU torch)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from holdover.train import ckpt, registry, state
from holdover.train.guard import Guard
from holdover.train.schedule import AdaptiveInterval, GradNormHistogram, drift
from holdover.train.toy import build
from support import Toy, losses, small_tmpfs


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = build(64, 4)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(8, 64)
    model(x).sum().backward()
    opt.step()
    return model, opt


def test_roundtrip_is_exact_and_readable_by_safetensors(tmp_path: Path) -> None:
    from safetensors import safe_open

    model, opt = _model()
    d, manifest = state.save(tmp_path, 7, model, opt, extra={"data_pos": 7}, shard_bytes=20_000)
    assert d.name == "step_000000007"
    shards = [f for f in manifest.files if f.name.endswith(".safetensors")]
    assert len(shards) >= 3 and all(len(f.hash) == 32 for f in manifest.files)
    assert ckpt.verify(d).step == 7
    loaded = state.load(d)
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.tensors[k], v), k
    # The files are plain safetensors: the reference reader sees the same tensors.
    with safe_open(str(d / shards[0].name), "pt") as f:
        key = next(iter(f.keys()))
        assert torch.equal(f.get_tensor(key), loaded.tensors[key])
    model2, opt2 = _model()
    torch.nn.init.zeros_(model2[0].weight)
    state.apply(loaded, model2, opt2)
    assert torch.equal(model2[0].weight, model[0].weight)
    assert loaded.train["extra"] == {"data_pos": 7}
    s1, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert all(torch.equal(s1[i]["exp_avg_sq"], s2[i]["exp_avg_sq"]) for i in s1)


def test_same_step_saved_twice_keeps_both(tmp_path: Path) -> None:
    model, opt = _model()
    d1, _ = state.save(tmp_path, 3, model, opt)
    d2, _ = state.save(tmp_path, 3, model, opt)
    assert d1 != d2 and ckpt.verify(d1) and ckpt.verify(d2)
    assert ckpt.candidates(tmp_path)[0] == d2  # the later one wins on resume


def test_corrupted_shard_is_skipped_with_a_message_naming_the_file(tmp_path: Path) -> None:
    model, opt = _model()
    good, _ = state.save(tmp_path, 10, model, opt, shard_bytes=20_000)
    bad, manifest = state.save(tmp_path, 20, model, opt, shard_bytes=20_000)
    victim = bad / manifest.files[1].name
    with open(victim, "r+b") as f:
        f.seek(victim.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(ckpt.CheckpointError, match=f"{victim.name}: hash mismatch"):
        ckpt.verify(bad)
    messages: list[str] = []
    g = Guard(
        tmp_path,
        "t",
        model=_model()[0],
        optimizer=_model()[1],
        signal=None,
        registry_dir=tmp_path / "reg",
        log=messages.append,
    )
    assert g.resume() == 10
    assert any(f"resumed t from {good}" in m for m in messages), messages
    assert any("skipping damaged checkpoint step_000000020" in m and victim.name in m for m in messages), messages


def test_manifest_problems_are_named(tmp_path: Path) -> None:
    model, opt = _model()
    d, _ = state.save(tmp_path, 1, model, opt)
    m = json.loads((d / ckpt.MANIFEST).read_text())
    m["files"][0]["name"] = "../../etc/passwd"
    (d / ckpt.MANIFEST).write_text(json.dumps(m))
    with pytest.raises(ckpt.CheckpointError, match="escapes the checkpoint directory"):
        ckpt.verify(d)
    (d / ckpt.MANIFEST).write_text("{not json")
    with pytest.raises(ckpt.CheckpointError, match="manifest is not valid"):
        ckpt.verify(d)
    (d / ckpt.MANIFEST).unlink()
    assert ckpt.candidates(tmp_path) == []  # no manifest: never a checkpoint


def test_kill_9_mid_save_leaves_the_previous_checkpoint_intact(tmp_path: Path) -> None:
    model, opt = _model()
    prev, _ = state.save(tmp_path, 1, model, opt)
    # A child writes a ~600 MB checkpoint; it is killed while the shards are being written.
    script = (
        "import sys, torch; from holdover.train import state\n"
        "m = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(36)])\n"
        "print('go', flush=True)\n"
        "state.save(sys.argv[1], 2, m, threads=2)\n"
        "print('finished', flush=True)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "go"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        tmps = [p for p in tmp_path.iterdir() if p.name.startswith(ckpt.TMP_PREFIX)]
        if tmps and any(f.stat().st_size > 0 for f in tmps[0].iterdir()):
            break
        time.sleep(0.005)
    else:
        pytest.fail("the child never started writing")
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert ckpt.candidates(tmp_path) == [prev]
    assert ckpt.verify(prev).step == 1
    loaded = state.load(prev)
    assert torch.equal(loaded.tensors["0.weight"], model[0].weight)
    ckpt.prune(tmp_path, keep=3)  # the dead writer's temporary directory goes
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(ckpt.TMP_PREFIX)]


def test_full_disk_is_refused_before_writing_and_the_previous_checkpoint_survives(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "small", "size=1m") as mnt:
        small = torch.nn.Linear(64, 64)
        prev, _ = state.save(mnt, 1, small)  # tmpfs refuses O_DIRECT: this is the buffered path
        free = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
        big = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)])  # ~2 MB
        with pytest.raises(
            ckpt.CheckpointError,
            match=rf"disk full: the checkpoint needs \d+ bytes, {free} are free in .*; nothing was written",
        ):
            state.save(mnt, 2, big)
        assert sorted(p.name for p in mnt.iterdir()) == [prev.name]  # no partial files at all
        assert os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize == free
        assert ckpt.verify(prev).step == 1


def test_full_disk_mid_save_names_the_file_and_the_space_free_before(tmp_path: Path) -> None:
    # Room enough for the bytes, but the filesystem runs out of inodes while the files are made:
    # a real ENOSPC after the pre-flight check passed (as when another writer fills the disk).
    with small_tmpfs(tmp_path / "small", "size=8m,nr_inodes=8") as mnt:
        prev, _ = state.save(mnt, 1, torch.nn.Linear(64, 64))
        free = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
        many = torch.nn.Sequential(*[torch.nn.Linear(128, 128) for _ in range(12)])
        with pytest.raises(
            ckpt.CheckpointError, match=rf"disk full writing .*{free} were free in .* before the attempt"
        ):
            state.save(mnt, 2, many, shard_bytes=70_000)
        assert sorted(p.name for p in mnt.iterdir()) == [prev.name]
        assert ckpt.verify(prev).step == 1


# --- the hook in a real training process ----------------------------------------------------------


def test_save_on_request_then_resume_reproduces_the_uninterrupted_run(tmp_path: Path) -> None:
    ref = Toy(tmp_path / "ref", "--steps", "14")
    ref_losses = losses(ref.finish()[0])
    assert sorted(ref_losses) == list(range(1, 15))

    run = Toy(tmp_path / "cut", "--steps", "14", "--step-sleep", "0.05")
    msgs = run.ask({"op": "save", "id": "r1", "reason": "mains_lost", "after": "exit"})
    assert msgs[-1]["state"] == "done", msgs
    assert any(m["state"] == "saving" for m in msgs)
    saved_step = msgs[-1]["step"]
    out, _ = run.finish()
    assert json.loads(out.splitlines()[-1]) == {"stopped_after_save": saved_step}
    assert saved_step < 14
    d = Path(msgs[-1]["dir"])
    assert ckpt.verify(d).step == saved_step

    resumed = Toy(tmp_path / "cut", "--steps", "14")
    out, err = resumed.finish()
    assert f"resumed toy from {d}" in err
    got = losses(out)
    assert min(got) == saved_step + 1
    # CPU torch is deterministic: the next step (and every later one) matches bit for bit.
    for step, loss in got.items():
        assert loss == ref_losses[step], (step, loss, ref_losses[step])


def test_repeated_request_id_watches_instead_of_saving_twice(tmp_path: Path) -> None:
    with Toy(tmp_path, "--steps", "100000", "--step-sleep", "0.02", torch=False) as run:
        first = run.ask({"op": "save", "id": "same", "reason": "test"})
        again = run.ask({"op": "save", "id": "same", "reason": "test"})
        assert first[-1]["state"] == again[-1]["state"] == "done"
        assert first[-1]["dir"] == again[-1]["dir"]
        assert len(ckpt.candidates(run.ckpt)) == 1
        status = run.ask({"op": "status"})[0]
        assert status["requests"]["same"]["state"] == "done"
        assert status["registration"]["last_save"]["step"] == first[-1]["step"]
        assert run.ask({"op": "watch", "id": "nope"})[-1]["state"] == "unknown"


def test_signal_asks_for_a_save_at_the_next_step(tmp_path: Path) -> None:
    with Toy(tmp_path, "--steps", "100000", "--step-sleep", "0.02", torch=False) as run:
        reg = run.registration()
        assert reg.signal == signal.SIGUSR2 and reg.ckpt_dir == str(run.ckpt)
        os.kill(reg.pid, signal.SIGUSR2)
        deadline = time.monotonic() + 30
        while not ckpt.candidates(run.ckpt):
            assert time.monotonic() < deadline, "no checkpoint after SIGUSR2"
            time.sleep(0.05)
        assert ckpt.verify(ckpt.candidates(run.ckpt)[0]).meta["reason"] == "signal"
        assert run.proc.poll() is None  # SIGUSR2 saves; it does not stop the run


def test_malformed_socket_requests_get_an_error_line(tmp_path: Path) -> None:
    with Toy(tmp_path, "--steps", "100000", "--step-sleep", "0.05", torch=False) as run:
        reg = run.registration()
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(reg.socket)
            s.sendall(b"garbage\n" + registry.encode({"op": "fly"}) + registry.encode({"op": "status"}))
            f = s.makefile("rb")
            assert "malformed request" in json.loads(f.readline())["error"]
            assert "unknown op" in json.loads(f.readline())["error"]
            assert json.loads(f.readline())["registration"]["name"] == "toy"


# --- schedule, drift, warm-up ---------------------------------------------------------------------


def test_adaptive_interval_follows_the_loss_within_the_overhead_bound() -> None:
    a = AdaptiveInterval(initial=100, min_steps=10, max_steps=1000, flat=0.01, patience=2, max_overhead=0.05)
    a.observe_step_time(1.0)
    a.saved(100, 1.0, 0.5)
    a.saved(200, 1.001, 0.5)  # flat once
    assert a.interval == 100
    a.saved(300, 1.002, 0.5)  # flat twice: lengthen
    assert a.interval == 200
    a.saved(500, 0.5, 0.5)  # moving: shorten
    assert a.interval == 100
    # A save costing 20 s against 1 s steps: at 5% overhead the interval may not drop below 400.
    a.saved(600, 0.1, 20.0)
    assert a.interval == 400
    assert a.overhead() <= 0.05 + 1e-9
    assert [why for _, _, why in a.history] == ["loss flat", "loss moving", "overhead bound (5%)"]
    # What an overlapped snapshot made the next optimizer step wait counts too (20 + 10 s: 600).
    a.paid(10.0)
    assert a.interval == 600 and a.history[-1] == (600, 600, "overhead bound (5%)")
    a.paid(0.0)
    assert len(a.history) == 4
    with pytest.raises(ValueError):
        AdaptiveInterval(initial=5, min_steps=10)


def test_grad_norm_drift_warns_only_when_the_run_has_moved() -> None:
    h = GradNormHistogram()
    for i in range(200):
        h.add(1.0 + 0.1 * (i % 7))
    stored = h.summary()
    assert stored and sum(stored["log10"]["counts"]) == 200
    assert drift(stored, [1.1, 1.2, 1.3]) is None
    warning = drift(stored, [80.0, 95.0, 120.0])
    assert warning and "drifted" in warning


def test_warmup_scales_lr_only_inside_the_optimizer_step(tmp_path: Path) -> None:
    model, opt = _model()
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
    state.save(tmp_path, 5, model, opt, sched)
    model2, opt2 = _model()
    sched2 = torch.optim.lr_scheduler.ExponentialLR(opt2, gamma=0.9)
    g = Guard(
        tmp_path,
        "w",
        model=model2,
        optimizer=opt2,
        scheduler=sched2,
        signal=None,
        registry_dir=tmp_path / "reg",
        warmup_steps=4,
        log=lambda m: None,
    ).start()
    try:
        assert g.resume() == 5
        base = opt2.param_groups[0]["lr"]
        seen = []
        opt2.register_step_pre_hook(lambda o, a, k: seen.append(o.param_groups[0]["lr"]))  # runs after ours
        for step in range(6, 12):
            model2(torch.randn(4, 64)).sum().backward()
            opt2.step()
            g.step_end(step)
        assert opt2.param_groups[0]["lr"] == base  # the scheduler's value is never touched
        assert seen[:4] == pytest.approx([base * f for f in (1 / 5, 2 / 5, 3 / 5, 4 / 5)])
        assert seen[4:] == pytest.approx([base, base])
    finally:
        g.close()


def test_registration_and_socket_are_removed_on_close(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "4242")  # under Slurm: the bridges learn the job from the registration
    g = Guard(tmp_path / "c", "clean", signal=None, registry_dir=tmp_path / "reg").start()
    reg_path = registry.registration_path(tmp_path / "reg", "clean")
    assert reg_path.exists() and Path(g.reg.socket).exists()
    assert registry.Registration.from_json(reg_path.read_text()).job == "4242"
    g.close()
    assert not reg_path.exists() and not Path(g.reg.socket).exists()
    shutil.rmtree(tmp_path / "reg")


DIST = """
import sys, torch, torch.distributed as dist
from holdover.train.guard import Guard
rank, root, init = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
model = torch.nn.Linear(4, 4)
g = Guard(root, "ddp", model=model, signal=None, registry_dir=root + "/reg").start()
saved = []
for step in range(1, 7):
    if rank == 1 and step == 3:
        g.request("only rank 1 was asked")  # one rank hears the bridge; all must save this step
    g.step_end(step)
    if g.reg.last_save and g.reg.last_save.step not in saved:
        saved.append(g.reg.last_save.step)
print(saved, flush=True)
g.close()
dist.destroy_process_group()
"""


def test_under_torch_distributed_every_rank_saves_the_same_step(tmp_path: Path) -> None:
    init = f"file://{tmp_path / 'rendezvous'}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", DIST, str(r), str(tmp_path), init],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert [o.strip().splitlines()[-1] for o, _ in outs] == ["[3]", "[3]"]
    for r in (0, 1):
        assert [ckpt.verify(d).step for d in ckpt.candidates(tmp_path / f"rank{r}")] == [3]


def test_an_emergency_checkpoint_is_pinned_and_rotation_keeps_it(tmp_path: Path) -> None:
    model, opt = _model()
    root = tmp_path / "ckpt"
    g = Guard(
        root, "pin", model=model, optimizer=opt, signal=None, registry_dir=tmp_path / "reg", keep=1, interval=2
    ).start()
    try:
        for step in range(1, 10):
            if step == 3:
                g.request("mains_lost")  # what the bridge asks for on battery
            g.step_end(step, loss=1.0)
    finally:
        g.close()
    kept = {ckpt.verify(p).step: (p, ckpt.pinned(p)) for p in ckpt.candidates(root)}
    newest = max(kept)
    assert sorted(kept) == [3, newest] and newest > 3, kept  # the periodic ones between rotated away
    assert kept[3][1] and not kept[newest][1]
    assert ckpt.verify(kept[3][0]).meta["reason"] == "mains_lost"  # the pin file is outside the manifest
    (kept[3][0] / ckpt.PIN).unlink()  # unpinned by hand: back in rotation
    ckpt.prune(root, keep=1)
    assert ckpt.candidates(root) == [kept[newest][0]]
