"""The collector: UDP receive loop, derived state, periodic change-driven writes, HTTP.

The receive loop reads a non-blocking socket until it is empty and only then waits in
`poll`, so a busy collector spends no system call per datagram beyond the `recv` itself.
Nothing a datagram contains can end the loop: `DecodeError` is counted by reason, and any
other exception is counted as `internal` with the datagram dropped (and logged once per
kind), since a collector that dies on a packet loses everything after it.
"""

from __future__ import annotations

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

from .listen import set_receive_buffer
from .settings import Settings
from .state import Fabric, Rejected
from .storage import Writer
from .wire import DecodeError, Decoder, IntMarking

log = logging.getLogger("int_collector")

MAX_DATAGRAM = 65535


class Collector:
    """One receiving process: socket, decoder, fabric state, writer, HTTP endpoint."""

    def __init__(
        self,
        settings: Settings,
        *,
        reuse_port: bool = False,
        worker: int = 0,
        workers: int = 1,
        sock: socket.socket | None = None,
    ) -> None:
        self.s = settings
        self.worker = worker
        self.decoder = Decoder(
            IntMarking(
                settings.int_dscp, settings.int_dscp_mask, frozenset(settings.int_udp_ports)
            ),
            source_only=settings.source_only_metadata,
        )
        self.fast = None
        if settings.fast_path:
            from . import fast  # numba: compiled once, then loaded from its cache

            fast.warm()
            self.fast = fast
            self.fabric: Fabric | fast.FastFabric = fast.FastFabric(
                settings, worker=worker, workers=workers
            )
        else:
            self.fabric = Fabric(settings, worker=worker, workers=workers)
        # Datagrams the Python path handled (all of them without the compiled path).
        self._received = 0
        self._received_bytes = 0
        self._decoded = 0
        self._dropped: dict[str, int] = {}
        self._internal_logged: set[str] = set()
        self._stop = threading.Event()
        self.heartbeat = -1e9  # receive loop not running yet
        if sock is None:  # a socket of its own (tests, embedding); `serve` passes one bound
            sock = socket.socket(
                socket.AF_INET6 if ":" in settings.listen_host else socket.AF_INET,
                socket.SOCK_DGRAM,
            )
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            set_receive_buffer(sock, settings.receive_buffer_bytes)
            sock.bind((settings.listen_host, settings.listen_port))
        self.sock = sock
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self.writer = Writer(settings)
        self.http: ThreadingHTTPServer | None = None
        self.http_port: int | None = None

    # Counters: the Python path's plus the compiled path's --------------------------------

    def _compiled(self, col: int) -> int:
        return int(self.fabric.c[col]) if self.fast is not None else 0  # type: ignore[union-attr]

    @property
    def received(self) -> int:
        return self._received + self._compiled(self.fast.C_DATAGRAMS if self.fast else 0)

    @property
    def received_bytes(self) -> int:
        return self._received_bytes + self._compiled(self.fast.C_BYTES if self.fast else 0)

    @property
    def decoded(self) -> int:
        return self._decoded + self._compiled(self.fast.C_DECODED if self.fast else 0)

    @property
    def dropped(self) -> dict[str, int]:
        out = dict(self._dropped)
        rejected = self._compiled(self.fast.C_REJECTED) if self.fast else 0
        if rejected:
            out["switch_not_allowed"] = out.get("switch_not_allowed", 0) + rejected
        return out

    # Receive loop ------------------------------------------------------------------------

    def handle(self, data: bytes | memoryview, now_ns: int) -> None:
        """Decode one datagram with the Python decoder and fold it into state; never
        raises."""
        self._received += 1
        self._received_bytes += len(data)
        try:
            reports = self.decoder.decode(data)
            self.fabric.observe_datagram(reports, now_ns)
            self._decoded += len(reports)
        except (DecodeError, Rejected) as e:
            self._dropped[e.reason] = self._dropped.get(e.reason, 0) + 1
        except Exception as e:  # a decoder or state bug must not stop the collector
            self._dropped["internal"] = self._dropped.get("internal", 0) + 1
            kind = type(e).__name__
            if kind not in self._internal_logged:
                self._internal_logged.add(kind)
                log.exception("internal error on a datagram (dropped, counted as 'internal')")

    def run(self) -> None:
        """Receive until `stop()`; then write what changed and flush the backlog."""
        if self.fast is not None:
            self._run_compiled()
        else:
            self._run_python()
        self.tick(force=True)

    def _run_compiled(self) -> None:
        """recvmmsg batches, decoded and folded by compiled code in arrival order; what it
        does not take (other shapes, anything odd) goes through `handle`."""
        assert self.fast is not None
        rx = self.fast.Receiver(self.sock)
        ingest = self.fabric.ingest  # type: ignore[union-attr]
        handle = self.handle
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        tick_ns = int(self.s.tick_s * 1e9)
        next_tick = time.monotonic_ns() + tick_ns
        clock = time.time_ns
        mono = time.monotonic_ns
        stop = self._stop
        bufs, lens = rx.bufs, rx.lens
        while not stop.is_set():
            got = 0
            try:
                while got < 8192:
                    n = rx.recv()
                    if not n:
                        break
                    ingest(bufs, lens, n, clock(), handle)
                    got += n
            except OSError as e:  # pragma: no cover
                log.warning("receive error: %s", e)
            except Exception:  # pragma: no cover - never lose the loop to a bug
                self._dropped["internal"] = self._dropped.get("internal", 0) + 1
                log.exception("internal error in a batch (counted as 'internal')")
            t = mono()
            self.heartbeat = t / 1e9
            if t >= next_tick:
                next_tick = t + tick_ns
                self.tick()
            if got == 0:
                poller.poll(min(100, max(1, (next_tick - t) // 1_000_000)))

    def _run_python(self) -> None:
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

    def tick(self, force: bool = False) -> None:
        try:
            self.writer.submit(self.fabric.due_points(force=force))
        except Exception:  # pragma: no cover - never lose the loop to a bookkeeping bug
            self._dropped["internal"] = self._dropped.get("internal", 0) + 1
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
        lost = f.lost_per_switch()
        sizes = f.counts()
        return {
            "counters": {
                "datagrams_received": self.received,
                "bytes_received": self.received_bytes,
                "reports_decoded": self.decoded,
                "points_written": w.written,
                "points_dropped": w.dropped,
                "write_failures": w.failures,
                "hops_unattributed": f.hops_unattributed,
                "hops_implausible": f.hops_implausible,
                "links_over_limit": f.links_full,
            },
            "dropped": {**self.decoder.skipped, **self.dropped},
            "lost": lost,
            "gauges": {"points_buffered": w.buffered, **sizes},
            "receiving": time.monotonic() - self.heartbeat < 2.0,
            "influxdb_up": w.healthy,
            "influxdb_error": w.last_error,
            "pid": os.getpid(),
        }

    def health(self) -> tuple[int, dict[str, Any]]:
        return health_of([self.snapshot()], self.s.buffer_points)

    def readiness(self) -> tuple[int, dict[str, Any]]:
        return readiness_of([self.snapshot()])

    def serve_http(self) -> int:
        """Start /metrics, /healthz and /readyz on a thread; returns the port."""
        self.http = start_http(
            self.s, lambda: aggregate([self.snapshot()]), self.health, self.readiness
        )
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
    "hops_unattributed": "Hops attributed to no link: no node ID or egress port, only "
    "domain-specific metadata, or ONOS's sink hop on the report's mirror port",
    "hops_implausible": "Hops not kept: node not in allowed_switches, or a link that "
    "link_min_reports distinct datagrams never confirmed",
    "links_over_limit": "Hops or switches not tracked: max_links reached",
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
        for name in ("hops_unattributed", "hops_implausible", "links_over_limit"):
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
