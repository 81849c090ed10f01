"""The bridge's save cadence (node/cadence.py): a run the rescue plan cannot save at a cut is told to
save often enough that a cut loses at most [protect] max_loss_min, and let go once it fits; a Guard
too old to hold a bound is asked once, not every round. A real run (the torch-free trainee) on its
own socket."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from holdover import events
from holdover.node.cadence import Cadence
from holdover.node.ups import Runtime
from holdover.settings import ProtectSettings, Settings
from holdover.train import registry
from support import HOLDOVER, Toy, wait_for


def _protect(tmp: Path, minutes: float) -> ProtectSettings:
    return ProtectSettings(registry=tmp / "reg", margin=0, grace=0, max_loss_min=minutes, gcore=False)


def test_a_run_that_cannot_fit_saves_by_the_clock_and_is_let_go_once_it_fits(tmp_path: Path) -> None:
    runtime = {"s": 0.001}  # the UPS's runtime: nothing fits in 1 ms
    rescuing = {"now": False}
    said: list[tuple[str, dict[str, Any]]] = []
    cadence = Cadence(
        _protect(tmp_path, 0.01),  # 0.6 s
        lambda default: Runtime(runtime["s"], "UPS hostups", False, True),
        lambda kind, data: said.append((kind, data)),
        lambda: rescuing["now"],
    )
    with Toy(tmp_path, "--step-sleep", "0.02", name="vit", torch=False) as toy:
        toy.registration()
        # Never saved: no save time to plan with, and all since its start at risk: bounded until measured.
        first = asyncio.run(cadence.once())
        assert first == {
            "vit": "vit has no save measured yet, so it saves at least every 0 s: a cut loses at most 0 s of it ([protect] max_loss_min)"
        }
        saved = wait_for(lambda: (r := toy.registration()).last_save and r, 10, "a save by the clock")
        assert saved.bound is not None and saved.bound["max_loss_s"] == 0.6, saved.bound
        # `holdover status` says it, from the run's own registration.
        (tmp_path / "holdover.toml").write_text(
            f'[journal]\npath = "{tmp_path}/j.db"\n[protect]\nregistry = "{tmp_path}/reg"\nmax_loss_min = 0.01\n'
        )
        cfg = ["--config", str(tmp_path / "holdover.toml")]
        shown = subprocess.run([HOLDOVER, "status", *cfg], capture_output=True, text=True, timeout=60)
        assert (
            "vit is left out of the rescue plan, so it saves at least every 0 s: a cut loses at most 0 s"
            in " ".join(shown.stdout.split())
        ), shown.stdout + shown.stderr
        as_json = subprocess.run([HOLDOVER, "status", "--json", *cfg], capture_output=True, text=True, timeout=60)
        [run] = [r for r in json.loads(as_json.stdout)["runs"] if r["name"] == "vit"]
        assert run["bound"]["max_loss_s"] == 0.6, run
        assert asyncio.run(cadence.once()) == {}  # it holds what it should: not told again
        # A cut on: the bound lifted, so no save by the clock takes the disk from the rescue; then again.
        rescuing["now"] = True
        assert asyncio.run(cadence.once()) == {
            "vit": "vit: its saves by the clock wait while the power is out: one would not finish, "
            "and takes the others' disk"
        }
        wait_for(lambda: toy.registration().bound is None, 10, "the bound lifted for the rescue")
        rescuing["now"] = False
        assert "so it saves at least every" in asyncio.run(cadence.once())["vit"]
        wait_for(lambda: toy.registration().bound is not None, 10, "the bound again")
        # By the clock: the newest save's age, sampled from outside, stays under the bound (+ jitter).
        steps, ages, end = set(), [], time.monotonic() + 2.0
        while time.monotonic() < end:
            last = toy.registration().last_save
            assert last is not None
            steps.add(last.step)
            ages.append(time.time() - last.at)
            time.sleep(0.02)
        assert len(steps) >= 3 and max(ages) <= 0.6 * 1.25, (sorted(steps), max(ages))
        runtime["s"] = 600.0  # the UPS now gives enough: it fits, and is let go
        assert asyncio.run(cadence.once()) == {
            "vit": "vit fits the rescue plan again: its periodic saves are its own again"
        }
        wait_for(lambda: toy.registration().bound is None, 10, "the bound lifted")
        time.sleep(0.1)
        last = toy.registration().last_save
        time.sleep(1.2)
        assert toy.registration().last_save == last  # no more saves by the clock
    assert [k for k, _ in said] == [events.SAVE_CADENCE] * 4
    assert [d["max_loss_s"] for _k, d in said] == [0.6, None, 0.6, None]
    assert events.kind(events.SAVE_CADENCE).describe(**said[3][1]).startswith("vit fits the rescue plan again")


def test_a_guard_that_cannot_hold_a_bound_is_asked_once_and_the_round_goes_on(tmp_path: Path) -> None:
    asked: list[dict[str, Any]] = []

    def old_guard(conn: socket.socket, msg: dict[str, Any]) -> None:
        asked.append(msg)
        conn.sendall(registry.encode({"error": f"unknown op {msg['op']!r}"}))

    reg_dir = tmp_path / "reg"
    server = registry.RunServer(tmp_path / "old.sock", old_guard)
    try:
        reg = registry.Registration.of_this_process("old", tmp_path / "ckpt", 0, 0, 1)
        reg.socket = str(server.path)
        registry.write_registration(reg_dir, reg)
        cadence = Cadence(_protect(tmp_path, 30), lambda d: Runtime(1.0, "UPS", False, True), lambda k, d: None)
        assert asyncio.run(cadence.once()) == {}
        assert asyncio.run(cadence.once()) == {}
        assert asked == [{"op": "bound", "max_loss_s": 1800.0}]
        assert cadence.refused == {(os.getpid(), 0)}
    finally:
        server.close(until=time.monotonic())


def test_the_bridge_keeps_the_cadence_only_when_max_loss_min_is_set(tmp_path: Path) -> None:
    from holdover.bridge.service import Bridge

    def reactions(**protect: Any) -> list[str]:
        s = Settings.model_validate({"journal": {"path": str(tmp_path / "j.db")}, "protect": protect})
        b = Bridge(s)
        b.journal.close()
        return [type(r).__name__ for r in b.reactions]

    assert "Cadence" not in reactions()
    assert "Cadence" in reactions(max_loss_min=30)
    assert "Cadence" not in reactions(max_loss_min=30, enabled=False)


def test_the_bounds_wait_from_a_cuts_grace_until_the_power_is_back(tmp_path: Path) -> None:
    """What the bridge hands the cadence as `rescuing`: a cut in its grace, a rescue saving, and one
    that ran with the power still out all count; power back ends it."""
    from holdover.firmware import protocol
    from holdover.journal import Journal
    from holdover.node.rescue import Rescuer

    seq = iter(range(1, 100))

    async def outage(j: Journal) -> list[bool]:
        r = Rescuer(_protect(tmp_path, 30).model_copy(update={"grace": 0.3}), j)
        seen = [r.in_outage()]

        def said(kind: str) -> None:
            body = {"sid": "s1", "boot": "b00t", "seq": next(seq), "kind": kind, "ms": 0, "ts": None, "data": {}}
            ev = j.accept("mqtt", body)
            assert ev is not None
            r.on_event(ev)

        said(protocol.MAINS_LOST)
        seen.append(r.in_outage())  # in its grace
        await asyncio.sleep(0.6)
        await r.wait_idle()  # the rescue ran (nothing to save): the power is still out
        seen.append(r.in_outage())
        said(protocol.MAINS_RESTORED)
        seen.append(r.in_outage())
        await r.close()
        return seen

    with Journal(tmp_path / "j.db") as j:
        assert asyncio.run(outage(j)) == [False, True, True, False]
