"""Writes points to InfluxDB in batches, through a bounded backlog that survives outages.

influxdb-client's batching `WriteApi` retries inside an unbounded reactive pipeline and
drops a batch once its retries are spent, so memory is not bounded while InfluxDB is away
and nothing says which points went. Here the batching is ours: points queue in a deque of
at most `buffer_points` line-protocol lines (when full, the oldest are dropped and
counted); one thread writes batches of `batch_size` through the client's synchronous write
API with explicit nanosecond precision; a failed batch stays at the head of the backlog and
is retried with exponential backoff (`retry_initial_s` doubling up to `retry_max_s`, with
jitter), so the backlog drains in order when InfluxDB is back. `close()` flushes.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Iterable

from influxdb_client import InfluxDBClient, WritePrecision
from influxdb_client.client.write_api import SYNCHRONOUS

from .settings import Settings
from .state import Point

log = logging.getLogger("int_collector.storage")

PRECISION = WritePrecision.NS


def _escape_key(s: str) -> str:
    return s.replace("\\", "\\\\").replace(",", r"\,").replace("=", r"\=").replace(" ", r"\ ")


def _field(v: float | int | str) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return f"{v}i"
    if isinstance(v, float):
        return repr(v)
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'


def line(p: Point) -> str:
    """Line protocol for one point (tags sorted, as InfluxDB prefers)."""
    tags = "".join(f",{_escape_key(k)}={_escape_key(v)}" for k, v in sorted(p.tags.items()))
    fields = ",".join(f"{_escape_key(k)}={_field(v)}" for k, v in p.fields.items())
    return f"{_escape_key(p.measurement)}{tags} {fields} {p.time_ns}"


class Writer:
    """The bounded backlog and its writing thread."""

    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self._q: deque[str] = deque()
        self._lock = threading.Condition()
        self._closing = False
        self.written = 0
        self.dropped = 0  # oldest points dropped because the backlog was full
        self.failures = 0  # failed write attempts
        self.last_error = ""
        self.healthy = True
        self.last_success = 0.0
        self._client = InfluxDBClient(
            url=settings.influx_url,
            token=settings.influx_token,
            org=settings.influx_org,
            timeout=int(settings.influx_timeout_s * 1000),
        )
        self._api = self._client.write_api(write_options=SYNCHRONOUS)
        self._thread = threading.Thread(target=self._run, name="influx-writer", daemon=True)
        self._thread.start()

    @property
    def buffered(self) -> int:
        return len(self._q)

    def submit(self, points: Iterable[Point]) -> None:
        lines = [line(p) for p in points]
        if not lines:
            return
        with self._lock:
            q = self._q
            q.extend(lines)
            over = len(q) - self.s.buffer_points
            if over > 0:
                for _ in range(over):
                    q.popleft()
                self.dropped += over
            if len(q) >= self.s.batch_size:
                self._lock.notify()

    def _take(self) -> list[str]:
        q = self._q
        n = min(len(q), self.s.batch_size)
        return [q[i] for i in range(n)]

    def _run(self) -> None:
        delay = self.s.retry_initial_s
        while True:
            with self._lock:
                if len(self._q) < self.s.batch_size and not self._closing:
                    self._lock.wait(self.s.flush_interval_s)
                if self._closing and not self._q:
                    return
                batch = self._take()
            if not batch:
                continue
            try:
                self._api.write(
                    bucket=self.s.influx_bucket,
                    org=self.s.influx_org,
                    record="\n".join(batch),
                    write_precision=PRECISION,
                )
            except Exception as e:  # any transport or HTTP error: keep the batch, back off
                self.failures += 1
                self.healthy = False
                self.last_error = _short(e)
                log.warning(
                    "InfluxDB write failed (%s); retrying in %.1f s", self.last_error, delay
                )
                with self._lock:
                    pause = delay * (0.8 + 0.4 * random.random())
                    if self._closing:
                        left = self._close_deadline - time.monotonic()
                        if left <= 0:
                            return
                        pause = min(pause, left)
                    self._lock.wait(pause)
                delay = min(delay * 2, self.s.retry_max_s)
                continue
            delay = self.s.retry_initial_s
            with self._lock:
                # Drop exactly what was written: if the backlog overflowed meanwhile, the
                # oldest lines (ours among them) are already gone.
                q = self._q
                n = len(batch)
                k = 0
                while k < n and q and q[0] is not batch[k]:
                    k += 1
                while k < n and q and q[0] is batch[k]:
                    q.popleft()
                    k += 1
                self.written += n
                self.healthy = True
                self.last_success = time.time()
                self.last_error = ""

    _close_deadline = float("inf")

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is buffered (up to `timeout_s` while InfluxDB fails), then stop."""
        with self._lock:
            self._closing = True
            self._close_deadline = time.monotonic() + timeout_s
            self._lock.notify_all()
        self._thread.join(timeout_s + self.s.influx_timeout_s + 1)
        self._client.close()


def _short(e: Exception) -> str:
    status = getattr(e, "status", None)
    if status:
        return f"HTTP {status}: {getattr(e, 'message', '') or str(e)[:200]}"
    return f"{type(e).__name__}: {str(e)[:200]}"
