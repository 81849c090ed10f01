"""The bridge's emergency policy against real training processes: save, verify, gcore, restart safety.

The first test runs the whole chain (emulated sentinel, real Mosquitto, bridge, a toy PyTorch run);
the others drive the Rescuer with events accepted into a real journal, to test one thing each.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import xxhash

from holdover import events
from holdover.firmware import protocol
from holdover.journal import Event, Journal
from holdover.node.rescue import Rescuer
from holdover.node.rescue_ledger import RescueLedger
from holdover.node.ups import Runtime
from holdover.settings import ProtectSettings
from holdover.train import ckpt, registry
from support import Toy, losses, wait_for

needs_gdb = pytest.mark.skipif(shutil.which("gcore") is None, reason="gcore (gdb) is not installed")

HANG = (
    "import sys, time\n"
    "from holdover.train.guard import Guard\n"
    "g = Guard(sys.argv[1], 'wedged', registry_dir=sys.argv[2]).start()\n"
    "marker = bytearray(sys.argv[3].encode())  # in memory only: the core must hold it\n"
    "print('ready', flush=True)\n"
    "while True:\n"
    "    time.sleep(0.2)  # never reaches a step boundary: a wedged data loader\n"
)


_seq = iter(range(1, 1_000_000))


def _event(j: Journal, kind: str, **data: object) -> Event:
    body = {"sid": "s1", "boot": "b00t", "seq": next(_seq), "kind": kind, "ms": 0, "ts": None, "data": data}
    ev = j.accept("mqtt", body)
    assert ev is not None
    return ev


def _settings(tmp: Path, **kw: object) -> ProtectSettings:
    base = {
        "registry": tmp / "reg",
        "rescue_dir": tmp / "rescue",
        "grace": 0,
        "margin": 5,
        "runtime_default": 120,
        "hang_after": 3,
    }
    return ProtectSettings.model_validate({**base, **kw})


async def _drive(rescuer: Rescuer, *events: Event, idle: bool = True) -> None:
    for ev in events:
        rescuer.on_event(ev)
    if idle:
        await asyncio.wait_for(rescuer.wait_idle(), 120)


def test_power_cut_on_the_sentinel_gets_a_verified_checkpoint_that_resumes_exactly(rig_factory, tmp_path: Path) -> None:
    ref = Toy(tmp_path / "ref", "--steps", "400")
    ref_losses = losses(ref.finish(120)[0])
    with Toy(tmp_path / "live", "--steps", "100000", "--step-sleep", "0.02") as run:
        run.registration()
        # A sentinel cell whose runtime (about 20 min at 4.1 V and this load) is far from the
        # bridge's default (600 s): the deadline shows the sentinel's cell is not the host's clock.
        rig = rig_factory(
            protect={"registry": str(run.reg_dir), "rescue_dir": str(tmp_path / "rescue"), "grace": 0},
            firmware={"battery": {"pin": 34, "load_w": 28.0}},
        )
        rig.wait("boot", timeout=30)
        rig.control.send(mains=False)
        lost = rig.wait("mains_lost", timeout=10)
        runtime = lost.info["data"]["runtime_s"]
        assert 900 < runtime < 1500, runtime
        journal = rig.dir / "journal.db"

        def verified():
            with Journal(journal, readonly=True) as j:
                return [s for s in RescueLedger(j).steps() if s["action"] == "verified"]

        found = wait_for(verified, 60, "a verified checkpoint")[0]
        step = found["detail"]
        assert found["target"].startswith("toy:") and step["bytes"] > 0 and step["mb_s"] > 0
        with Journal(journal, readonly=True) as j:
            actions = [s["action"] for s in RescueLedger(j).steps() if s["target"] != "*"]
            assert actions[:2] == ["requested", "queued"] and "done" in actions
            rescue = RescueLedger(j).rescues()[0]
            assert rescue["reason"] == protocol.MAINS_LOST
            # No [ups]: runtime_default (600 s, a guess) less the margin (60 s); never the sentinel's cell.
            assert abs(rescue["deadline"] - rescue["started"] - (600 - 60)) < 5, (rescue, runtime)
        assert run.proc.poll() is None  # after_save=continue: the run goes on
    saved = step["step"]
    assert saved < 400
    # Resume from the emergency checkpoint, not a later one: keep only it.
    for d in ckpt.candidates(run.ckpt):
        if d != Path(step["dir"]):
            shutil.rmtree(d)
    resumed = Toy(tmp_path / "live", "--steps", str(saved + 3))
    got = losses(resumed.finish(120)[0])
    assert min(got) == saved + 1
    assert all(got[s] == ref_losses[s] for s in got), "the resumed run differs from the uninterrupted one"


@needs_gdb
def test_a_wedged_run_is_dumped_with_gcore_and_shm_is_copied(tmp_path: Path) -> None:
    marker = "holdover-marker-" + os.urandom(8).hex()
    shm = Path(f"/dev/shm/holdover-test-{os.getpid()}.bin")
    shm.write_bytes(os.urandom(100_000))
    proc = subprocess.Popen(
        [sys.executable, "-c", HANG, str(tmp_path / "ckpt"), str(tmp_path / "reg"), marker],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        s = _settings(tmp_path, shm=[str(shm)], hang_after=2)
        with Journal(tmp_path / "j.db") as j:
            asyncio.run(_drive(Rescuer(s, j), _event(j, events.UPS_ON_BATTERY, ups="hostups", runtime_s=300)))
            steps = {x["action"]: x["detail"] for x in RescueLedger(j).steps() if x["target"] != "*"}
            alerts = [e.kind for e in j.events()]
        assert "hung" in steps and "rescued" in steps, steps
        core = Path(steps["gcore"]["core"])
        assert core.is_relative_to(tmp_path / "rescue") and core.stat().st_size == steps["gcore"]["bytes"]
        data = core.read_bytes()
        assert marker.encode() in data
        assert xxhash.xxh3_128(data).hexdigest() == steps["gcore"]["xxh3_128"]
        copied = steps["shm_copy"]["files"][0]
        assert Path(copied["dst"]).read_bytes() == shm.read_bytes()
        assert copied["xxh3_128"] == xxhash.xxh3_128(shm.read_bytes()).hexdigest()
        assert "checkpoint_hung" in alerts and "rescued" in alerts
        assert proc.poll() is None  # gcore detaches; the process lives on
    finally:
        proc.kill()
        proc.wait()
        shm.unlink()


def test_a_bridge_restart_mid_rescue_never_makes_a_run_save_twice(tmp_path: Path) -> None:
    # Steps of 1.5 s (under hang_after), and the run stopped (SIGSTOP) the moment its answer is
    # journaled: the request waits in its queue while the first bridge goes away, even on a
    # loaded machine.
    with Toy(tmp_path, "--steps", "100000", "--step-sleep", "1.5", torch=False) as run:
        run.registration()
        s = _settings(tmp_path)
        db = tmp_path / "j.db"

        async def first() -> None:
            with Journal(db) as j:
                r = Rescuer(s, j)
                await _drive(r, _event(j, protocol.MAINS_LOST), idle=False)

                def queued() -> bool:
                    if any(x["action"] == "queued" for x in RescueLedger(j).steps()):
                        run.proc.send_signal(signal.SIGSTOP)
                        return True
                    return False

                await asyncio.to_thread(wait_for, queued, 30, "queued")
                await r.close()  # the bridge stops (or crashes) here

        asyncio.run(first())
        run.proc.send_signal(signal.SIGCONT)
        with Journal(db) as j:
            assert RescueLedger(j).rescues()[0]["state"] == "active"

            async def second() -> None:
                r = Rescuer(s, j)
                assert r.recover() == 1
                await asyncio.wait_for(r.wait_idle(), 60)

            asyncio.run(second())
            actions = [x["action"] for x in RescueLedger(j).steps() if x["target"] != "*"]
            ids = {x["detail"]["id"] for x in RescueLedger(j).steps() if x["action"] == "requested"}
            assert RescueLedger(j).rescues()[0]["state"] == "finished"
        assert actions.count("requested") == 1 and len(ids) == 1 and "verified" in actions
        assert len(ckpt.candidates(run.ckpt)) == 1
        status = run.ask({"op": "status"})[0]
        assert list(status["requests"]) == list(ids)


def test_a_run_saved_since_the_cut_is_verified_not_asked_again(tmp_path: Path) -> None:
    """Its job told by Slurm (or a person's request) saved it after the cut, before the grace ended:
    that checkpoint answers the rescue, verified, never a second request (which a run Slurm has
    suspended since would never answer: bench/site_scale.py)."""
    with Toy(tmp_path, "--steps", "100000", "--step-sleep", "0.02", torch=False) as run:
        run.registration()
        with Journal(tmp_path / "j.db") as j:
            cut = _event(j, protocol.MAINS_LOST)
            [*_, done] = run.ask({"op": "save", "id": "slurm-signal", "reason": "signal"})
            assert done["state"] == "done", done
            run.proc.send_signal(signal.SIGSTOP)  # as `scontrol suspend` leaves it
            try:
                asyncio.run(_drive(Rescuer(_settings(tmp_path), j), cut))
            finally:
                run.proc.send_signal(signal.SIGCONT)
            steps = [x for x in RescueLedger(j).steps() if x["target"] != "*"]
            kinds = [e.kind for e in j.events(kinds=[events.CHECKPOINT_STARTED, events.CHECKPOINT_VERIFIED])]
        assert [x["action"] for x in steps] == ["verified"], steps
        assert steps[0]["detail"]["since_cut"] is True and steps[0]["detail"]["dir"] == done["dir"]
        assert kinds == [events.CHECKPOINT_VERIFIED]  # no "started": nothing was asked
        assert list(run.ask({"op": "status"})[0]["requests"]) == ["slurm-signal"]


def test_mains_back_within_the_grace_time_saves_nothing(tmp_path: Path) -> None:
    s = _settings(tmp_path, grace=0.5)
    with Journal(tmp_path / "j.db") as j:

        async def go() -> None:
            r = Rescuer(s, j)
            r.on_event(_event(j, protocol.MAINS_LOST))
            await asyncio.sleep(0.2)
            r.on_event(_event(j, protocol.MAINS_RESTORED))
            await asyncio.sleep(0.6)
            assert RescueLedger(j).rescues() == []
            r.on_event(_event(j, protocol.MAINS_LOST))  # this time it stays off
            await asyncio.sleep(0.8)
            await r.wait_idle()

        asyncio.run(go())
        assert [x["reason"] for x in RescueLedger(j).rescues()] == [protocol.MAINS_LOST]


def test_signal_fallback_and_the_final_command_on_the_ups_low_battery(tmp_path: Path) -> None:
    flag = tmp_path / "shutdown-ran"
    with Toy(tmp_path, "--steps", "100000", "--step-sleep", "0.02", torch=False) as run:
        reg = run.registration()
        os.unlink(reg.socket)  # the socket is gone: only the signal can reach the run
        s = _settings(tmp_path, final_command=f"echo bye > {flag}")
        with Journal(tmp_path / "j.db") as j:
            asyncio.run(
                _drive(Rescuer(s, j), _event(j, events.UPS_LOW_BATTERY, ups="hostups", runtime_s=90, on_battery=True))
            )
            actions = [x["action"] for x in RescueLedger(j).steps()]
            deadline = RescueLedger(j).rescues()[0]["deadline"]
            started = RescueLedger(j).rescues()[0]["started"]
        assert "signalled" in actions and "verified" in actions
        assert actions.index("verified") < actions.index("final_command") < actions.index("final_done")
        assert flag.read_text().strip() == "bye"
        assert 80 < deadline - started < 90  # runtime 90 s minus the 5 s margin, from the event's arrival


def test_a_repeated_trigger_event_starts_no_second_rescue(tmp_path: Path) -> None:
    with Journal(tmp_path / "j.db") as j:
        ev = _event(j, events.UPS_ON_BATTERY)
        assert RescueLedger(j).open(ev.id, "s1", ev.kind, time.time() + 60, False) is not None
        assert RescueLedger(j).open(ev.id, "s1", ev.kind, time.time() + 60, False) is None


def test_registrations_that_are_garbage_or_stale_are_reported(tmp_path: Path) -> None:
    from holdover.node.targets import discover

    reg = tmp_path / "reg"
    reg.mkdir()
    (reg / "junk.json").write_text("{")
    dead = registry.Registration("gone", 2**22 + 12345, "", "", 12, [], "/", 0.0)
    registry.write_registration(reg, dead)
    targets, problems = discover(_settings(tmp_path))
    assert targets == []
    assert any("junk.json: unreadable registration" in p for p in problems)
    assert any("gone" in p and "stale" in p for p in problems)
    assert json.loads((reg / "gone.json").read_text())["pid"] == dead.pid


def test_a_registration_whose_pid_went_to_another_process_is_stale(tmp_path: Path) -> None:
    """A run killed without closing leaves its file; its pid, given later to another process, is not
    the run: asked to save by SIGUSR2, that process would die of it (a test worker did)."""
    from holdover.node.targets import discover

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        reg = tmp_path / "reg"
        reg.mkdir()
        started = registry.proc_start(other.pid)
        assert started is not None
        args = ("", "", 12, [], "/", time.time())
        registry.write_registration(reg, registry.Registration("reused", other.pid, *args, proc_start=started - 1))
        # Written by an older holdover (no start recorded): trusted, as before.
        registry.write_registration(reg, registry.Registration("older", other.pid, *args))
        targets, problems = discover(_settings(tmp_path))
        assert [t.name for t in targets] == ["older"], targets
        assert any("reused" in p and "another process" in p for p in problems), problems
        registry.write_registration(reg, registry.Registration("reused", other.pid, *args, proc_start=started))
        (reg / "older.json").unlink()
        assert [t.name for t in discover(_settings(tmp_path))[0]] == ["reused"]
    finally:
        other.kill()
        other.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_save_that_hits_a_full_disk_alerts_and_falls_back_leaving_the_old_checkpoint(tmp_path: Path) -> None:
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(mnt)], check=True)
    run = None
    try:
        # One checkpoint of the toy (~230 KB) fits; a second does not.
        run = Toy(tmp_path, "--steps", "100000", "--step-sleep", "0.02", "--ckpt", str(mnt))  # the later --ckpt wins
        run.ckpt = mnt
        first = run.ask({"op": "save", "id": "before", "reason": "periodic"})[-1]
        assert first["state"] == "done"
        s = _settings(tmp_path, gcore=False, shm=[])
        with Journal(tmp_path / "j.db") as j:
            asyncio.run(_drive(Rescuer(s, j), _event(j, events.UPS_ON_BATTERY, ups="hostups")))
            failed = [x for x in RescueLedger(j).steps() if x["action"] == "failed"]
            alerts = j.events(kind="checkpoint_failed")
        assert failed and "disk full" in failed[0]["detail"]["error"]
        assert any("disk full" in e.data["detail"] for e in alerts)
        assert ckpt.candidates(mnt) == [Path(first["dir"])]
        assert ckpt.verify(first["dir"]).step == first["step"]
        assert run.proc.poll() is None  # the run keeps training
    finally:
        if run:
            run.proc.kill()
            run.finish()
        subprocess.run(["umount", str(mnt)], check=False)


def test_unregistered_processes_are_found_by_command_line(tmp_path: Path) -> None:
    from holdover.node.targets import discover

    tag = f"holdover-match-{os.getpid()}"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", tag])
    try:
        targets, _ = discover(_settings(tmp_path, match_cmdline=[tag]))
        [t] = targets
        assert t.pid == proc.pid and t.source == "cmdline" and t.socket is None
    finally:
        proc.kill()
        proc.wait()


def _craft(reg_dir: Path, name: str, seconds: float, age_s: float, world: int) -> None:
    """A run's measured save as a long-running job's would read: the Guard rewrites its
    registration only when it saves, so the figures stand until the rescue asks it to."""
    path = registry.registration_path(reg_dir, name)
    reg = registry.Registration.from_json(path.read_text())
    reg.world = world
    reg.last_save = registry.LastSave(100, str(path.parent), 3_000_000_000, seconds, time.time() - age_s)
    registry.write_registration(reg_dir, reg)


def test_a_cut_saves_in_the_plans_order_one_at_a_time_and_never_starts_what_cannot_finish(tmp_path: Path) -> None:
    names = ("llama", "bert", "vit")
    with contextlib.ExitStack() as stack:
        toys = [stack.enter_context(Toy(tmp_path, "--ckpt", str(tmp_path / n), name=n, torch=False)) for n in names]
        for toy in toys:
            toy.registration()
        reg = tmp_path / "reg"
        # 15 s to save in (20 s of UPS, a 5 s margin). Each wrote 3 GB (read back in 4.3 s more):
        # llama's 8.3 s and bert's 6.3 s fit in turn, vit's 34.3 s never can; llama keeps the most
        # compute per second of saving, so it goes first; alone each moves 360-480 MB/s, and the
        # disk is said to take 500 MB/s, so one at a time.
        for name, seconds, age_s, world in (("llama", 4, 1500, 8), ("bert", 2, 600, 2), ("vit", 30, 720, 4)):
            _craft(reg, name, seconds, age_s, world)
        read = lambda _default: Runtime(20, "UPS hostups: 20 s left", False, True)  # noqa: E731
        s = _settings(tmp_path, disk_mb_s=500)
        with Journal(tmp_path / "j.db") as j:
            r = Rescuer(s, j, runtime=read)
            asyncio.run(_drive(r, _event(j, protocol.MAINS_LOST)))
            steps = RescueLedger(j).steps()
            [chosen] = [x["detail"] for x in steps if x["action"] == "plan"]
            skipped = j.events(kinds=[events.CHECKPOINT_SKIPPED])
        # A bridge runs for months, through a cut a day: a rescue that ended keeps nothing behind.
        assert not (r._active or r._deadline or r._critical or r._cut_at)
        did = [
            (x["target"].split(":")[0], x["action"])  # target keys are name:pid
            for x in steps
            if x["action"] in ("requested", "verified", "skipped")
        ]
        assert [o["run"] for o in chosen["order"]] == ["llama", "bert"], chosen
        assert chosen["cannot"][0]["run"] == "vit" and chosen["guess"] is False
        # One at a time: bert is asked only once llama's checkpoint is verified; vit never.
        assert did == [
            ("llama", "requested"),
            ("llama", "verified"),
            ("bert", "requested"),
            ("bert", "verified"),
            ("vit", "skipped"),
        ], did
        assert [e.data["target"] for e in skipped] == ["vit"]
        assert "its last checkpoint stands" in skipped[0].data["detail"]
        assert ckpt.candidates(tmp_path / "vit") == []  # not a byte written for it

        # With the runtime a guess, nothing is left out: vit is asked after the rest.
        guessed = lambda default: Runtime(20, "[protect] runtime_default 20 s, a guess", True, False)  # noqa: E731
        with Journal(tmp_path / "j2.db") as j:
            asyncio.run(_drive(Rescuer(s, j, runtime=guessed), _event(j, protocol.MAINS_LOST)))
            steps = RescueLedger(j).steps()
        asked = [x["target"].split(":")[0] for x in steps if x["action"] == "requested"]
        assert asked[-1] == "vit" and sorted(asked) == ["bert", "llama", "vit"], asked

        # Shedding: llama and bert stopped once verified, the UPS says it lasts longer at the lower
        # load, and vit, tried last, now fits: asked, saved and verified in the time they bought.
        for name, seconds, age_s, world in (("llama", 4, 1500, 8), ("bert", 2, 600, 2), ("vit", 30, 720, 4)):
            _craft(reg, name, seconds, age_s, world)  # as before: the saves above wrote their own figures
        with Journal(tmp_path / "j3.db") as j:
            r = Rescuer(_settings(tmp_path, disk_mb_s=500, shed=True), j)
            r.runtime = lambda _d: Runtime(60 if r.shed.stopped else 20, "UPS hostups", False, True)
            asyncio.run(_drive(r, _event(j, protocol.MAINS_LOST)))
            steps = RescueLedger(j).steps()
            [rescue] = RescueLedger(j).rescues()
            asyncio.run(_drive(r, _event(j, protocol.MAINS_RESTORED), idle=False))
        did = [(x["target"].split(":")[0], x["action"]) for x in steps if x["action"] in ("verified", "shed")]
        assert did == [("llama", "verified"), ("llama", "shed"), ("bert", "verified"), ("bert", "shed"),
                       ("vit", "verified"), ("vit", "shed")], did  # fmt: skip
        assert rescue["deadline"] - rescue["started"] > 50  # pushed out from 15 s by what the UPS said
