"""Fixtures every suite shares: a real InfluxDB 1.8.10 (built by `make influxdb`), started
once per session for the collector, service and deploy tests."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from int_collector.influxd import InfluxServer, default_binary


def _server() -> InfluxServer:
    binary = default_binary()
    if not binary.is_file():
        if os.environ.get("INNET_AGG_INFLUXD"):  # under `make test`: the build must have run
            pytest.fail(f"influxd missing at {binary}: `make influxdb` should have built it")
        pytest.skip(f"no influxd at {binary}: run `make influxdb` (needs Go) to run this test")
    return InfluxServer(binary)


@pytest.fixture(scope="session")
def influx() -> Iterator[InfluxServer]:
    srv = _server()
    srv.start()
    yield srv
    srv.stop(remove=True)


@pytest.fixture
def fresh_server() -> Iterator[InfluxServer]:
    """A server of its own, for tests that stop and restart it."""
    srv = _server()
    srv.start()
    yield srv
    srv.stop(remove=True)
