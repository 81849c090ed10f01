"""GET /metrics for Prometheus: a collector that reads the bridge when scraped (the way
prometheus_client's process collector reads /proc), on a registry of this app's own."""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from holdover.bridge.service import Bridge
from holdover.web import snapshot

router = APIRouter(tags=["metrics"])


class BridgeCollector(Collector):
    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        b = self.bridge
        online = GaugeMetricFamily(
            "holdover_sentinel_online", "1 if the sentinel is heard on some path (MQTT or serial)", labels=["sentinel"]
        )
        mains = GaugeMetricFamily("holdover_mains_present", "1 on mains, 0 on battery", labels=["sentinel"])
        # The sentinel's own cell: how long the sentinel keeps watching, not the host's time (holdover_ups_*).
        pct = GaugeMetricFamily("holdover_battery_percent", "the sentinel's own cell, percent", labels=["sentinel"])
        volts = GaugeMetricFamily("holdover_battery_volts", "the sentinel's own cell, volts", labels=["sentinel"])
        runtime = GaugeMetricFamily(
            "holdover_battery_runtime_seconds", "the sentinel's own cell: its runtime left", labels=["sentinel"]
        )
        uplink = GaugeMetricFamily("holdover_uplink_up", "1 up, 0.5 degraded, 0 down", labels=["sentinel"])
        # Base units, as Prometheus asks (promtool check metrics): seconds, and loss as a ratio.
        rtt = GaugeMetricFamily("holdover_probe_rtt_seconds", "probe round trip", labels=["sentinel", "target"])
        loss = GaugeMetricFamily("holdover_probe_loss_ratio", "probe loss, 0 to 1", labels=["sentinel", "target"])
        for s in snapshot.sentinels(b.journal, [x.id for x in b.settings.sentinels]):
            sid = s["sid"]
            online.add_metric([sid], 1.0 if s["status"] in ("online", "serial only") else 0.0)
            if s["mains"] is not None:
                mains.add_metric([sid], 1.0 if s["mains"] else 0.0)
            for fam, key in ((pct, "battery_pct"), (volts, "battery_v"), (runtime, "runtime_s")):
                if isinstance(s[key], int | float):
                    fam.add_metric([sid], float(s[key]))
            if s["uplink"] in ("up", "degraded", "down"):
                uplink.add_metric([sid], {"up": 1.0, "degraded": 0.5, "down": 0.0}[s["uplink"]])
            for t in s["targets"]:
                if t.get("rtt_ms") is not None:
                    rtt.add_metric([sid, str(t.get("name"))], float(t["rtt_ms"]) / 1000)
                if t.get("loss_pct") is not None:
                    loss.add_metric([sid, str(t.get("name"))], float(t["loss_pct"]) / 100)
        yield from (online, mains, pct, volts, runtime, uplink, rtt, loss)
        ev = CounterMetricFamily("holdover_events", "events journaled", labels=["sentinel", "kind"])
        for sid, kind, n in b.journal.event_counts():
            ev.add_metric([sid, kind], float(n))
        yield ev
        rej = CounterMetricFamily("holdover_rejections", "messages refused", labels=["reason"])
        for reason, n in b.journal.rejection_counts().items():
            rej.add_metric([reason], float(n))
        yield rej
        unsent = GaugeMetricFamily("holdover_alerts_unsent", "alerts waiting in the outbox", labels=["channel"])
        waiting = b.alerts.outbox.unsent()
        for ch in sorted({c.name for c in b.settings.alerts.channels} | set(waiting)):
            unsent.add_metric([ch], float(waiting.get(ch, 0)))  # every channel, 0 too: absent is not "none"
        yield unsent
        yield from self._ups()
        yield from self._plan()
        if b.failover is not None:
            fo = GaugeMetricFamily("holdover_uplink_judged_up", "the node's own verdict per uplink", labels=["uplink"])
            for name, h in b.failover.health.items():
                if h.up is not None:
                    fo.add_metric([name], 1.0 if h.up else 0.0)
            yield fo
            yield CounterMetricFamily("holdover_failover_switches", "route switches", value=b.failover.switches)

    def _plan(self) -> Iterator[GaugeMetricFamily]:
        p = snapshot.watched_plan(self.bridge.settings, self.bridge.ups)
        runs = GaugeMetricFamily(
            "holdover_rescue_plan_runs", "protected runs a cut now would save, or not", labels=["fits"]
        )
        runs.add_metric(["yes"], float(len(p["order"])))
        runs.add_metric(["no"], float(len(p["cannot"])))
        yield runs
        for metric, help_, key in (
            (
                "holdover_rescue_plan_kept_seconds",
                "compute a cut now would keep (age x ranks of the runs that fit)",
                "kept_s",
            ),
            (
                "holdover_rescue_plan_lost_seconds",
                "compute a cut now would lose (of the runs that cannot fit)",
                "lost_s",
            ),
            (
                "holdover_rescue_plan_budget_seconds",
                "the time to save in: the runtime less margin and grace",
                "budget_s",
            ),
        ):
            yield GaugeMetricFamily(metric, help_, value=float(p[key]))
        if p["shed_gain_s"] is not None:  # only with the load model's figures: no claim without them
            yield GaugeMetricFamily(
                "holdover_rescue_plan_shed_gain_seconds",
                "runtime the UPS gains if each run stops once saved (load model: energy left / load)",
                value=float(p["shed_gain_s"]),
            )

    def _ups(self) -> Iterator[GaugeMetricFamily]:
        u = snapshot.watched_ups(self.bridge.settings, self.bridge.ups)
        if not u["configured"]:
            return
        name = u["name"]
        readable = GaugeMetricFamily("holdover_ups_readable", "1 if the host's UPS answers", labels=["ups"])
        readable.add_metric([name], 0.0 if u["problem"] else 1.0)
        yield readable
        if u["status"] is None:  # not read from a UPS now: nothing to say of it
            return
        for metric, help_, value in (
            ("holdover_ups_on_battery", "1 if the host's UPS is on battery (OB)", u["on_battery"]),
            ("holdover_ups_low_battery", "1 at low battery (LB, FSD or under low_runtime_s)", u["low"]),
            ("holdover_ups_runtime_seconds", "the host's UPS: runtime left (the rescue's clock)", u["runtime_s"]),
            ("holdover_ups_charge_percent", "the host's UPS: battery charge", u["charge"]),
            ("holdover_ups_load_percent", "the host's UPS: load", u["load"]),
        ):
            if value is not None:
                fam = GaugeMetricFamily(metric, help_, labels=["ups"])
                fam.add_metric([name], float(value))
                yield fam


@router.get("/metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    registry = getattr(request.app.state, "registry", None)
    if registry is None:
        registry = request.app.state.registry = CollectorRegistry()
        registry.register(BridgeCollector(request.app.state.bridge))
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
