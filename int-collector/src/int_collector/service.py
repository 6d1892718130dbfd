"""The collector: UDP receive loop, derived state, periodic change-driven writes, HTTP.

The receive loop reads a non-blocking socket until it is empty and only then waits in
`poll`, so a busy collector spends no system call per datagram beyond the `recv` itself.
Nothing a datagram contains can end the loop: `DecodeError` is counted by reason, and any
other exception is counted as `internal` with the datagram dropped (and logged once per
kind), since a collector that dies on a packet loses everything after it.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from .endpoints import aggregate, health_of, readiness_of, start_http
from .listen import set_receive_buffer
from .settings import Settings
from .state import Fabric, Rejected
from .storage import Writer
from .wire import DecodeError, Decoder, IntMarking

if TYPE_CHECKING:
    from http.server import ThreadingHTTPServer

__all__ = ["Collector", "aggregate", "health_of", "readiness_of", "start_http"]

log = logging.getLogger("int_collector")

MAX_DATAGRAM = 65535


# On stop, datagrams already queued in the socket are read for at most this long.
DRAIN_NS = 2_000_000_000


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
        # Every series has one writer: with several collectors (or workers) on one bucket,
        # a link crossed by flows to sinks of several writers gets a series from each, and
        # the service merges them (docs/collector.md, "Several collectors").
        cid = settings.collector_id
        self.collector_tag = cid if workers == 1 or not cid else f"{cid}/{worker}"
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
                    # Alive per batch, not per 8192 datagrams: a busy worker on the slow
                    # path read as not receiving (503) for seconds (issue 29).
                    self.heartbeat = mono() / 1e9
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
        # Stopped: what the socket already holds was sent to us; read it before closing
        # (SIGTERM dropped 7-9 thousand queued datagrams, uncounted). Bounded, as a sender
        # that goes on would keep it from emptying.
        deadline = mono() + DRAIN_NS
        while mono() < deadline:
            try:
                n = rx.recv()
            except OSError:
                break
            if not n:
                break
            ingest(bufs, lens, n, clock(), handle)

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
                        self.heartbeat = mono() / 1e9
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
        deadline = mono() + DRAIN_NS  # as in _run_compiled
        try:
            while mono() < deadline:
                n = recv_into(buf)
                handle(view[:n], clock())
        except OSError:  # BlockingIOError: empty
            pass

    def tick(self, force: bool = False) -> None:
        try:
            points = self.fabric.due_points(force=force)
            if self.collector_tag:
                for p in points:
                    p.tags["collector"] = self.collector_tag
            self.writer.submit(points)
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
                "flows_evicted": f.flows_evicted,
                "flows_evicted_unwritten": f.flows_evicted_unwritten,
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
