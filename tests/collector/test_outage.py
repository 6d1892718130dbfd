"""InfluxDB stops mid-stream and comes back: the backlog arrives, bounded and in order."""

from __future__ import annotations

import logging
import time

import pytest

from int_collector.generator import generate
from int_collector.influxd import InfluxServer

from .conftest import Db, Running, settings_for
from .test_end_to_end import wait_for


def _stream(port: int, seconds: float, seed: int) -> int:
    return generate(("127.0.0.1", port), rate=5000, switches=6, duration_s=seconds, seed=seed)


def _points(server: InfluxServer) -> int:
    db = Db(server, server.bucket)
    # Every point has exactly one of these fields (docs/telemetry-schema.md).
    one_per_point = 'r._field == "samples" or r._field == "hops" or r._field == "received"'
    rows = db.flux(f"|> filter(fn: (r) => {one_per_point}) |> count()")
    return int(sum(x["_value"] for x in rows))


def test_outage_backlog_is_written_on_recovery(
    fresh_server: InfluxServer, running: list[Running]
) -> None:
    settings = settings_for(
        fresh_server, tick_s=0.05, retry_initial_s=0.1, retry_max_s=0.5, influx_timeout_s=2.0
    )
    r = Running(settings)
    running.append(r)
    _stream(r.c.port, 1.0, seed=1)
    wait_for(lambda: r.c.writer.written > 0 and r.c.writer.buffered == 0, what="first writes")
    before_outage = r.c.writer.written

    fresh_server.stop()
    _stream(r.c.port, 2.0, seed=2)  # InfluxDB is down throughout
    wait_for(lambda: r.c.writer.failures > 0, what="failed writes")
    backlog = r.c.writer.buffered
    assert backlog > 100 and r.c.writer.dropped == 0

    fresh_server.start()  # same port, same data directory
    wait_for(lambda: r.c.writer.buffered == 0, timeout=300, what="backlog drained")
    r.stop()
    w = r.c.writer
    assert w.dropped == 0 and w.written >= before_outage + backlog
    assert _points(fresh_server) == w.written  # every point arrived, none twice


def test_full_backlog_drops_oldest_and_counts(
    fresh_server: InfluxServer, running: list[Running]
) -> None:
    settings = settings_for(
        fresh_server, tick_s=0.05, buffer_points=300, retry_initial_s=0.1, retry_max_s=0.3,
        influx_timeout_s=2.0,
    )  # fmt: skip
    r = Running(settings)
    running.append(r)
    fresh_server.stop()
    _stream(r.c.port, 2.0, seed=3)
    wait_for(lambda: r.c.writer.dropped > 0, what="drops")
    assert r.c.writer.buffered <= 300
    newest_before = r.c.writer._q[-1]
    fresh_server.start()
    wait_for(lambda: r.c.writer.buffered == 0, timeout=300, what="backlog drained")
    r.stop()
    w = r.c.writer
    assert w.written == _points(fresh_server)  # what was kept arrived
    assert w.dropped > 0
    # The newest point from the outage is among those written (the oldest were dropped).
    ts = int(newest_before.rsplit(" ", 1)[1])
    rows = Db(fresh_server, fresh_server.bucket).flux(
        f"|> filter(fn: (r) => uint(v: r._time) == uint(v: {ts}))"
    )
    assert rows, "newest backlog point missing"


def test_outage_retries_on_the_announced_schedule_and_logs_once(
    fresh_server: InfluxServer, running: list[Running], caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 15.3: with the backlog past `batch_size` every tick used to wake the writer and
    it retried at once (85 failed writes and 85 warnings in 21 s). Now the attempts follow
    the backoff it announces (here a fixed 0.4 s ±20%), the outage is logged once when it
    starts, and once with a summary when writes succeed again."""
    caplog.set_level(logging.WARNING, logger="int_collector.storage")
    settings = settings_for(
        fresh_server, tick_s=0.05, batch_size=1, retry_initial_s=0.4, retry_max_s=0.4,
        influx_timeout_s=2.0,
    )  # fmt: skip
    r = Running(settings)
    running.append(r)
    _stream(r.c.port, 0.5, seed=4)
    wait_for(lambda: r.c.writer.written > 0 and r.c.writer.buffered == 0, what="first writes")
    fresh_server.stop()
    t0 = time.monotonic()
    _stream(r.c.port, 3.0, seed=5)  # every tick submits points: > batch_size each time
    wait_for(lambda: r.c.writer.failures > 0, what="failed writes")
    failures, elapsed = r.c.writer.failures, time.monotonic() - t0
    # Attempts at least 0.32 s apart: one at the start of the outage, then one per wait.
    assert 1 <= failures <= elapsed / 0.32 + 1, (failures, elapsed)
    fresh_server.start()
    wait_for(lambda: r.c.writer.buffered == 0, timeout=300, what="backlog drained")
    r.stop()
    assert r.c.writer.dropped == 0
    msgs = [x.getMessage() for x in caplog.records if x.name == "int_collector.storage"]
    assert len(msgs) == 2, msgs
    assert "retrying after 0.4 s" in msgs[0]
    assert "succeed again" in msgs[1] and f"{r.c.writer.failures} failed attempts" in msgs[1]
