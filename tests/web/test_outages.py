"""Outages as a person recalls them (web/outages.py) and the banner that leads the page during one:
built from a journal written as the bridge writes it, and end to end in headless Chromium with a
real protected run saved during a cut on the emulated sentinel."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from holdover import events
from holdover.firmware import protocol
from holdover.journal import Event, Journal
from holdover.node.rescue_ledger import RescueLedger
from holdover.settings import Settings
from holdover.web import outages, snapshot
from support import HOLDOVER, Toy

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def _at(j: Journal, kind: str, sid: str, ts: float, **data: object) -> Event:
    (seq,) = j.db.execute("SELECT COUNT(*) + 1 FROM events").fetchone()
    ev = j.accept("mqtt", {"sid": sid, "boot": "b1", "seq": seq, "kind": kind, "ms": 0, "ts": None, "data": data})
    assert ev is not None
    j.db.execute("UPDATE events SET rx_ts=? WHERE id=?", (ts, ev.id))
    return ev


def test_an_outage_spans_every_source_until_all_say_it_is_back_and_lists_what_was_saved(tmp_path: Path) -> None:
    t0 = time.time() - 3600
    with Journal(tmp_path / "j.db") as j:
        _at(j, protocol.MAINS_RESTORED, "rack1", t0 - 50)  # back without our hearing it go: nothing
        lost = _at(j, protocol.MAINS_LOST, "rack1", t0)
        _at(j, protocol.HEARTBEAT, "rack1", t0 + 5)
        _at(j, events.UPS_ON_BATTERY, protocol.NODE, t0 + 2, ups="hostups", runtime_s=480)
        ledger = RescueLedger(j)
        rid = ledger.open(lost.id, "rack1", protocol.MAINS_LOST, t0 + 400, False)
        assert rid is not None
        j.db.execute("UPDATE rescues SET started=? WHERE id=?", (t0 + 10, rid))
        ledger.step(rid, "toy:123", 123, "verified", dir="/ckpt/step-40", step=40, bytes=10, seconds=1.5, mb_s=7)
        ledger.step(rid, "wedged:124", 124, "rescued", dir="/rescue/wedged")
        _at(j, protocol.MAINS_RESTORED, "rack1", t0 + 60)  # the UPS still on battery: not over
        _at(j, events.UPS_ONLINE, protocol.NODE, t0 + 75, ups="hostups")
        _at(j, protocol.UPLINK_LOST, "rack1", t0 + 600)  # still going on
        found = outages.history(j)
    uplink, power = found
    assert (uplink["kind"], uplink["open"], uplink["what"]) == ("uplink", True, "uplink at rack1")
    assert uplink["length_s"] >= 2999
    assert (power["kind"], power["open"], power["length_s"]) == ("power", False, 75.0)
    assert power["sources"] == ["rack1", "UPS hostups"] and power["what"] == "power at rack1, UPS hostups"
    assert power["saved"] == [{"run": "toy", "step": 40, "seconds": 1.5, "dir": "/ckpt/step-40"}]
    assert power["rescued"] == [{"run": "wedged", "dir": "/rescue/wedged"}]


def test_the_banner_says_what_is_wrong_how_long_is_left_what_holdover_does_and_what_to_do(tmp_path: Path) -> None:
    now = time.time()
    ups = {"runtime_s": 460, "deadline_from": "UPS hostups: 460 s left", "guess": False}
    with Journal(tmp_path / "j.db") as j:
        assert outages.banner(j)["state"] == "normal"
        _at(j, protocol.MAINS_LOST, "rack1", now - 7)
        b = outages.banner(j, ups, {"grace_until": now + 3, "active": [], "live": {}})
        assert (b["state"], b["what"], b["phase"]) == ("power", "power at rack1", "grace")
        assert 6 < b["for_s"] < 9 and 2 < b["grace_left_s"] <= 3
        assert b["time_left"] == {"runtime_s": 460, "from": "UPS hostups: 460 s left", "guess": False, "why": None}
        # Without a UPS the guess runs down from the cut, and says why it is one in words.
        guess = snapshot.ups(Settings(), None, None)
        assert (guess["deadline_s"], guess["guess"], guess["guess_why"]) == (600, True, "no UPS configured")
        left = outages.banner(j, guess)["time_left"]
        assert 592 <= left["runtime_s"] <= 593 and left["why"] == "no UPS configured", left
        assert b["next"].startswith("Nothing yet")
        live = {"toy:1": {"name": "toy", "state": "saving", "bytes_done": 63, "bytes_total": 100}}
        b = outages.banner(j, ups, {"grace_until": None, "active": [{"id": 1, "deadline": now + 400}], "live": live})
        assert (b["phase"], b["doing"], b["progress"]) == (
            "saving",
            "checkpointing 1 run",
            [{"run": "toy", "state": "saving", "pct": 63}],
        )
        assert 390 < b["deadline_in_s"] <= 400 and "Do not restart" in b["next"]
        _at(j, protocol.MAINS_RESTORED, "rack1", now)
        b = outages.banner(j)
        assert b["state"] == "normal" and b["text"] == "Back to normal. Last outage: power at rack1, 7 s"
        assert b["concerns"] == []
        # No outage, but not all well: the page's tiles show these, and the banner must not contradict them.
        seen = [
            {"sid": "rack1", "configured": True, "status": "online", "uplink": "degraded"},
            {"sid": "rack2", "configured": True, "status": "offline", "uplink": None},
            {"sid": "old", "configured": False, "status": None, "uplink": None},
        ]
        b = outages.banner(j, {"problem": "cannot reach upsd at 127.0.0.1:3493"}, None, seen)
        assert b["state"] == "normal" and b["concerns"] == [
            "uplink degraded at rack1",
            "rack2 offline",
            "host UPS: cannot reach upsd at 127.0.0.1:3493",
        ], b


@pytest.mark.timeout(120)
def test_the_page_leads_with_the_cut_counts_it_shows_the_save_verified_and_then_the_outage(
    rig_factory, tmp_path: Path
) -> None:
    from test_web import OVERFLOW, phone, serving

    with Toy(tmp_path / "run", "--steps", "100000", "--step-sleep", "0.02", "--mb", "32", torch=False) as run:
        run.registration()
        rig = rig_factory(protect={"registry": str(run.reg_dir), "rescue_dir": str(tmp_path / "rescue"), "grace": 3})
        rig.wait("boot", 20)
        ARTIFACTS.mkdir(exist_ok=True)
        with serving(rig) as client, phone(client) as page:
            page.wait_for_selector("#live.ok", timeout=10000)
            assert page.locator("#banner").inner_text().startswith("All normal")
            rig.control.send(mains=False)
            page.wait_for_selector("#banner.out", timeout=5000)
            text = page.locator("#banner").inner_text()
            assert "POWER OUT: power at demo" in text and "grace:" in text, text
            # A countdown without a UPS too, its reason in words, the fix a link away (the UPS tile).
            assert re.search(
                r"about (10 min 0|9 min 5\d) s left, a guess: no UPS configured · read the host's UPS", text
            ), text
            assert "[protect]" not in text and "runtime_default" not in text, text
            first = page.locator('#banner [data-k="for"]').inner_text()
            page.screenshot(path=str(ARTIFACTS / "banner-grace.png"))
            page.click("#banner a[href='#ups']")
            assert "add [ups] with nut or apcupsd to holdover.toml" in page.locator("#ups").inner_text()
            page.evaluate("window.scrollTo(0, 0)")
            # The banner and the open outage's row tell one length, read in the same instant.
            page.wait_for_selector('#outages tr[data-open="true"]', timeout=5000)
            both = page.evaluate(
                """() => [document.querySelector('#banner [data-k=for]').innerText,
                          document.querySelector('#outages tr[data-open=true] [data-so-far]').innerText]"""
            )
            assert both[1] == both[0] + " so far", both
            assert page.evaluate(OVERFLOW) <= 0  # the run's long checkpoint path wraps on a phone
            # The counter moves: a second later by the page's clock, which a loaded machine may run late.
            page.wait_for_function(
                "first => document.querySelector('#banner [data-k=for]').innerText !== first", arg=first, timeout=5000
            )
            page.wait_for_function(
                "document.querySelector('#banner [data-k=doing]')?.innerText.includes('verified')", timeout=30000
            )
            text = page.locator("#banner").inner_text()
            assert "saved: toy at step" in text and "holdover recover" in text, text
            page.screenshot(path=str(ARTIFACTS / "banner-saved.png"))
            rig.control.send(mains=True)
            page.wait_for_function(
                "document.querySelector('#banner')?.innerText.startsWith('All normal')", timeout=10000
            )
            row = page.locator('#outages tr[data-open="false"]').first
            assert "power at demo" in row.inner_text() and "toy @ step" in row.inner_text()
            assert page.evaluate(OVERFLOW) <= 0
            page.screenshot(path=str(ARTIFACTS / "banner-after-phone.png"), full_page=True)
            page.set_viewport_size({"width": 1280, "height": 900})  # a laptop
            page.screenshot(path=str(ARTIFACTS / "banner-after.png"), full_page=True)
        out = subprocess.run(
            [HOLDOVER, "outages", "-c", str(rig.dir / "holdover.toml"), "--json"], capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        [o] = json.loads(out.stdout)
        assert o["what"] == "power at demo" and not o["open"] and o["saved"][0]["run"] == "toy"


def test_a_cut_that_ends_within_the_grace_saves_nothing_and_is_still_an_outage(tmp_path: Path) -> None:
    with Journal(tmp_path / "j.db") as j:
        _at(j, protocol.MAINS_LOST, "rack1", 100.0)
        _at(j, protocol.MAINS_RESTORED, "rack1", 104.5)
        [o] = outages.history(j)
    assert (o["length_s"], o["saved"], o["rescues"]) == (4.5, [], [])


def test_two_hours_of_heartbeats_do_not_push_a_cut_off_the_first_screen(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from test_web import phone, serving

    from holdover.bridge.service import Bridge, BridgeThread
    from holdover.lab.broker import free_port
    from holdover.settings import Settings

    t0 = time.time() - 7300
    with Journal(tmp_path / "j.db") as j:
        _at(j, protocol.MAINS_LOST, "rack1", t0)
        for i in range(240):  # every 30 s for two hours
            _at(j, protocol.HEARTBEAT, "rack1", t0 + 30 * (i + 1))
    cfg = Settings.model_validate(
        {"mqtt": {"port": free_port()}, "journal": {"path": str(tmp_path / "j.db")}, "protect": {"enabled": False}}
    )
    toml = tmp_path / "h.toml"
    toml.write_text(f'[journal]\npath = "{tmp_path / "j.db"}"\n')
    r = subprocess.run([HOLDOVER, "events", "-c", str(toml), "--limit", "10"], capture_output=True, text=True)
    assert r.returncode == 0 and "mains power lost at rack1" in r.stdout and "alive" not in r.stdout, r
    assert r.stderr.startswith("\n(240 heartbeats in that span not listed: --routine lists them)"), (
        r.stderr
    )  # apart from the rows
    r = subprocess.run(
        [HOLDOVER, "events", "-c", str(toml), "--routine", "--limit", "10"], capture_output=True, text=True
    )
    assert r.stdout.count("is alive") == 10
    bt = BridgeThread(Bridge(cfg)).start()
    try:
        with serving(SimpleNamespace(bridge=bt)) as client:
            page_ = client.get("/api/events", params={"limit": 50}).json()
            assert [e["kind"] for e in page_["items"]] == ["mains_lost"] and page_["folded"] == {"heartbeat": 240}
            assert len(client.get("/api/events", params={"limit": 50, "routine": True}).json()["items"]) == 50
            with phone(client) as page:
                page.wait_for_selector('#timeline li[data-kind="mains_lost"]', timeout=10000)
                # The cut, its outage still open two hours on, leads the page; the heartbeats are a count.
                assert (
                    page.locator("#banner").inner_text().startswith("POWER OUT: power at rack1\nfor 2 h 1 min (since")
                )
                assert "240 heartbeats" in page.locator("#folded").inner_text()
                assert page.locator("#timeline li").first.get_attribute("data-kind") == "mains_lost"
                # Filters and paging back: heartbeats listed on asking, 50 a page, then older ones.
                assert page.locator("#older").is_hidden()
                page.check("#f-routine")
                page.wait_for_function("document.querySelectorAll('#timeline li').length === 50")
                assert page.locator("#older").is_visible()
                page.click("#older")
                page.wait_for_function("document.querySelectorAll('#timeline li').length === 100")
                page.select_option("#f-kind", "mains_lost")
                page.wait_for_function("document.querySelectorAll('#timeline li').length === 1")
                page.fill("#f-sentinel", "rack2")
                page.press("#f-sentinel", "Enter")
                page.wait_for_function("document.querySelectorAll('#timeline li').length === 0")
                page.fill("#f-sentinel", "")
                page.press("#f-sentinel", "Enter")
                page.uncheck("#f-routine")
                page.select_option("#f-kind", "")
                page.wait_for_selector('#timeline[data-shown="*|*|false"]')  # the last filter's answer, drawn
                assert page.locator("#timeline li").count() == 1
                page.screenshot(path=str(ARTIFACTS / "events-folded.png"), full_page=True)
    finally:
        bt.stop()
