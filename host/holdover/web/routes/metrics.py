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
        pct = GaugeMetricFamily("holdover_battery_percent", "battery charge, percent", labels=["sentinel"])
        volts = GaugeMetricFamily("holdover_battery_volts", "battery voltage", labels=["sentinel"])
        runtime = GaugeMetricFamily("holdover_battery_runtime_seconds", "runtime left on battery", labels=["sentinel"])
        uplink = GaugeMetricFamily("holdover_uplink_up", "1 up, 0.5 degraded, 0 down", labels=["sentinel"])
        rtt = GaugeMetricFamily("holdover_probe_rtt_ms", "probe round trip", labels=["sentinel", "target"])
        loss = GaugeMetricFamily("holdover_probe_loss_percent", "probe loss", labels=["sentinel", "target"])
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
                    rtt.add_metric([sid, str(t.get("name"))], float(t["rtt_ms"]))
                if t.get("loss_pct") is not None:
                    loss.add_metric([sid, str(t.get("name"))], float(t["loss_pct"]))
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
        for ch, n in b.alerts.outbox.unsent().items():
            unsent.add_metric([ch], float(n))
        yield unsent
        if b.failover is not None:
            fo = GaugeMetricFamily("holdover_uplink_judged_up", "the node's own verdict per uplink", labels=["uplink"])
            for name, h in b.failover.health.items():
                if h.up is not None:
                    fo.add_metric([name], 1.0 if h.up else 0.0)
            yield fo
            yield CounterMetricFamily("holdover_failover_switches", "route switches", value=b.failover.switches)


@router.get("/metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    registry = getattr(request.app.state, "registry", None)
    if registry is None:
        registry = request.app.state.registry = CollectorRegistry()
        registry.register(BridgeCollector(request.app.state.bridge))
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
