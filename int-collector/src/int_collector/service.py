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
import select
import signal
import socket
import threading
import time
from collections.abc import Iterator
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

    def __init__(self, settings: Settings, *, reuse_port: bool = False) -> None:
        self.s = settings
        self.decoder = Decoder(
            IntMarking(settings.int_dscp, settings.int_dscp_mask, frozenset(settings.int_udp_ports))
        )
        self.fabric = Fabric(settings)
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
            for r in reports:
                self.fabric.observe(r, now_ns)
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

    def health(self) -> tuple[int, dict[str, Any]]:
        alive = time.monotonic() - self.heartbeat < 2.0
        w = self.writer
        body: dict[str, Any] = {
            "status": "ok" if alive and w.healthy else "degraded",
            "receiving": alive,
            "influxdb": "ok" if w.healthy else f"failing: {w.last_error}",
            "buffered_points": w.buffered,
            "buffer_limit": self.s.buffer_points,
            "links": len(self.fabric.links),
            "flows": len(self.fabric.flows),
        }
        return (200 if body["status"] == "ok" else 503), body

    def serve_http(self) -> int:
        """Start /metrics and /healthz on a thread; returns the port."""
        registry = CollectorRegistry()
        registry.register(_Metrics(self))
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    body, ctype, code = generate_latest(registry), CONTENT_TYPE_LATEST, 200
                elif path == "/healthz":
                    code, doc = collector.health()
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

        self.http = ThreadingHTTPServer((self.s.http_host, self.s.http_port), Handler)
        self.http.daemon_threads = True
        self.http_port = self.http.server_address[1]
        threading.Thread(target=self.http.serve_forever, name="http", daemon=True).start()
        return self.http_port


class _Metrics(PromCollector):
    """Reads the collector's plain counters at scrape time (no locking in the hot path)."""

    def __init__(self, c: Collector) -> None:
        self.c = c

    def collect(self) -> Iterator[Any]:
        c, f, w = self.c, self.c.fabric, self.c.writer
        p = "int_collector_"
        yield CounterMetricFamily(p + "datagrams_received", "UDP datagrams received", c.received)
        yield CounterMetricFamily(
            p + "bytes_received", "UDP payload bytes received", c.received_bytes
        )
        yield CounterMetricFamily(p + "reports_decoded", "Individual reports decoded", c.decoded)
        dropped = CounterMetricFamily(
            p + "reports_dropped", "Datagrams or reports dropped, by reason", labels=["reason"]
        )
        for reason, n in sorted({**c.decoder.skipped, **c.dropped}.items()):
            dropped.add_metric([reason], n)
        yield dropped
        lost = CounterMetricFamily(
            p + "reports_lost", "Reports missing by sequence number, per switch", labels=["switch"]
        )
        per_switch: dict[int, int] = {}
        for (node, _hw), tr in list(f.seq.items()):
            per_switch[node] = per_switch.get(node, 0) + tr.lost
        for node, n in sorted(per_switch.items()):
            lost.add_metric([str(node)], n)
        yield lost
        yield CounterMetricFamily(p + "points_written", "Points written to InfluxDB", w.written)
        yield GaugeMetricFamily(p + "points_buffered", "Points waiting for InfluxDB", w.buffered)
        yield CounterMetricFamily(
            p + "points_dropped", "Oldest points dropped because the backlog was full", w.dropped
        )
        yield CounterMetricFamily(
            p + "write_failures", "Failed InfluxDB write attempts", w.failures
        )
        yield GaugeMetricFamily(p + "influxdb_up", "1 if the last write succeeded", int(w.healthy))
        yield GaugeMetricFamily(p + "links", "Links tracked", len(f.links))
        yield GaugeMetricFamily(p + "flows", "Flows tracked (LRU)", len(f.flows))
        yield CounterMetricFamily(
            p + "hops_unattributed", "Hops without node ID or egress port", f.hops_unattributed
        )
        yield CounterMetricFamily(
            p + "links_over_limit", "Hops or switches not tracked: max_links reached", f.links_full
        )


def serve(settings: Settings) -> int:
    """Run until SIGTERM or SIGINT; flush; return an exit status."""
    c = Collector(settings, reuse_port=settings.workers > 1)
    port = c.serve_http()
    log.info(
        "listening on udp %s:%d, http %s:%d, writing to %s bucket %s",
        settings.listen_host, c.port, settings.http_host, port,
        settings.influx_url, settings.influx_bucket,
    )  # fmt: skip

    def _stop(signum: int, _frame: object) -> None:
        log.info("signal %d: flushing and stopping", signum)
        c.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        c.run()
    finally:
        c.close()
    log.info(
        "stopped: %d datagrams, %d reports, %d points written, %d still buffered, %d dropped",
        c.received, c.decoded, c.writer.written, c.writer.buffered, c.writer.dropped,
    )  # fmt: skip
    return 0 if c.writer.buffered == 0 else 1
