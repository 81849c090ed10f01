"""What the node and its sentinels look like now, read from the journal and the run registry.

Both the HTTP API and `holdover status` use it; it needs no running bridge (the journal is the
bridge's memory), so the CLI works while the bridge is down.
"""

from __future__ import annotations

import time
from typing import Any

from holdover import events
from holdover.firmware import protocol
from holdover.journal import Event, Journal
from holdover.node import plan
from holdover.node.rescue_ledger import RescueLedger
from holdover.node.ups import UpsReading, UpsWatch, runtime_from
from holdover.settings import Settings


def sentinels(journal: Journal, configured: list[str]) -> list[dict[str, Any]]:
    """Every configured sentinel and every one the journal has heard of, with its last state."""
    seen = journal.sentinel_ids()
    out = []
    for sid in sorted(set(configured) | set(seen)):
        held = journal.sentinel(sid) or {}
        state = held.get("state") or {}
        out.append(
            {
                "sid": sid,
                "configured": sid in configured,
                "status": held.get("status"),  # online / offline, from the retained status and last will
                "status_age_s": _age(held.get("status_ts")),
                "state_age_s": _age(held.get("state_ts")),
                "mains": state.get("mains"),
                "battery_v": state.get("battery_v"),
                "battery_pct": state.get("battery_pct"),
                "runtime_s": state.get(protocol.RUNTIME),
                "uplink": state.get("uplink"),  # up / degraded / down, or None: not watched
                "targets": state.get("targets") or [],  # each probe target's RTT and loss
                "relay": state.get("relay"),
                "last_event": _last_event(journal, sid),
            }
        )
    return out


def _age(ts: float | None) -> float | None:
    return None if ts is None else round(max(0.0, time.time() - ts), 1)


def _last_event(journal: Journal, sid: str) -> dict[str, Any] | None:
    found = journal.events(sid=sid, limit=1)
    if not found:
        return None
    e = found[0]
    return {"kind": e.kind, "age_s": _age(e.rx_ts), "text": events.kind(e.kind).describe(sid=sid, **e.data)}


def uplinks(journal: Journal) -> dict[str, Any]:
    """The node's failover as the journal last recorded it (the live view is the bridge's)."""
    last = journal.events(sid=protocol.NODE, kind=None, limit=50)
    for e in last:
        if e.kind in (events.FAILOVER, events.FAILBACK):
            return {
                "active": e.data.get("uplink"),
                "since_s": _age(e.rx_ts),
                "last": e.kind,
                "uplinks": e.data.get("uplinks", []),
            }
    return {"active": None, "since_s": None, "last": None, "uplinks": []}


def checkpoints(journal: Journal, limit: int = 50) -> list[dict[str, Any]]:
    """Verified emergency checkpoints, newest first: which run, its size, how long, how fast."""
    out = []
    for s in reversed(RescueLedger(journal).steps()):
        if s["action"] != "verified":
            continue
        d = s["detail"]
        out.append(
            {
                "target": s["target"],
                "at": s["ts"],
                "age_s": _age(s["ts"]),
                "dir": d.get("dir"),
                "step": d.get("step"),
                "bytes": d.get("bytes"),
                "seconds": d.get("seconds"),
                "mb_s": d.get("mb_s"),
            }
        )
        if len(out) >= limit:
            break
    return out


def ups(cfg: Settings, r: UpsReading | None, problem: str | None) -> dict[str, Any]:
    """The host's UPS (the rescue's clock) as last read, and what an emergency's deadline would be
    taken from now: its runtime, or `runtime_default`, named as the guess it is."""
    u = cfg.ups
    rt = runtime_from(u, r, problem, cfg.protect.runtime_default)
    live = r if r is not None and not r.fixed and problem is None else None  # read from a UPS, now
    return {
        "configured": u.enabled,
        "name": u.name if u.enabled else None,
        "source": u.source or ("[ups] runtime_s" if u.runtime_s else None),
        "status": " ".join(live.status) if live else None,
        "on_battery": live.on_battery if live else None,
        "low": live.low(u.low_runtime_s) if live else None,
        "charge": live.charge if live else None,
        "runtime_s": round(r.runtime_s) if r is not None and r.runtime_s is not None and problem is None else None,
        "load": live.load if live else None,
        "read_age_s": _age(r.at) if r is not None else None,
        "problem": problem,
        "deadline_from": rt.said,
        "deadline_s": round(rt.seconds),
        "guess": rt.guess,
        "guess_why": rt.why or None,
    }


def rescue_plan(cfg: Settings, r: UpsReading | None, problem: str | None) -> dict[str, Any]:
    """What a cut now would save, in what order, against the runtime the rescue would take (node/plan.py)."""
    rt = runtime_from(cfg.ups, r, problem, cfg.protect.runtime_default)
    return plan.for_node(cfg.protect, rt).as_dict()


def watched_ups(cfg: Settings, watch: UpsWatch | None) -> dict[str, Any]:
    """ups() from a running bridge's watch (its last read), for the API, the banner and /metrics."""
    return ups(cfg, watch.latest if watch else None, watch.problem if watch else None)


def watched_plan(cfg: Settings, watch: UpsWatch | None) -> dict[str, Any]:
    """rescue_plan() from a running bridge's watch, for the API and /metrics."""
    return rescue_plan(cfg, watch.latest if watch else None, watch.problem if watch else None)


def folded(
    journal: Journal, kinds: tuple[str, ...], sid: str | None, page: list[Event], limit: int, before: int | None = None
) -> dict[str, int]:
    """How many events of the left-out `kinds` fall in the span a page of events (newest first)
    covers: a full page reaches back to its oldest event, a short one to the journal's start."""
    lo = page[-1].id if page and len(page) == limit else 0
    return {k: n for k in kinds if (n := journal.count([k], sid, lo, before))}


SLURM_KINDS = (events.SLURM_DRAINED, events.SLURM_RESUMED, events.SLURM_JOB_SAVED, events.SLURM_JOB_UNSAVED)


def slurm(journal: Journal, cfg: Settings) -> list[dict[str, Any]]:
    """Each circuit of [slurm]: whether holdover has its nodes drained now (since when, why), and
    the jobs it told to checkpoint with what became of each (saved at step N, then what; unsaved)."""
    if not cfg.slurm.enabled:
        return []
    evs = list(reversed(journal.events(kinds=SLURM_KINDS, limit=1000)))  # oldest first
    out = []
    for c in cfg.slurm.circuits:
        mine = [e for e in evs if e.data.get("circuit") == c.name]
        drains = [i for i, e in enumerate(mine) if e.kind == events.SLURM_DRAINED]
        # since, reason, age_s: of a drain in force; resumed_at: when the last one ended.
        circuit: dict[str, Any] = {"circuit": c.name, "nodes": c.nodes, "drained": False, "jobs": []}
        circuit.update(since=None, reason=None, age_s=None, resumed_at=None)
        if drains:
            last = mine[drains[-1]]
            after = mine[drains[-1] + 1 :]
            resumed = next((e for e in after if e.kind == events.SLURM_RESUMED), None)
            circuit["drained"] = resumed is None
            if resumed is None:
                circuit.update(since=last.rx_ts, reason=last.data.get("reason"), age_s=_age(last.rx_ts))
            else:
                circuit["resumed_at"] = resumed.rx_ts
            for j in last.data.get("jobs") or []:
                ends = (e for e in after if e.kind != events.SLURM_RESUMED and e.data.get("job") == j["job"])
                fate = next(ends, None)
                job = {**j, "state": "told to checkpoint"}
                if fate is not None and fate.kind == events.SLURM_JOB_SAVED:
                    job.update(state=f"saved at step {fate.data.get('step')}, {fate.data.get('then')}")
                    if resumed is not None and j["job"] in (resumed.data.get("jobs") or []):
                        job["state"] += ", resumed"
                elif fate is not None:
                    job.update(state=f"not saved: {fate.data.get('missing')}")
                circuit["jobs"].append(job)
        out.append(circuit)
    return out
