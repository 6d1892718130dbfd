"""Writes points to InfluxDB in batches, through a bounded backlog that survives outages.

influxdb-client's batching `WriteApi` retries inside an unbounded reactive pipeline and
drops a batch once its retries are spent, so memory is not bounded while InfluxDB is away
and nothing says which points went. Here the batching is ours: points queue in a deque of
at most `buffer_points` line-protocol lines (when full, the oldest are dropped and
counted); one thread writes batches of `batch_size` through the client's synchronous write
API with explicit nanosecond precision; a failed batch stays at the head of the backlog and
is retried with exponential backoff (`retry_initial_s` doubling up to `retry_max_s`, with
jitter), so the backlog drains in order when InfluxDB is back. Nothing shortens a backoff
wait but `close()`, which flushes. An outage is logged once when it starts and once, with
a summary, when writes succeed again.
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
        s = self.s
        delay = s.retry_initial_s
        retry_at = 0.0  # monotonic: no attempt before this while backing off
        outage: dict[str, float] | None = None  # while writes fail: when, how many, drops
        while True:
            with self._lock:
                while True:
                    now = time.monotonic()
                    if self._closing and (not self._q or now >= self._close_deadline):
                        return
                    if self._retry_now:  # close(): one attempt at once, then the schedule
                        self._retry_now = False
                        retry_at = 0.0
                    if now < retry_at:
                        # Backing off: new points (submit's notify) do not cut the wait short.
                        self._lock.wait(min(retry_at, self._close_deadline) - now)
                        continue
                    if len(self._q) < s.batch_size and not self._closing:
                        self._lock.wait(s.flush_interval_s)
                    break
                batch = self._take()
            if not batch:
                continue
            try:
                self._api.write(
                    bucket=s.influx_bucket,
                    org=s.influx_org,
                    record="\n".join(batch),
                    write_precision=PRECISION,
                )
            except Exception as e:  # any transport or HTTP error: keep the batch, back off
                self.failures += 1
                self.healthy = False
                self.last_error = _short(e)
                pause = delay * (0.8 + 0.4 * random.random())
                retry_at = time.monotonic() + pause
                if outage is None:
                    outage = {"since": time.monotonic(), "failures": 0, "dropped": self.dropped}
                    log.warning(
                        "InfluxDB write failed (%s): keeping up to %d points and retrying "
                        "after %.1f s, the wait doubling up to %.0f s (±20%%); a summary "
                        "follows when writes succeed again",
                        self.last_error, s.buffer_points, delay, s.retry_max_s,
                    )  # fmt: skip
                else:
                    log.debug("InfluxDB write failed again (%s)", self.last_error)
                outage["failures"] += 1
                delay = min(delay * 2, s.retry_max_s)
                continue
            delay = s.retry_initial_s
            retry_at = 0.0
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
                left = len(q)
            if outage is not None:
                log.warning(
                    "InfluxDB writes succeed again after %.1f s: %d failed attempts, %d "
                    "points dropped meanwhile (backlog full), %d still to write",
                    time.monotonic() - outage["since"], outage["failures"],
                    self.dropped - outage["dropped"], left,
                )  # fmt: skip
                outage = None

    _close_deadline = float("inf")
    _retry_now = False

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is buffered (up to `timeout_s` while InfluxDB fails: one attempt at
        once, then on the backoff schedule), then stop."""
        with self._lock:
            self._closing = True
            self._retry_now = True
            self._close_deadline = time.monotonic() + timeout_s
            self._lock.notify_all()
        self._thread.join(timeout_s + self.s.influx_timeout_s + 1)
        self._client.close()


def _short(e: Exception) -> str:
    status = getattr(e, "status", None)
    if status:
        return f"HTTP {status}: {getattr(e, 'message', '') or str(e)[:200]}"
    return f"{type(e).__name__}: {str(e)[:200]}"
