"""Fixtures: a real InfluxDB 1.8.10 (as the collector's tests), the ONOS stand-in over HTTP,
and the service app driven through FastAPI's TestClient."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from agg_optimizer.service.app import create_app
from agg_optimizer.service.settings import Settings
from int_collector.influxd import InfluxServer

from .onos_standin import StandinOnos


@pytest.fixture
def onos() -> Iterator[StandinOnos]:
    srv = StandinOnos()
    srv.aggregation = {}  # our ONOS app installed, as in a deployment; tests may remove it
    srv.start()
    yield srv
    srv.stop()


def make_settings(
    onos: StandinOnos, influx: InfluxServer, bucket: str, db: Path, **kw: object
) -> Settings:
    base: dict[str, object] = dict(
        onos_url=onos.url,
        onos_timeout_s=2.0,
        onos_retries=1,
        intent_wait_s=5.0,
        influx_url=influx.url,
        influx_bucket=bucket,
        db_path=db,
        reoptimize_period_s=0,
        # FastAPI's TestClient sends `Host: testserver`; without a token the service
        # answers loopback names only, and names listed here.
        allowed_hosts=["testserver"],
    )
    base.update(kw)
    return Settings(**base)  # type: ignore[arg-type]


@pytest.fixture
def settings(onos: StandinOnos, influx: InfluxServer, bucket: str, tmp_path: Path) -> Settings:
    return make_settings(onos, influx, bucket, tmp_path / "state.sqlite")


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    app = create_app(settings, loop=False)
    with TestClient(app, headers={"Content-Type": "application/json"}) as c:
        yield c
    app.state.service.close()
