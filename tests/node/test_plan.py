"""The rescue plan before a cut: which runs' saves fit the UPS's runtime, in what order, and what
becomes of the rest (node/plan.py), from the measurements the runs' registrations carry."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from holdover.lab import nut
from holdover.node import plan
from holdover.node.doctor import Doctor
from holdover.settings import load
from holdover.train import registry
from holdover.train.registry import LastSave, Registration
from support import HOLDOVER

NOW = 1_800_000_000.0


def _reg(
    name: str,
    ckpt: Path,
    save_s: float | None,
    age_s: float | None,
    rank: int = 0,
    world: int = 1,
    nbytes: int = 0,  # read back at VERIFY_MB_S after the write: 0 keeps the figures round
) -> Registration:
    last = None
    if age_s is not None:
        last = LastSave(
            step=100, directory=str(ckpt / "step-100"), nbytes=nbytes, seconds=save_s or 0.0, at=NOW - age_s
        )
    return Registration(
        name, 1000 + rank, "", str(ckpt), 10, ["train.py"], "/", NOW - 86400, rank=rank, world=world, last_save=last
    )


def _cost(name: str, save_s: float, age_s: float, world: int = 1, gb_s: float = 1.0, device: int = 1) -> plan.RunCost:
    return plan.RunCost(name, 1, world, device, save_s, int(save_s * gb_s * 1e9), age_s)


def test_at_the_disks_ceiling_the_runs_that_fit_go_one_at_a_time_most_compute_kept_per_second_first() -> None:
    # Each moves 1 GB/s alone; the disk takes 1.5: two at once would share it, so one at a time.
    runs = [
        _cost("llama", 190, 1500, world=8),
        _cost("bert", 65, 600, world=2),
        _cost("vit", 500, 720, world=4),  # alone longer than the UPS lasts
    ]
    p = plan.plan(runs, 448, "UPS hostups: 448 s", guess=False, margin_s=30, grace_s=0, ceiling=1.5e9)
    assert p.budget_s == 418
    # llama keeps 8 x 1500 s for 190 s of saving (63 per s), bert 2 x 600 for 65 s (18 per s).
    assert [(s.run.name, s.start_s, s.end_s) for s in p.fits] == [("llama", 0, 190), ("bert", 190, 255)]
    assert [(r.name, why) for r, why in p.cannot] == [
        ("vit", "cannot fit (8 min 20 s to save): its last checkpoint stands, 12 min 0 s old")
    ]
    assert p.sentence() == (
        "with 6 min 58 s to save in (UPS hostups: 448 s): llama 3 min 10 s, bert 65 s; "
        "vit cannot fit (8 min 20 s to save): its last checkpoint stands, 12 min 0 s old"
    )
    assert (p.kept_s, p.lost_s) == (8 * 1500 + 2 * 600, 4 * 720)


def test_the_ups_lasts_longer_as_each_saved_run_stops_drawing_and_the_plan_says_by_how_much() -> None:
    # 600 s of UPS at 1,000 W: 600 kJ. Two one-rank runs of 400 W saved in turn, done at 100 s and
    # 200 s (a 0 s grace): 100 kJ at 1,000 W, 60 kJ at 600 W, then 440 kJ at 200 W is 2,200 s more.
    assert plan.shed_runtime(600, 1000, [(100, 400), (200, 400)]) == 2400
    assert plan.shed_runtime(600, 1000, [(700, 400)]) == 600  # the UPS is gone before the stop
    runs = [_cost("llama", 100, 1500), _cost("bert", 100, 600)]
    p = plan.plan(runs, 600, "UPS hostups: 600 s", guess=False, margin_s=0, grace_s=0, ceiling=1.0e9)
    assert p.shed_gain_s is None  # nothing known of the load: no model, no claim
    p.load_w, p.rank_w, p.shed = 1000, 400, True
    assert p.shed_runtime_s == 2400 and p.shed_gain_s == 1800
    assert p.sentence().endswith("; each run stopped once saved: the UPS lasts about 30 min 0 s more (1000 W to 200 W)")
    assert p.as_dict()["shed_gain_s"] == 1800
    p.shed = False
    assert p.sentence().endswith("would buy about 30 min 0 s (1000 W to 200 W); shedding is off")
    # The grace is spent before any save starts: the saves end, and the runs stop, 100 s later.
    graced = plan.plan(runs, 600, "UPS hostups: 600 s", guess=False, margin_s=0, grace_s=100, ceiling=1.0e9)
    graced.load_w, graced.rank_w = 1000, 400
    assert graced.shed_runtime_s == plan.shed_runtime(600, 1000, [(200, 400), (300, 400)]) == 2000
    p.rank_w = 600  # the runs would draw more than the UPS gives: the figures disagree, no claim
    assert p.shed_gain_s is None and "W to" not in p.sentence()


def test_the_ups_load_in_watts_is_its_load_percent_of_its_rated_power() -> None:
    from holdover.node.ups import UpsReading, runtime_from
    from holdover.settings import UpsSettings

    r = UpsReading(("OB",), 80.0, 300.0, 45.0, time.time())
    rated = UpsSettings(nut="hostups@127.0.0.1", watts=900)
    assert runtime_from(rated, r, None, 600).load_w == 405
    assert runtime_from(UpsSettings(nut="hostups@127.0.0.1"), r, None, 600).load_w is None


def test_two_small_saves_worth_more_beat_one_large_one_and_the_loser_is_named() -> None:
    runs = [
        _cost("big", 200, 1000),  # 1000 s kept for 200 s
        _cost("a", 150, 700),
        _cost("b", 150, 700),  # together 1400 s for 300 s
    ]
    p = plan.plan(runs, 300, "UPS u: 300 s", guess=False, margin_s=0, grace_s=0, ceiling=1.5e9)
    assert sorted(s.run.name for s in p.fits) == ["a", "b"]
    assert [(r.name, why) for r, why in p.cannot] == [
        ("big", "does not fit beside the others: its last checkpoint stands, 16 min 40 s old")
    ]
    # A greedy pick by compute kept per second takes "big" first (5 per s against 4.7) and keeps 1000 s.
    assert p.kept_s == 1400


def test_under_the_disks_ceiling_or_with_it_unknown_the_saves_that_fit_start_at_once() -> None:
    # What bench/rescue_plan.py measured here: four runs each alone far under the disk's rate.
    runs = [_cost(f"r{i}", t, 600, gb_s=0.4) for i, t in enumerate((1.6, 0.9, 0.6, 0.4))]
    for ceiling in (None, 1.8e9):
        p = plan.plan(runs, 2.0, "UPS u: 2 s", guess=False, margin_s=0, grace_s=0, ceiling=ceiling)
        assert [(s.run.name, s.start_s) for s in p.fits] == [("r3", 0), ("r2", 0), ("r1", 0), ("r0", 0)]
        assert p.cannot == []
    # At 0.9 GB/s two go at once (0.8), the next as the first ends: r0's 1.6 s then ends past 2 s.
    p = plan.plan(runs, 2.0, "UPS u: 2 s", guess=False, margin_s=0, grace_s=0, ceiling=0.9e9)
    assert [(s.run.name, s.start_s, s.end_s) for s in p.fits] == [("r3", 0, 0.4), ("r2", 0, 0.6), ("r1", 0.4, 1.3)]
    assert [r.name for r, _why in p.cannot] == ["r0"]


def test_runs_on_different_disks_save_side_by_side(tmp_path: Path) -> None:
    shm = Path("/dev/shm")  # another filesystem than the test's directory
    runs = plan.costs([_reg("a", tmp_path, save_s=200, age_s=600), _reg("b", shm, save_s=200, age_s=600)], now=NOW)
    assert runs[0].device != runs[1].device
    p = plan.plan(runs, runtime_s=250, runtime_said="UPS u: 250 s", guess=False, margin_s=0, grace_s=0)
    assert sorted((s.run.name, s.start_s) for s in p.fits) == [("a", 0), ("b", 0)]
    assert len(p.lanes) == 2 and p.cannot == []
    assert p.sentence().endswith("(2 disks side by side)")


def test_the_ranks_of_a_run_here_are_one_save_and_a_run_never_saved_is_said_so(tmp_path: Path) -> None:
    runs = plan.costs(
        [
            _reg("ddp", tmp_path, save_s=40, age_s=300, rank=0, world=4, nbytes=1_400_000_000),
            _reg("ddp", tmp_path, save_s=53, age_s=310, rank=1, world=4, nbytes=1_400_000_000),
            _reg("fresh", tmp_path, save_s=None, age_s=None),
        ],
        now=NOW,
    )
    ddp, fresh = runs
    # Its ranks save side by side: the slowest sets the time, its write and then its 1.4 GB read
    # back to verify (2 s at 700 MB/s); the older save is the run's checkpoint.
    assert (ddp.ranks, ddp.save_s, ddp.nbytes, ddp.age_s, ddp.worth_s) == (2, 55, 2_800_000_000, 310, 1240)
    assert (fresh.save_s, fresh.age_s, fresh.worth_s) == (None, None, 0)
    p = plan.plan(runs, runtime_s=600, runtime_said="a guess: no UPS configured", guess=True, margin_s=30, grace_s=60)
    assert [s.run.name for s in p.fits] == ["ddp"]
    assert [(r.name, why) for r, why in p.cannot] == [
        ("fresh", "has no save measured yet: asked at once, beside the plan")
    ]
    assert p.as_dict()["order"] == [{"run": "ddp", "start_s": 0, "end_s": 55, "lane": 0}]
    assert p.as_dict()["guess"] is True


def test_nothing_to_protect_is_said_plainly() -> None:
    p = plan.plan([], runtime_s=600, runtime_said="UPS u: 600 s", guess=False, margin_s=30, grace_s=0)
    assert (p.sentence(), p.kept_s, p.lost_s) == ("no protected run", 0, 0)


@pytest.mark.skipif(not nut.available(), reason="needs Debian's nut-server (scripts/ensure-system-deps.sh)")
def test_status_and_the_doctor_say_the_plan_against_the_ups_as_read(tmp_path: Path) -> None:
    """Three runs, each of which would fit the UPS alone, as `holdover status` and `holdover doctor`
    show them to a person: together they do not, and the one left out is named with its age."""
    reg, ckpt = tmp_path / "reg", tmp_path / "ckpt"
    ckpt.mkdir()
    # The runs' processes: a registration whose pid is gone is stale, and left out.
    alive = [subprocess.Popen(["sleep", "120"]) for _ in range(3)]
    try:
        now = time.time()
        # Each run's write and bytes: with the read back at 700 MB/s, 190, 65 and 300 s; 74, 108 and
        # 70 MB/s alone, so on a disk of 100 MB/s they go one at a time.
        runs = (("llama", 170, 14e9, 1500, 8), ("bert", 55, 7e9, 600, 2), ("vit", 270, 21e9, 720, 4))
        for (name, save_s, nbytes, age_s, world), p in zip(runs, alive, strict=True):
            r = _reg(name, ckpt, save_s, age_s, world=world, nbytes=int(nbytes))
            r.pid, r.last_save.at = p.pid, now - age_s  # type: ignore[union-attr]
            registry.write_registration(reg, r)
        ups = {"ups.status": "OB DISCHRG", "battery.charge": "70", "battery.runtime": "448"}
        with nut.NutServer(tmp_path / "nut", {"hostups": ups}) as server:
            (tmp_path / "holdover.toml").write_text(
                f'[journal]\npath = "{tmp_path}/j.db"\n'
                f'[protect]\nregistry = "{reg}"\nmargin = 30\ngrace = 0\ndisk_mb_s = 100\n'
                f'[ups]\nnut = "hostups@127.0.0.1:{server.port}"\n'
            )
            cfg = ["--config", str(tmp_path / "holdover.toml")]
            status = subprocess.run([HOLDOVER, "status", *cfg], capture_output=True, text=True, timeout=60)
            doctor = subprocess.run([HOLDOVER, "doctor", "--json", *cfg], capture_output=True, text=True, timeout=120)
            as_json = subprocess.run([HOLDOVER, "status", "--json", *cfg], capture_output=True, text=True, timeout=60)
            # With [protect] max_loss_min, once vit holds the bound its Guard answered the bridge with.
            vit = registry.Registration.from_json(registry.registration_path(reg, "vit").read_text())
            vit.bound = {"max_loss_s": 900.0, "every_s": 629.5, "save_s": 270.0, "step_s": 0.5, "meets": True}
            registry.write_registration(reg, vit)
            bounded = load(tmp_path / "holdover.toml")
            bounded.protect.max_loss_min = 15
            doc = Doctor(bounded)
            doc.ups()  # the UPS as read, which the plan then takes (as `holdover doctor` runs them)
            after = {c.name: c for c in doc.rescue_plan()}
    finally:
        for p in alive:
            p.kill()
            p.wait()
    sentence = (
        re.escape(
            "with 6 min 58 s to save in (UPS hostups: 448 s left): llama 3 min 10 s, bert 65 s; "
            "vit does not fit beside the others: its last checkpoint stands, 12 min "
        )
        + r"\d+ s old"
    )  # its age as the command ran
    assert status.returncode == 0, status.stderr
    assert re.search("rescue plan: " + sentence, " ".join(status.stdout.split())), status.stdout
    assert json.loads(as_json.stdout)["plan"]["order"] == [
        {"run": "llama", "start_s": 0, "end_s": 190, "lane": 0},
        {"run": "bert", "start_s": 190, "end_s": 255, "lane": 0},
    ]
    # Each fits alone (the per-run checks pass or warn); together they do not: a failure, with what to do.
    checks = {c["name"]: c for c in json.loads(doctor.stdout)}
    assert doctor.returncode == 2, doctor.stdout + doctor.stderr
    alone = [v["status"] for k, v in checks.items() if k.startswith("an emergency checkpoint of")]
    assert sorted(alone) == ["pass", "pass", "warn"], checks  # vit: 270 s of 418, little slack
    together = checks["a cut now saves every protected run"]
    assert together["status"] == "fail" and re.fullmatch(sentence, together["detail"]), together
    assert together["fix"].startswith("set [protect] max_loss_min"), together
    unbounded = checks["a cut loses little of the runs it cannot save"]
    assert unbounded["status"] == "warn" and unbounded["fix"].startswith("set [protect] max_loss_min"), unbounded
    assert re.fullmatch(
        r"vit: a cut loses all since the newest checkpoint \(vit 12 min \d+ s now\)", unbounded["detail"]
    )
    # Bounded: the plan still cannot save vit, which is now a warning; what a cut takes of it, a pass.
    assert after["a cut now saves every protected run"].status == "warn"
    held = after["a cut loses little of the runs it cannot save"]
    assert held.status == "pass" and held.detail == (
        "vit does not fit beside the others, so it saves at least every 10 min 29 s: a cut loses at most "
        "15 min 0 s of it ([protect] max_loss_min)"
    ), held
