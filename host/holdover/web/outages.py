"""Outages as a person recalls them, read from the journal: when power or the uplink went, for how
long, who saw it, and what holdover saved; and the one banner that answers, during one, "how
long have we got, and is my run safe?"

An outage opens at the first source that says it is down (a sentinel's mains_lost, the host UPS's
ups_on_battery; uplink_lost, the node's failover) and closes when every source that said so says
it is back. A source that went silent meanwhile keeps it open: nobody has said power is back.
"""

from __future__ import annotations

import time
from typing import Any

from holdover import events
from holdover.events import duration
from holdover.firmware import protocol
from holdover.journal import Event, Journal
from holdover.node.rescue_ledger import RescueLedger

POWER, UPLINK = "power", "uplink"
DOWN = {
    protocol.MAINS_LOST: POWER,
    events.UPS_ON_BATTERY: POWER,
    protocol.UPLINK_LOST: UPLINK,
    events.FAILOVER: UPLINK,
}
UP = {
    protocol.MAINS_RESTORED: POWER,
    events.UPS_ONLINE: POWER,
    protocol.UPLINK_RESTORED: UPLINK,
    events.FAILBACK: UPLINK,
}
MAX_EVENTS = 20000  # the newest outage-making events read; years of a flapping site

# The next thing a person should do, in docs/runbook.md's words.
NEXT = {
    "grace": "Nothing yet: if power is not back when the grace ends, every run is checkpointed.",
    "saving": "Keep the host up: let the checkpoints finish. Do not restart the bridge or the runs.",
    "saved": "Runs are saved. Shut down cleanly if power stays out; after it, `holdover recover` resumes them.",
    "lost": "A run could not be saved: its gcore dump and /dev/shm copy are in rescue_dir (runbook: last resorts).",
    "watching": "No protected run to save. Shut down cleanly before the UPS runs out.",
    "uplink": "Read `holdover diagnose` (the alert names the first failed hop) before calling anyone.",
    "after": "`holdover recover` lists every run with the command that resumes it.",
}


def _source(e: Event) -> str:
    if e.kind in (events.UPS_ON_BATTERY, events.UPS_ONLINE):
        return f"UPS {e.data.get('ups', '?')}"
    if e.kind in (events.FAILOVER, events.FAILBACK):
        return "node failover"
    return e.sid


def _kind_events(journal: Journal, since: float | None) -> list[Event]:
    return list(reversed(journal.events(kinds=[*DOWN, *UP], since=since, limit=MAX_EVENTS)))


def history(journal: Journal, limit: int = 50, since: float | None = None) -> list[dict[str, Any]]:
    """Every outage, newest first (an open one first of all), with what holdover did in it."""
    done: list[dict[str, Any]] = []
    open_: dict[str, dict[str, Any]] = {}
    down: dict[str, set[str]] = {POWER: set(), UPLINK: set()}
    for e in _kind_events(journal, since):
        src = _source(e)
        if e.kind in DOWN:
            what = DOWN[e.kind]
            o = open_.get(what)
            if o is None:
                o = open_[what] = {"id": e.id, "kind": what, "start": e.rx_ts, "end": None, "sources": []}
            if src not in o["sources"]:
                o["sources"].append(src)
            down[what].add(src)
        else:
            what = UP[e.kind]
            if src not in down[what]:
                continue  # back, without our hearing it go (a restart in between): no outage
            down[what].discard(src)
            if not down[what] and what in open_:
                o = open_.pop(what)
                o["end"] = e.rx_ts
                done.append(o)
    out = sorted(open_.values(), key=lambda o: -o["start"]) + list(reversed(done))
    out = out[:limit]
    ledger = RescueLedger(journal)
    rescues = ledger.rescues() if out else []
    steps = ledger.steps() if rescues else []
    for o in out:
        _describe(o, rescues, steps)
    return out


def _describe(o: dict[str, Any], rescues: list[dict[str, Any]], steps: list[dict[str, Any]]) -> None:
    end = o["end"] if o["end"] is not None else time.time()
    o["open"] = o["end"] is None
    o["length_s"] = round(end - o["start"], 1)
    o["what"] = f"{'power' if o['kind'] == POWER else 'uplink'} at {', '.join(o['sources'])}"
    o["saved"], o["rescued"], o["lost"], o["final_command"] = [], [], [], False
    if o["kind"] != POWER:
        o["rescues"] = []
        return
    mine = [r for r in rescues if o["start"] - 1 <= r["started"] <= end + 1]
    o["rescues"] = [r["id"] for r in mine]
    ids = set(o["rescues"])
    for s in steps:
        if s["rescue_id"] not in ids:
            continue
        d = s["detail"]
        run = s["target"].rsplit(":", 1)[0]  # a target is NAME:PID
        if s["action"] == "verified":
            o["saved"].append({"run": run, "step": d.get("step"), "seconds": d.get("seconds"), "dir": d.get("dir")})
        elif s["action"] == "rescued":
            o["rescued"].append({"run": run, "dir": d.get("dir")})
        elif s["action"] == "lost":
            o["lost"].append({"run": run, "why": d.get("error")})
        elif s["action"] == "final_command":
            o["final_command"] = True


def concerns(sentinels: list[dict[str, Any]], ups: dict[str, Any] | None = None) -> list[str]:
    """What is not an outage but is not normal either, in a few words each: the tiles show it, and
    a banner saying "All normal" above them would contradict them."""
    out = []
    for s in sentinels:
        if s.get("configured") and s.get("status") in (None, "offline"):
            out.append(f"{s['sid']} {'not heard yet' if s.get('status') is None else 'offline'}")
        elif s.get("status") == "serial only":
            out.append(f"{s['sid']} heard over USB serial only")
        if s.get("uplink") in ("degraded", "down"):
            out.append(f"uplink {s['uplink']} at {s['sid']}")
    if ups and ups.get("problem"):
        out.append(f"host UPS: {ups['problem']}")
    elif ups and ups.get("on_battery"):
        out.append("host UPS on battery")
    return out


def banner(
    journal: Journal,
    ups: dict[str, Any] | None = None,
    rescue: dict[str, Any] | None = None,
    sentinels: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The page's first line: what is wrong and since when, the host's time left, what holdover is
    doing, and what to do; or, after one, how long it lasted and what was saved.

    `ups` is snapshot.ups(); `rescue` the Rescuer's view(); `sentinels` snapshot.sentinels(), whose
    lesser troubles (an uplink degraded, a sentinel gone quiet) keep the line from saying all is well."""
    found = history(journal, limit=5)
    now = time.time()
    current = [o for o in found if o["open"]]
    if not current:
        last = found[0] if found else None
        out: dict[str, Any] = {"state": "normal", "last": last, "concerns": concerns(sentinels or [], ups)}
        if last:
            saved = ", ".join(f"{s['run']} at step {s['step']}" for s in last["saved"])
            out["text"] = f"Back to normal. Last outage: {last['what']}, {duration(last['length_s'])}" + (
                f"; saved {saved}" if saved else ""
            )
            out["next"] = NEXT["after"] if last["saved"] or last["rescued"] else ""
        return out
    o = next((x for x in current if x["kind"] == POWER), current[0])
    out = {
        "state": o["kind"],
        "what": o["what"],
        "since": o["start"],
        "for_s": round(now - o["start"], 1),
        "others": [x["what"] for x in current if x is not o],
    }
    if o["kind"] == UPLINK:
        out.update(doing="failover to a backup uplink, if one is configured", phase="uplink", next=NEXT["uplink"])
        return out
    if ups is not None:
        left = ups.get("runtime_s")
        if ups.get("guess") and ups.get("deadline_s") is not None:
            # A guess is not a reading: it runs down from the cut, as the rescue's deadline does.
            left = max(0, round(ups["deadline_s"] - (now - o["start"])))
        out["time_left"] = {
            "runtime_s": left,
            "from": ups.get("deadline_from"),
            "guess": ups.get("guess"),
            "why": ups.get("guess_why"),
        }
    rescue = rescue or {}
    live = rescue.get("live") or {}
    if rescue.get("grace_until"):
        left = max(0.0, rescue["grace_until"] - now)
        out.update(
            phase="grace", doing=f"grace: {duration(left)} left before checkpointing", grace_left_s=round(left, 1)
        )
    elif rescue.get("active"):
        deadline = min(a["deadline"] for a in rescue["active"])
        progress = []
        for key, p in sorted(live.items()):
            pct = None
            if p.get("bytes_total"):
                pct = round(100 * (p.get("bytes_done") or 0) / p["bytes_total"])
            progress.append({"run": p.get("name", key), "state": p.get("state"), "pct": pct})
        n = len(progress)
        out.update(
            phase="saving",
            doing=f"checkpointing {n} run{'s' if n != 1 else ''}",
            progress=progress,
            deadline_in_s=round(deadline - now, 1),
        )
    elif o["lost"]:
        out.update(phase="lost", doing=f"{len(o['lost'])} run(s) not saved")
    elif o["saved"] or o["rescued"]:
        saved = ", ".join(f"{s['run']} at step {s['step']}, verified" for s in o["saved"])
        out.update(phase="saved", doing=f"saved: {saved or 'dumped (gcore)'}")
    else:
        out.update(phase="watching", doing="watching: no protected run to save")
    out["next"] = NEXT[out["phase"]]
    out["saved"], out["lost"] = o["saved"], o["lost"]
    return out
