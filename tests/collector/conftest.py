"""Fixtures on the shared InfluxDB 1.8.10 (`influx`, `fresh_server`: tests/conftest.py)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from influxdb_client import InfluxDBClient

from int_collector.influxd import InfluxServer
from int_collector.service import Collector
from int_collector.settings import Settings, load_settings


@pytest.fixture(scope="session", autouse=True)
def _compiled_receive_path() -> None:
    """Compile the numba receive path (or load it from numba's cache) once, before any
    test times a collector's start."""
    from int_collector import fast

    fast.warm()


@dataclass
class Db:
    server: InfluxServer
    bucket: str

    def flux(self, body: str) -> list[dict]:
        """Run `from(bucket) |> range(start: 0) |> body` through influxdb-client's Flux path."""
        q = f'from(bucket: "{self.bucket}") |> range(start: 0) {body}'
        with InfluxDBClient(url=self.server.url, token="", org="-", timeout=20_000) as c:
            tables = c.query_api().query(q, org="-")
        return [rec.values for t in tables for rec in t.records]


@pytest.fixture
def db(influx: InfluxServer) -> Db:
    name = "t" + uuid.uuid4().hex[:12]
    influx.query_v1(f'CREATE DATABASE "{name}"')
    return Db(influx, f"{name}/autogen")


def settings_for(db_or_server: Db | InfluxServer | None, **kw: object) -> Settings:
    # link_min_reports=1: most tests look at what one report makes; the plausibility tests
    # (test_plausibility.py) and the CLI tests run with the default.
    base: dict[str, object] = dict(
        listen_host="127.0.0.1", listen_port=0, http_port=0, flush_interval_s=0.1, tick_s=0.05,
        link_min_reports=1,
    )  # fmt: skip
    if isinstance(db_or_server, Db):
        base.update(influx_url=db_or_server.server.url, influx_bucket=db_or_server.bucket)
    elif isinstance(db_or_server, InfluxServer):
        base.update(influx_url=db_or_server.url, influx_bucket=db_or_server.bucket)
    base.update(kw)
    return load_settings(None, **base)


class Running:
    """A Collector receiving on a thread."""

    def __init__(self, settings: Settings) -> None:
        self.c = Collector(settings)
        self.c.serve_http()
        self.t = threading.Thread(target=self.c.run, daemon=True)
        self.t.start()

    def stop(self) -> None:
        self.c.stop()
        self.t.join(10)
        self.c.close(timeout_s=10)


@pytest.fixture
def running() -> Iterator[list[Running]]:
    started: list[Running] = []
    yield started
    for r in started:
        if r.t.is_alive():
            r.stop()
