"""`serve`: several receiving processes on one UDP port, supervised.

The parent binds `workers` sockets to the listen port with SO_REUSEPORT (listen.py, before
anything slow is loaded) and starts `workers` processes, worker k reading socket k; the
kernel hashes every datagram's (source address, source port, destination address,
destination port) to one of the sockets, so all reports of one switch (one source address
and port) reach the same process and its link state and sequence-loss tracking stay
whole. Each worker is a complete `Collector` (decoder, state, its own InfluxDB writer
with a backlog of `buffer_points / workers`, so the service as a whole holds at most
`buffer_points`). Workers send a snapshot of their counters to the parent over a pipe every
`SNAPSHOT_S`; the parent serves `/metrics` (totals over workers, plus the counters of
workers that have exited), `/healthz` (every worker alive, receiving and writing) and
`/readyz` (every worker's receive loop runs).

Workers are forked from a fork server that loaded the compiled receive path once
(`int_collector.preload`: numba's cache, which `int-collector compile` fills at install), so
a worker starts in milliseconds and a restarted one receives again at once; the parent has
threads (HTTP), so it never forks itself. Until every worker reads its socket `/healthz`
and `/readyz` answer 503 with `status: starting` and what the start waits for.

A worker that exits without being asked to is restarted on the same socket, and counted;
more than `worker_restart_limit` restarts within a minute stop the service. SIGTERM or SIGINT to the
parent is passed to every worker, each writes what changed and flushes its backlog, and the
parent exits 0 only if every worker did.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import signal
import socket
import threading
import time
from collections import deque
from multiprocessing.connection import Connection, wait
from typing import Any

from .endpoints import aggregate, health_of, readiness_of, start_http
from .listen import bind_udp
from .settings import Settings, StartError

log = logging.getLogger("int_collector")

SNAPSHOT_S = 0.25
RESTART_WINDOW_S = 60.0
PROGRESS_S = 10.0  # how often a slow start says what it waits for
# An orphaned worker (its parent gone, InfluxDB most likely too) writes for this long at most.
ORPHAN_FLUSH_S = 2.0


def _context(fast_path: bool) -> Any:
    """Workers fork from a server process that imported (and, with the compiled path,
    loaded) everything once; the parent itself has threads, so it never forks."""
    ctx = mp.get_context("forkserver")
    receive = "int_collector.preload" if fast_path else "int_collector.service"
    ctx.set_forkserver_preload(["int_collector.forkserver_init", receive])
    return ctx


def prestart(settings: Settings) -> None:
    """Start the fork server now, so that it loads the receive path while this process
    imports the rest and binds HTTP (two cores: both at once)."""
    from multiprocessing import forkserver

    _context(settings.fast_path)
    forkserver.ensure_running()


class _StoppedWhileStarting(Exception):
    """SIGTERM or SIGINT arrived before every worker was up."""


def _forkserver_pid() -> int | None:
    from multiprocessing import forkserver

    return getattr(forkserver._forkserver, "_forkserver_pid", None)


def _worker_main(
    settings: Settings,
    index: int,
    workers: int,
    conn: Connection,
    log_level: int,
    sock: socket.socket,
) -> None:
    """One receiving process (the target of a spawned child), reading the socket the
    supervisor bound for it (its datagrams have been waiting there meanwhile)."""
    logging.basicConfig(
        level=log_level,
        format=f"%(asctime)s %(levelname)s [worker {index}] %(message)s",
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the parent, which stops us
    from .service import Collector  # loaded by the fork server already

    parent = os.getppid()
    c = Collector(settings, worker=index, workers=workers, sock=sock)
    signal.signal(signal.SIGTERM, lambda _s, _f: c.stop())
    # Blocked since the fork (forkserver_init): one that came meanwhile is delivered now.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    lock = threading.Lock()

    def report(final: bool = False) -> bool:
        try:
            snap = c.snapshot()
        except Exception:  # a bookkeeping bug must not stop the reports (nor the checks)
            log.exception("snapshot failed")
            return True
        snap["final"] = final
        try:
            with lock:
                conn.send(snap)
        except OSError:
            return False
        return True

    orphaned = threading.Event()

    def reporter() -> None:
        while not c._stop.wait(SNAPSHOT_S):
            if os.getppid() != parent or not report():  # the parent is gone: stop
                orphaned.set()
                c.stop()

    conn.send({"ready": c.port, "pid": os.getpid()})
    threading.Thread(target=reporter, name="snapshots", daemon=True).start()
    try:
        c.run()
    finally:
        c.close(ORPHAN_FLUSH_S if orphaned.is_set() else 10.0)
        report(final=True)
        conn.close()
    raise SystemExit(0 if c.writer.buffered == 0 else 1)


class _Worker:
    def __init__(self, index: int) -> None:
        self.index = index
        self.proc: Any = None
        self.conn: Connection | None = None
        self.snap: dict[str, Any] | None = None
        self.ready = False


class Supervisor:
    """Starts, watches and stops the receiving processes; serves the totals over HTTP."""

    def __init__(self, settings: Settings, socks: list[socket.socket] | None = None) -> None:
        self.s = settings
        n = settings.workers
        self.n = n
        # Each worker's backlog is a share of the bound, so the service holds at most it.
        per_worker = max(1, settings.buffer_points // n)
        self.worker_settings = settings.model_copy(update={"buffer_points": per_worker})
        self.workers = [_Worker(i) for i in range(n)]
        self.retired: dict[str, Any] = {"counters": {}, "dropped": {}, "lost": {}}
        self.restarts = 0
        self._recent: deque[float] = deque()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.failed = ""
        # What a start waits for, from the first answer of /healthz on (the sockets are
        # bound before it answers, and `prestart` started the fork server already).
        self.phase = (
            "the fork server to load the compiled receive path (numba's cache; compiled "
            "now if `int-collector compile` has not run since install)"
            if settings.fast_path
            else "the fork server to import the collector"
        )
        self._ctx = _context(settings.fast_path)
        # One socket per worker, bound before anything else (listen.py): a bad address or
        # a port held by another program fails now with one line, port 0 gets its number,
        # and reports wait in the sockets while the workers start. Held until shutdown.
        self.socks = socks if socks is not None else bind_udp(settings, n)
        if len(self.socks) != n:
            raise ValueError(f"{len(self.socks)} sockets for {n} workers")
        self.port = self.socks[0].getsockname()[1]
        self.worker_settings = self.worker_settings.model_copy(update={"listen_port": self.port})
        try:
            self.http = start_http(settings, self.metrics, self.health, self.readiness)
        except OSError as e:
            self._close_sockets()
            where = f"{settings.http_host}:{settings.http_port}"
            raise StartError(f"http: cannot bind tcp {where} ({e.strerror or e})") from None
        self.http_port = self.http.server_address[1]

    def _close_sockets(self) -> None:
        for sk in self.socks:
            sk.close()

    # Totals -----------------------------------------------------------------------------

    def metrics(self) -> dict[str, Any]:
        with self._lock:
            live = [w.snap for w in self.workers if w.snap is not None]
            retired = {**self.retired, "worker_restarts": self.restarts}
            return aggregate(live, retired)

    def _live_snaps(self) -> list[dict[str, Any] | None]:
        now = time.monotonic()
        with self._lock:
            snaps = [
                w.snap if w.proc is not None and w.proc.is_alive() else None for w in self.workers
            ]
        # A worker whose snapshots stopped (hung) is not receiving, whatever it last said.
        return [
            {**x, "receiving": False} if x and now - x["received_at"] > 2.0 else x for x in snaps
        ]

    def _starting(self, code: int, body: dict[str, Any]) -> dict[str, Any]:
        if code != 200 and self.phase != "running":
            body["status"] = "starting"
            body["waiting_for"] = self.phase
        return body

    def readiness(self) -> tuple[int, dict[str, Any]]:
        code, body = readiness_of(self._live_snaps())
        return code, self._starting(code, body)

    def health(self) -> tuple[int, dict[str, Any]]:
        code, body = health_of(self._live_snaps(), self.s.buffer_points)
        body["worker_restarts"] = self.restarts
        return code, self._starting(code, body)

    # Lifecycle --------------------------------------------------------------------------

    def _spawn(self, w: _Worker) -> None:
        ours, theirs = self._ctx.Pipe(duplex=False)
        level = logging.getLogger().level
        sock = self.socks[w.index]
        proc = self._ctx.Process(
            target=_worker_main,
            args=(self.worker_settings, w.index, self.n, theirs, level, sock),
            name=f"int-collector-worker-{w.index}",
            daemon=False,
        )
        proc.start()
        theirs.close()
        w.proc, w.conn, w.ready = proc, ours, False

    def _retire(self, w: _Worker) -> None:
        """Fold a finished worker's last counters into the totals that outlive it."""
        if w.conn is not None:
            with contextlib.suppress(EOFError, OSError):
                while w.conn.poll():
                    self._receive(w)
            w.conn.close()
        with self._lock:
            if w.snap is not None:
                left = w.snap["gauges"]["points_buffered"]
                if left:
                    log.warning("worker %d exited with %d points not written", w.index, left)
                r = self.retired
                for key in ("counters", "dropped", "lost"):
                    for k, v in w.snap[key].items():
                        r[key][k] = r[key].get(k, 0) + v
            w.snap, w.conn = None, None

    def _receive(self, w: _Worker) -> None:
        assert w.conn is not None
        msg = w.conn.recv()
        if "ready" in msg:
            w.ready = True
            return
        if "error" in msg:
            self.failed = f"worker {w.index}: {msg['error']}"
            return
        msg["received_at"] = time.monotonic()
        with self._lock:
            w.snap = msg

    def start(self, timeout_s: float | None = None) -> None:
        """Start every worker and wait until each reads its socket, saying every
        `PROGRESS_S` what it waits for; give up after `timeout_s` (`start_timeout_s`)."""
        timeout_s = self.s.start_timeout_s if timeout_s is None else timeout_s
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        # The first fork waits for the server's preload: off this thread, so the deadline
        # and the progress lines keep running.
        spawned = threading.Event()
        errors: list[BaseException] = []

        def spawn_all() -> None:
            try:
                for w in self.workers:
                    self._spawn(w)
            except BaseException as e:  # reported below, on the main thread
                errors.append(e)
            spawned.set()

        threading.Thread(target=spawn_all, name="spawn-workers", daemon=True).start()
        said = t0
        while not (spawned.is_set() and all(w.ready for w in self.workers)):
            if self._stop.is_set():
                self._kill_forkserver()
                raise _StoppedWhileStarting
            if errors:
                raise RuntimeError(f"starting the workers: {errors[0]!r}")
            if spawned.is_set():
                self.phase = "the workers' receive loops"
                for w in self.workers:
                    if not w.ready and w.proc is not None and not w.proc.is_alive():
                        self._pump(0)
                        raise RuntimeError(
                            self.failed
                            or f"worker {w.index} exited with status {w.proc.exitcode} "
                            "while starting"
                        )
            now = time.monotonic()
            if now > deadline:
                self._kill_forkserver()
                raise RuntimeError(
                    f"not receiving within {timeout_s:.0f} s (start_timeout_s), still "
                    f"waiting for {self.phase}"
                )
            if now - said >= PROGRESS_S:
                said = now
                log.info("starting for %.0f s: waiting for %s", now - t0, self.phase)
            if spawned.is_set():
                self._pump(0.1)
            else:
                spawned.wait(0.1)
        self.phase = "running"
        log.info("%d worker(s) receiving after %.1f s", self.n, time.monotonic() - t0)

    def _kill_forkserver(self) -> None:
        pid = _forkserver_pid()
        if pid:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def _pump(self, timeout: float) -> None:
        conns = {w.conn: w for w in self.workers if w.conn is not None}
        for conn in wait(list(conns), timeout):
            w = conns[conn]  # type: ignore[index]
            try:
                self._receive(w)
            except (EOFError, OSError):
                if w.conn is not None:
                    w.conn.close()
                w.conn = None

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> int:
        """Watch the workers until `stop()`; then stop them, let them flush, return status."""
        while not self._stop.is_set():
            self._pump(0.2)
            for w in self.workers:
                if w.proc is not None and not w.proc.is_alive() and not self._stop.is_set():
                    self._restart(w)
                    if self.failed:
                        self._stop.set()
                        break
        return self._shutdown()

    def _restart(self, w: _Worker) -> None:
        code = w.proc.exitcode if w.proc is not None else None
        self._retire(w)
        now = time.monotonic()
        self._recent.append(now)
        while self._recent and now - self._recent[0] > RESTART_WINDOW_S:
            self._recent.popleft()
        if len(self._recent) > self.s.worker_restart_limit:
            self.failed = (
                f"worker {w.index} exited (status {code}); more than "
                f"{self.s.worker_restart_limit} restarts within {RESTART_WINDOW_S:.0f} s: "
                "stopping"
            )
            log.error("%s", self.failed)
            return
        self.restarts += 1
        log.warning("worker %d exited (status %s); restarting it", w.index, code)
        self._spawn(w)

    def _shutdown(self) -> int:
        for w in self.workers:
            if w.proc is not None and w.proc.is_alive():
                with contextlib.suppress(OSError):
                    os.kill(w.proc.pid, signal.SIGTERM)
        # A worker flushes for up to 10 s while InfluxDB fails, plus one write timeout.
        deadline = time.monotonic() + 12 + self.s.influx_timeout_s
        while any(w.proc is not None and w.proc.is_alive() for w in self.workers):
            if time.monotonic() > deadline:
                break
            self._pump(0.1)
        status = 1 if self.failed else 0
        for w in self.workers:
            if w.proc is None:
                continue
            if w.proc.is_alive():
                log.error("worker %d did not stop in time; killing it", w.index)
                w.proc.kill()
                w.proc.join(5)
                status = 1
            elif w.proc.exitcode != 0:
                log.error("worker %d exited with status %s", w.index, w.proc.exitcode)
                status = 1
            w.proc.join(1)
            self._retire(w)
        self.http.shutdown()
        self.http.server_close()
        self._close_sockets()
        c = self.metrics()["counters"]
        log.info(
            "stopped: %d datagrams, %d reports, %d points written, %d dropped, "
            "%d worker restarts",
            c["datagrams_received"], c["reports_decoded"], c["points_written"],
            c["points_dropped"], self.restarts,
        )  # fmt: skip
        return status


def serve(settings: Settings, socks: list[socket.socket] | None = None) -> int:
    """Run until SIGTERM or SIGINT; flush every worker; return an exit status. `socks`: the
    workers' sockets, if the caller bound them already (the CLI does, first thing)."""
    sup = Supervisor(settings, socks)  # StartError: the CLI prints it as one line

    def _stop(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping the workers (each flushes)", signum)
        sup.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        sup.start()
    except _StoppedWhileStarting:
        log.info("stopped while starting")
        sup._shutdown()
        return 0
    except RuntimeError as e:
        sup.stop()
        sup._shutdown()
        raise StartError(str(e)) from None
    log.info(
        "listening on udp %s:%d with %d worker(s), http %s:%d, writing to %s bucket %s",
        settings.listen_host, sup.port, sup.n, settings.http_host, sup.http_port,
        settings.influx_url, settings.influx_bucket,
    )  # fmt: skip
    return sup.run()
