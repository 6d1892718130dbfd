"""The collector: UDP receive loop, derived state, periodic change-driven writes, HTTP.

The receive loop reads a non-blocking socket until it is empty and only then waits in
`poll`, so a busy collector spends no system call per datagram beyond the `recv` itself.
Nothing a datagram contains can end the loop: `DecodeError` is counted by reason, and any
other exception is counted as `internal` with the datagram dropped (and logged once per
kind), since a collector that dies on a packet loses everything after it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector as PromCollector
from prometheus_client.registry import CollectorRegistry

from .settings import Settings
from .state import Fabric
from .storage import Writer
from .wire import DecodeError, Decoder, IntMarking

log = logging.getLogger("int_collector")

MAX_DATAGRAM = 65535


class Collector:
    """One receiving process: socket, decoder, fabric state, writer, HTTP endpoint."""

    def __init__(
        self, settings: Settings, *, reuse_port: bool = False, worker: int = 0, workers: int = 1
    ) -> None:
        self.s = settings
        self.worker = worker
        self.decoder = Decoder(
            IntMarking(settings.int_dscp, settings.int_dscp_mask, frozenset(settings.int_udp_ports))
        )
        self.fabric = Fabric(settings, worker=worker, workers=workers)
        self.received = 0
        self.received_bytes = 0
        self.decoded = 0
        self.dropped: dict[str, int] = {}
        self._internal_logged: set[str] = set()
        self._stop = threading.Event()
        self.heartbeat = time.monotonic()
        self.sock = socket.socket(
            socket.AF_INET6 if ":" in settings.listen_host else socket.AF_INET, socket.SOCK_DGRAM
        )
        if reuse_port:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        with contextlib.suppress(OSError):  # capped by net.core.rmem_max; not fatal
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, settings.receive_buffer_bytes)
        self.sock.bind((settings.listen_host, settings.listen_port))
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self.writer = Writer(settings)
        self.http: ThreadingHTTPServer | None = None
        self.http_port: int | None = None

    # Receive loop ------------------------------------------------------------------------

    def handle(self, data: bytes | memoryview, now_ns: int) -> None:
        """Decode one datagram and fold it into state; never raises."""
        self.received += 1
        self.received_bytes += len(data)
        try:
            reports = self.decoder.decode(data)
            self.fabric.observe_datagram(reports, now_ns)
            self.decoded += len(reports)
        except DecodeError as e:
            self.dropped[e.reason] = self.dropped.get(e.reason, 0) + 1
        except Exception as e:  # a decoder or state bug must not stop the collector
            self.dropped["internal"] = self.dropped.get("internal", 0) + 1
            kind = type(e).__name__
            if kind not in self._internal_logged:
                self._internal_logged.add(kind)
                log.exception("internal error on a datagram (dropped, counted as 'internal')")

    def run(self) -> None:
        """Receive until `stop()`; then write what changed and flush the backlog."""
        sock = self.sock
        buf = bytearray(MAX_DATAGRAM)
        view = memoryview(buf)
        recv_into = sock.recv_into
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        tick_ns = int(self.s.tick_s * 1e9)
        next_tick = time.monotonic_ns() + tick_ns
        handle = self.handle
        clock = time.time_ns
        mono = time.monotonic_ns
        stop = self._stop
        while not stop.is_set():
            n_batch = 0
            now_ns = clock()
            try:
                while n_batch < 4096:
                    n = recv_into(buf)
                    handle(view[:n], now_ns)
                    n_batch += 1
                    if not n_batch & 255:
                        now_ns = clock()
            except BlockingIOError:
                pass
            except OSError as e:  # pragma: no cover - e.g. ICMP-induced errors on some stacks
                log.warning("receive error: %s", e)
            t = mono()
            self.heartbeat = t / 1e9
            if t >= next_tick:
                next_tick = t + tick_ns
                self.tick()
            if n_batch == 0:
                poller.poll(min(100, max(1, (next_tick - t) // 1_000_000)))
        self.tick(force=True)

    def tick(self, force: bool = False) -> None:
        try:
            self.writer.submit(self.fabric.due_points(force=force))
        except Exception:  # pragma: no cover - never lose the loop to a bookkeeping bug
            self.dropped["internal"] = self.dropped.get("internal", 0) + 1
            log.exception("tick failed")

    def stop(self) -> None:
        self._stop.set()

    def close(self, timeout_s: float = 10.0) -> None:
        self.writer.close(timeout_s)
        if self.http is not None:
            self.http.shutdown()
            self.http.server_close()
        self.sock.close()

    # Observability -----------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Every counter and gauge of this process, as plain data (sent to the supervisor)."""
        f, w = self.fabric, self.writer
        lost: dict[str, int] = {}
        for (node, _hw), tr in list(f.seq.items()):
            lost[str(node)] = lost.get(str(node), 0) + tr.lost
        return {
            "counters": {
                "datagrams_received": self.received,
                "bytes_received": self.received_bytes,
                "reports_decoded": self.decoded,
                "points_written": w.written,
                "points_dropped": w.dropped,
                "write_failures": w.failures,
                "hops_unattributed": f.hops_unattributed,
                "links_over_limit": f.links_full,
            },
            "dropped": {**self.decoder.skipped, **self.dropped},
            "lost": lost,
            "gauges": {"points_buffered": w.buffered, "links": len(f.links), "flows": len(f.flows)},
            "receiving": time.monotonic() - self.heartbeat < 2.0,
            "influxdb_up": w.healthy,
            "influxdb_error": w.last_error,
            "pid": os.getpid(),
        }

    def health(self) -> tuple[int, dict[str, Any]]:
        return health_of([self.snapshot()], self.s.buffer_points)

    def serve_http(self) -> int:
        """Start /metrics and /healthz on a thread; returns the port."""
        self.http = start_http(self.s, lambda: aggregate([self.snapshot()]), self.health)
        self.http_port = self.http.server_address[1]
        return self.http_port


# Totals across processes ---------------------------------------------------------------

COUNTER_HELP = {
    "datagrams_received": "UDP datagrams received",
    "bytes_received": "UDP payload bytes received",
    "reports_decoded": "Individual reports decoded",
    "points_written": "Points written to InfluxDB",
    "points_dropped": "Oldest points dropped because the backlog was full",
    "write_failures": "Failed InfluxDB write attempts",
    "hops_unattributed": "Hops without node ID or egress port",
    "links_over_limit": "Hops or switches not tracked: max_links reached",
}
GAUGE_HELP = {
    "points_buffered": "Points waiting for InfluxDB",
    "links": "Links tracked (summed over workers; a link seen by two workers counts twice)",
    "flows": "Flows tracked (LRU)",
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
        for name in ("hops_unattributed", "links_over_limit"):
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
) -> ThreadingHTTPServer:
    """/metrics and /healthz on a daemon thread."""
    registry = CollectorRegistry()
    registry.register(_Metrics(metrics))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                body, ctype, code = generate_latest(registry), CONTENT_TYPE_LATEST, 200
            elif path == "/healthz":
                code, doc = health()
                body, ctype = json.dumps(doc).encode() + b"\n", "application/json"
            else:
                body, ctype, code = b"not found: try /metrics or /healthz\n", "text/plain", 404
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
