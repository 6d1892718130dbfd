"""What the collector's HTTP endpoint serves (/metrics, /healthz, /readyz) and the totals
across processes. Kept apart from the receive path so that `serve`'s parent, which only
serves these, starts without loading the decoder, numba or the InfluxDB client."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector as PromCollector
from prometheus_client.registry import CollectorRegistry

from .settings import Settings

# Totals across processes ---------------------------------------------------------------

COUNTER_HELP = {
    "datagrams_received": "UDP datagrams received",
    "bytes_received": "UDP payload bytes received",
    "reports_decoded": "Individual reports decoded",
    "points_written": "Points written to InfluxDB",
    "points_dropped": "Oldest points dropped because the backlog was full",
    "write_failures": "Failed InfluxDB write attempts",
    "hops_unattributed": "Hops attributed to no link: no node ID or egress port, only "
    "domain-specific metadata, or ONOS's sink hop on the report's mirror port",
    "hops_implausible": "Hops not kept: node not in allowed_switches, or a link that "
    "link_min_reports distinct datagrams never confirmed",
    "links_over_limit": "Hops or switches not tracked: max_links reached",
    "flows_evicted": "Flows dropped from the LRU of max_flows for a newer one",
    "flows_evicted_unwritten": "Flows dropped from the LRU before their news was written "
    "(more active flows than max_flows, or more new ones a tick than max_flow_points)",
}
GAUGE_HELP = {
    "points_buffered": "Points waiting for InfluxDB",
    "links": "Links tracked (summed over workers; a link seen by two workers counts twice)",
    "flows": "Flows tracked (LRU)",
    "links_pending": "Links seen but not yet confirmed by link_min_reports datagrams",
}


def aggregate(live: list[dict[str, Any]], retired: dict[str, Any] | None = None) -> dict[str, Any]:
    """Sum the snapshots of live workers, plus the counters of workers that have exited."""
    out: dict[str, Any] = {
        "counters": dict.fromkeys(COUNTER_HELP, 0),
        "dropped": {},
        "lost": {},
        "gauges": dict.fromkeys(GAUGE_HELP, 0),
        "influxdb_up": all(s["influxdb_up"] for s in live),
        "workers": len(live),
        "worker_restarts": 0,
    }
    for snap in [*live, *([retired] if retired else [])]:
        for k, v in snap["counters"].items():
            out["counters"][k] = out["counters"].get(k, 0) + v
        for key in ("dropped", "lost"):
            for k, v in snap[key].items():
                out[key][k] = out[key].get(k, 0) + v
    for snap in live:
        for k, v in snap["gauges"].items():
            out["gauges"][k] += v
    if retired:
        out["worker_restarts"] = retired.get("worker_restarts", 0)
    return out


def health_of(snaps: list[dict[str, Any] | None], buffer_limit: int) -> tuple[int, dict[str, Any]]:
    """ok only if every worker is alive, receiving, and its last write succeeded."""
    live = [s for s in snaps if s is not None]
    receiving = len(live) == len(snaps) and all(s["receiving"] for s in live)
    errors = sorted({s["influxdb_error"] for s in live if not s["influxdb_up"]})
    influx_ok = all(s["influxdb_up"] for s in live)
    body: dict[str, Any] = {
        "status": "ok" if receiving and influx_ok else "degraded",
        "receiving": receiving,
        "influxdb": "ok" if influx_ok else "failing: " + "; ".join(errors),
        "buffered_points": sum(s["gauges"]["points_buffered"] for s in live),
        "buffer_limit": buffer_limit,
        "links": sum(s["gauges"]["links"] for s in live),
        "flows": sum(s["gauges"]["flows"] for s in live),
        "workers": [
            {"worker": i, "alive": s is not None, "pid": s and s["pid"],
             "receiving": bool(s and s["receiving"]),
             "datagrams": s["counters"]["datagrams_received"] if s else None,
             "influxdb": "ok" if s and s["influxdb_up"] else (s or {}).get("influxdb_error", "")}
            for i, s in enumerate(snaps)
        ],
    }  # fmt: skip
    return (200 if body["status"] == "ok" else 503), body


def readiness_of(snaps: list[dict[str, Any] | None]) -> tuple[int, dict[str, Any]]:
    """ready once every worker's receive loop runs (InfluxDB plays no part: reports are
    taken in and kept in the backlog while it is away)."""
    receiving = [bool(s and s["receiving"]) for s in snaps]
    ready = bool(snaps) and all(receiving)
    body = {"ready": ready, "workers": len(snaps), "receiving": sum(receiving)}
    return (200 if ready else 503), body


class _Metrics(PromCollector):
    """Renders an aggregate snapshot at scrape time (no locking in the hot path)."""

    def __init__(self, source: Callable[[], dict[str, Any]]) -> None:
        self.source = source

    def collect(self) -> Iterator[Any]:
        a = self.source()
        p = "int_collector_"
        c = a["counters"]
        for name in ("datagrams_received", "bytes_received", "reports_decoded"):
            yield CounterMetricFamily(p + name, COUNTER_HELP[name], c[name])
        dropped = CounterMetricFamily(
            p + "reports_dropped", "Datagrams or reports dropped, by reason", labels=["reason"]
        )
        for reason, n in sorted(a["dropped"].items()):
            dropped.add_metric([reason], n)
        yield dropped
        lost = CounterMetricFamily(
            p + "reports_lost",
            "Report datagrams missing by sequence number, per switch",
            labels=["switch"],
        )
        for node, n in sorted(a["lost"].items(), key=lambda kv: int(kv[0])):
            lost.add_metric([node], n)
        yield lost
        for name in ("points_written", "points_dropped", "write_failures"):
            yield CounterMetricFamily(p + name, COUNTER_HELP[name], c[name])
        g = a["gauges"]
        yield GaugeMetricFamily(
            p + "points_buffered", GAUGE_HELP["points_buffered"], g["points_buffered"]
        )
        yield GaugeMetricFamily(
            p + "influxdb_up", "1 if every worker's last write succeeded", int(a["influxdb_up"])
        )
        yield GaugeMetricFamily(p + "links", GAUGE_HELP["links"], g["links"])
        yield GaugeMetricFamily(p + "flows", GAUGE_HELP["flows"], g["flows"])
        yield GaugeMetricFamily(
            p + "links_pending", GAUGE_HELP["links_pending"], g["links_pending"]
        )
        for name in (
            "hops_unattributed", "hops_implausible", "links_over_limit", "flows_evicted",
            "flows_evicted_unwritten",
        ):  # fmt: skip
            yield CounterMetricFamily(p + name, COUNTER_HELP[name], c[name])
        yield GaugeMetricFamily(p + "workers", "Receiving processes alive", a["workers"])
        yield CounterMetricFamily(
            p + "worker_restarts", "Receiving processes restarted after they died",
            a["worker_restarts"],
        )  # fmt: skip


def start_http(
    settings: Settings,
    metrics: Callable[[], dict[str, Any]],
    health: Callable[[], tuple[int, dict[str, Any]]],
    readiness: Callable[[], tuple[int, dict[str, Any]]] | None = None,
) -> ThreadingHTTPServer:
    """/metrics, /healthz and /readyz on a daemon thread."""
    registry = CollectorRegistry()
    registry.register(_Metrics(metrics))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                body, ctype, code = generate_latest(registry), CONTENT_TYPE_LATEST, 200
            elif path == "/healthz" or (path == "/readyz" and readiness is not None):
                code, doc = health() if path == "/healthz" else readiness()  # type: ignore[misc]
                body, ctype = json.dumps(doc).encode() + b"\n", "application/json"
            else:
                body, ctype, code = (
                    b"not found: try /metrics, /healthz or /readyz\n", "text/plain", 404
                )  # fmt: skip
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    http = ThreadingHTTPServer((settings.http_host, settings.http_port), Handler)
    http.daemon_threads = True
    threading.Thread(target=http.serve_forever, name="http", daemon=True).start()
    return http
