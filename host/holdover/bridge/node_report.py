"""This node on MQTT: a retained state (power, the host UPS, the uplink in use, the rescue, the
protected runs) on holdover/node/NAME/state, its availability (online; offline is the bridge's last
will), Home Assistant discovery for it as a device of its own, and the button's checkpoint press.

The state goes out on every event that can change it and every `interval` seconds (ages and the
UPS's runtime move without events). Unsigned, like the uplink's: information for Home Assistant,
phone apps and other bridges; the only thing anyone can ask of the node here is a checkpoint,
which saves and harms nothing, and even that is rate-limited and journaled with who asked.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable
from typing import Any

import holdover
from holdover import events
from holdover.firmware import protocol
from holdover.journal import Event, Journal
from holdover.node import launch, plan
from holdover.node.rescue import Rescuer
from holdover.node.targets import registry_dir
from holdover.node.ups import UpsWatch, runtime_from
from holdover.settings import Settings

log = logging.getLogger("holdover.node_report")

REPORT_EVERY_S = 30.0
WATCH_S = 0.25  # how often the runs' registrations are looked at (a stat each): a save reaches the cluster sooner
SOON_S = 0.3  # events come in bursts (a cut: mains_lost, ups_on_battery, the grace): one state for them
RESCUE_PHASES = ["idle", "grace", "saving"]
# The host UPS in the words of Home Assistant's NUT integration: its status, and "stale" when it
# cannot be read (NUT's "data stale", upsd gone, a garbled answer: UpsWatch.problem).
UPS_STATES = ["online", "on_battery", "low_battery", "stale"]
UPLINK_STATES = ["up", "on_backup", "down"]  # the primary carrying traffic, a backup, or none
# Jinja for Home Assistant, on the state's JSON: each entity reads one field of it.
_UNKNOWN = "None"  # what Home Assistant takes as "unknown" from a template


def _object_id(name: str) -> str:
    # Home Assistant's object ids are [a-zA-Z0-9_-]; run names may also hold dots.
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)


def _entity_id(component: str, uid: str) -> dict[str, str]:
    """The entity id Home Assistant is asked to make (docs/service.md lists them), the twin of
    the board's firmware/discovery.ha_entity_id, which stays there: in protocol.py, resident on
    the board, it cost 2.7 KB of the chip's heap at its fullest."""
    slug = re.sub(r"[^a-z0-9]", "_", uid.lower())  # Home Assistant's slug: a node named gpu-01
    return {"obj_id": slug, "default_entity_id": f"{component}.{slug}"}


class NodeReport:
    """A Reaction: the node's state on MQTT and in Home Assistant."""

    interval = REPORT_EVERY_S

    def __init__(
        self,
        settings: Settings,
        journal: Journal,
        publish: Callable[[str, bytes, bool], None],
        ups: UpsWatch | None,
        rescuer: Rescuer,
        uplink: Callable[[], tuple[bool, str | None]],  # (failover heard yet, the uplink in use)
        node_event: Callable[[str, dict[str, Any]], Event],
    ) -> None:
        self.s = settings
        self.node = settings.node
        self.journal = journal
        self.publish = publish
        self.ups = ups
        self.rescuer = rescuer
        self.uplink = uplink
        self.node_event = node_event
        self.state_topic = protocol.node_topic(self.node, protocol.STATE)
        self.status_topic = protocol.node_topic(self.node, protocol.STATUS)
        self.press_topic = protocol.node_topic(self.node, protocol.NODE_CHECKPOINT)
        self._mains_lost: set[str] = set()  # sentinels whose mains is out, from their events
        self._announced: set[str] = set()  # config topics of run entities on the broker now
        self._last_press = -1e9
        self._wake = asyncio.Event()
        self._registry_seen: tuple[tuple[str, int], ...] = ()
        self._task: asyncio.Task[None] | None = None

    # --- Reaction --------------------------------------------------------------------------------

    def start(self) -> None:
        for sid in self.journal.sentinel_ids():
            state = (self.journal.sentinel(sid) or {}).get("state") or {}
            if state.get("mains") is False:
                self._mains_lost.add(sid)
        self._task = asyncio.get_running_loop().create_task(self._every())

    def on_event(self, event: Event) -> None:
        if event.kind == protocol.MAINS_LOST:
            self._mains_lost.add(event.sid)
        elif event.kind == protocol.MAINS_RESTORED:
            self._mains_lost.discard(event.sid)
        if event.kind not in events.ROUTINE:
            self._wake.set()

    async def close(self) -> None:
        await events.cancel(self._task)

    def connected(self) -> None:
        """On every connect to the broker: online, the discovery, and the state at once (the last
        will said offline if the link dropped)."""
        self.publish(self.status_topic, protocol.ONLINE.encode(), True)
        if self.s.ha.discovery:
            for topic, config in self.discovery(runs=[]):
                self.publish(topic, json.dumps(config).encode(), True)
            self._announced.clear()  # the runs' entities follow with the next state
        self._wake.set()

    def pressed(self, payload: bytes, retained: bool) -> str | None:
        """Home Assistant's checkpoint button: the reason it was refused, or None once asked."""
        if retained:
            why = "a retained press (a press is never retained: someone published it by hand)"
        elif payload.strip() != protocol.PRESS.encode():
            why = f"payload {payload[:40]!r} is not {protocol.PRESS}"
        elif not self.s.protect.enabled:
            why = "[protect] is disabled in the config"
        elif time.monotonic() - self._last_press < self.s.ha.press_every_s:
            why = f"pressed again within [ha] press_every_s ({self.s.ha.press_every_s:.0f} s)"
        else:
            self._last_press = time.monotonic()
            # Only Home Assistant's login may publish here where broker-config wrote the ACL.
            self.node_event(events.CHECKPOINT_REQUESTED, {"by": f"home assistant ({self.press_topic})"})
            return None
        log.warning("checkpoint button on %s refused: %s", self.press_topic, why)
        return why

    # --- the state -------------------------------------------------------------------------------

    def _registry_changed(self) -> bool:
        """A run saved (its Guard rewrote its registration) or came or went: worth a report now,
        so the cluster's bridge hears of a checkpoint within WATCH_S, not at the next interval."""
        try:
            found = registry_dir(self.s.protect).glob("*.json")
            seen = tuple(sorted((p.name, p.stat().st_mtime_ns) for p in found))
        except OSError:
            seen = ()
        changed, self._registry_seen = seen != self._registry_seen, seen
        return changed

    async def _every(self) -> None:
        last = 0.0
        while True:
            if await events.woken(self._wake, WATCH_S):
                await asyncio.sleep(SOON_S)
            watched = self.s.protect.enabled and self._registry_changed()
            if not (self._wake.is_set() or watched or time.monotonic() - last >= self.interval):
                continue
            self._wake.clear()
            last = time.monotonic()
            try:
                protect = self.s.protect
                runs = await asyncio.to_thread(launch.recover, protect.registry) if protect.enabled else []
                self.report(runs)
            except Exception:  # the next round tries again; a report never stops the bridge
                log.exception("reporting node %s", self.node)

    def report(self, runs: list[dict[str, Any]]) -> dict[str, Any]:
        state = self.state(runs)
        self.publish(self.state_topic, json.dumps(state).encode(), True)
        if self.s.ha.discovery:
            self._announce_runs(runs)
        return state

    def state(self, runs: list[dict[str, Any]]) -> dict[str, Any]:
        latest = self.ups.latest if self.ups is not None and self.ups.problem is None else None
        ups = None
        if latest is not None and not latest.fixed:
            ups = {"name": self.s.ups.name, **latest.summary()}
        # The node is on battery when its UPS says so; without a UPS read, when a sentinel on its
        # circuit has lost mains (the host then runs on whatever keeps it up).
        on_battery = ups is not None and latest is not None and latest.on_battery
        if ups is None:
            on_battery = bool(self._mains_lost)
        view = self.rescuer.view()
        phase = "saving" if view["active"] else "grace" if view["grace_until"] else "idle"
        heard, uplink = self.uplink()
        problem = self.ups.problem if self.ups is not None else None
        rt = runtime_from(self.s.ups, self.ups.latest if self.ups else None, problem, self.s.protect.runtime_default)
        return {
            "node": self.node,
            "ts": round(time.time(), 3),
            "version": holdover.__version__,
            "alerts": bool(self.s.alerts.channels),  # which bridge of the site alerts (bridge.site)
            "on_battery": on_battery,
            "power_from": "ups" if ups is not None else "sentinels",
            "mains_lost_at": sorted(self._mains_lost),
            "ups": ups,
            "ups_status": self._ups_status(latest),
            "uplink": uplink,
            "uplink_status": self._uplink_status(heard, uplink),
            "rescue": phase,
            "plan": plan.for_node(self.s.protect, rt).as_dict(),  # what a cut now would save (node/plan.py)
            "runs": {
                r["name"]: {
                    "state": r["state"],
                    "job": r.get("job"),  # its Slurm job, which the cluster's bridge follows
                    "step": (r.get("checkpoint") or {}).get("step"),
                    "checkpoint_age_s": (r.get("checkpoint") or {}).get("age_s"),
                }
                for r in runs
            },
        }

    def _ups_status(self, latest: Any) -> str | None:
        if not self.s.ups.enabled or self.ups is None:
            return None
        if self.ups.problem is not None:
            return "stale"
        if latest is None or latest.fixed:
            return None  # nothing read yet, or no UPS to read (runtime_s only): unknown
        if latest.low(self.s.ups.low_runtime_s):
            return "low_battery"
        return "on_battery" if latest.on_battery else "online"

    def _uplink_status(self, heard: bool, active: str | None) -> str | None:
        uplinks = self.s.failover.uplinks
        if not uplinks or not heard:
            return None
        if active is None:
            return "down"
        return "up" if active == uplinks[0].name else "on_backup"

    # --- Home Assistant --------------------------------------------------------------------------

    def device(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "ids": ["holdover_" + protocol.ha_node_id(self.node)],
            "name": f"holdover node {self.node}",
            "mf": "holdover",
            "mdl": "bridge",
            "sw": holdover.__version__,
        }
        url = self.s.dashboard_url()
        if url:
            d["cu"] = url
        return d

    def _entity(self, component: str, oid: str, name: str, template: str | None, **extra: Any) -> tuple[str, dict]:
        uid = "holdover_" + protocol.ha_node_id(self.node) + "_" + oid
        c: dict[str, Any] = {"name": name, "uniq_id": uid, "avty_t": self.status_topic, "dev": self.device()}
        c.update(_entity_id(component, uid))
        if template is not None:
            c["stat_t"] = self.state_topic
            c["val_tpl"] = "{{ " + template + " }}"
        c.update(extra)
        return protocol.ha_config_topic(self.s.ha.prefix, component, protocol.ha_node_id(self.node), oid), c

    def discovery(self, runs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
        """(topic, config) of every entity of this node: its own, then one pair per run."""
        out = [
            self._entity(
                "binary_sensor",
                "line_power",
                "Line power",
                "'OFF' if value_json.on_battery else 'ON'",
                dev_cla="power",
            ),
            self._entity(
                "sensor",
                "rescue",
                "Rescue",
                "value_json.rescue",
                dev_cla="enum",
                ops=RESCUE_PHASES,
                ic="mdi:content-save-alert",
            ),
            self._entity(
                "sensor",
                "runs_at_risk",
                "Runs a cut would not save",
                "value_json.plan.cannot | length",
                stat_cla="measurement",
                ic="mdi:content-save-alert-outline",
                json_attr_t=self.state_topic,
                json_attr_tpl="{{ {'plan': value_json.plan.sentence, 'kept_s': value_json.plan.kept_s, "
                "'lost_s': value_json.plan.lost_s} | tojson }}",
            ),
            self._entity(
                "button",
                "checkpoint",
                "Checkpoint every run now",
                None,
                cmd_t=self.press_topic,
                pl_prs=protocol.PRESS,
                ic="mdi:content-save",
            ),
        ]
        if self.s.ups.enabled:
            out += [
                self._entity(
                    "sensor",
                    "ups_runtime",
                    "UPS runtime",
                    f"value_json.ups.runtime_s if value_json.ups else {_UNKNOWN}",
                    dev_cla="duration",
                    unit_of_meas="s",
                    stat_cla="measurement",
                ),
                self._entity(
                    "sensor",
                    "ups_charge",
                    "UPS charge",
                    f"value_json.ups.charge if value_json.ups else {_UNKNOWN}",
                    dev_cla="battery",
                    unit_of_meas="%",
                    stat_cla="measurement",
                ),
            ]
        if self.s.ups.enabled:
            # What Home Assistant's NUT integration shows of a UPS, read by this node.
            status = "value_json.ups_status"
            out += [
                self._entity(
                    "sensor",
                    "ups_status",
                    "UPS status",
                    f"{status} if {status} else {_UNKNOWN}",
                    dev_cla="enum",
                    ops=UPS_STATES,
                    ic="mdi:power-plug-battery",
                ),
                self._entity(
                    "binary_sensor",
                    "ups_on_battery",
                    "UPS on battery",
                    f"'ON' if {status} in ['on_battery', 'low_battery'] else "
                    f"'OFF' if {status} == 'online' else {_UNKNOWN}",
                    ic="mdi:battery-arrow-down",
                ),
                self._entity(
                    "binary_sensor",
                    "ups_low_battery",
                    "UPS low battery",
                    f"'ON' if {status} == 'low_battery' else "
                    f"'OFF' if {status} in ['online', 'on_battery'] else {_UNKNOWN}",
                    dev_cla="battery",
                ),
                self._entity(
                    "sensor",
                    "ups_load",
                    "UPS load",
                    f"value_json.ups.load if value_json.ups and value_json.ups.load is not none else {_UNKNOWN}",
                    unit_of_meas="%",
                    stat_cla="measurement",
                    ic="mdi:gauge",
                ),
            ]
        if self.s.failover.uplinks:
            names = [u.name for u in self.s.failover.uplinks]
            out += [
                self._entity(
                    "sensor",
                    "uplink",
                    "Uplink in use",
                    f"value_json.uplink if value_json.uplink in {json.dumps(names)} else {_UNKNOWN}",
                    dev_cla="enum",
                    ops=names,
                    ic="mdi:wan",
                ),
                self._entity(
                    "sensor",
                    "uplink_status",
                    "Uplink status",
                    f"value_json.uplink_status if value_json.uplink_status else {_UNKNOWN}",
                    dev_cla="enum",
                    ops=UPLINK_STATES,
                    ic="mdi:wan",
                ),
            ]
        for r in runs:
            out += self._run_entities(r["name"])
        return out

    def _run_entities(self, name: str) -> list[tuple[str, dict[str, Any]]]:
        oid = "run_" + _object_id(name)
        at = "value_json.runs[" + json.dumps(name) + "]"
        there = json.dumps(name) + " in value_json.runs"
        return [
            self._entity(
                "sensor",
                oid,
                f"Run {name}",
                f"{at}.state if {there} else 'gone'",
                ic="mdi:chart-line",
                json_attr_t=self.state_topic,
                json_attr_tpl="{{ " + f"{at} | tojson if {there} else '{{}}'" + " }}",
            ),
            self._entity(
                "sensor",
                oid + "_checkpoint_age",
                f"Run {name} checkpoint age",
                f"{at}.checkpoint_age_s if {there} and {at}.checkpoint_age_s is not none else {_UNKNOWN}",
                dev_cla="duration",
                unit_of_meas="s",
                stat_cla="measurement",
            ),
        ]

    def _announce_runs(self, runs: list[dict[str, Any]]) -> None:
        """Each run's entities announced once while it is listed, and removed (an empty retained
        config) when it is not: a run finished a week ago leaves Home Assistant with it."""
        now = {t: c for r in runs for t, c in self._run_entities(r["name"])}
        for topic in sorted(set(now) - self._announced):
            self.publish(topic, json.dumps(now[topic]).encode(), True)
        for topic in sorted(self._announced - set(now)):
            self.publish(topic, b"", True)
        self._announced = set(now)
