"""Fixtures every suite shares, each started once per session: a real InfluxDB 1.8.10 (built
by `make influxdb`) for the collector, service and deploy tests, and a real ONOS 2.7.0 (built
from source outside the repository, docs/service.md) for the service and onos-app tests."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agg_optimizer.service import onosd
from int_collector.influxd import InfluxServer, default_binary

# `make test-fast`: the tests that start no real part (InfluxDB, PostgreSQL, ONOS, bmv2,
# Docker, a training job), marked `real` otherwise (by the fixtures they use, or by their
# module) and left out with `-m "not real"`.
REAL_FIXTURES = frozenset(
    {"influx", "bucket", "fresh_server", "onos_real", "real_onos_settings", "onos_service",
     "onos_cluster", "pg", "hung_influx", "pair"}
)  # fmt: skip
REAL_MODULES = (
    "onos/", "p4/test_bmv2", "p4/test_cc_bench", "e2e/", "deploy/test_stack",
    "deploy/test_collector_image", "agent/test_torch_hook", "agent/test_ddp", "docs/",
)  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    for item in items:
        rel = item.path.resolve().relative_to(here).as_posix()
        if REAL_FIXTURES.intersection(getattr(item, "fixturenames", ())) or rel.startswith(
            REAL_MODULES
        ):
            item.add_marker(pytest.mark.real)


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
def bucket(influx: InfluxServer) -> str:
    """A database of its own on the session's InfluxDB, as a v2 bucket name."""
    name = "s" + uuid.uuid4().hex[:12]
    influx.query_v1(f'CREATE DATABASE "{name}"')
    return f"{name}/autogen"


@pytest.fixture
def fresh_server() -> Iterator[InfluxServer]:
    """A server of its own, for tests that stop and restart it."""
    srv = _server()
    srv.start()
    yield srv
    srv.stop(remove=True)


REPO = Path(__file__).resolve().parents[1]
ONOS_APP = "org.innetagg.app"
ONOS_APP_PROBE = "/onos/innet-agg/aggregation/absent"  # our resource's JSON 404


def built_oar() -> Path | None:
    built = sorted((REPO / "onos-app" / "target").glob("innet-agg-onos-*.oar"))
    return built[-1] if built else None


@pytest.fixture
def real_onos_settings(
    onos_real: onosd.OnosServer, influx: InfluxServer, bucket: str, tmp_path: Path
):
    """Settings of the service against the session's real ONOS, no control loop:
    `real_onos_settings(**overrides)` (e.g. a scheduling policy)."""
    from agg_optimizer.service.settings import Settings

    def make(**kw: object) -> Settings:
        return Settings(
            onos_url=onos_real.url,
            influx_url=influx.url,
            influx_bucket=bucket,
            db_path=tmp_path / "db",
            reoptimize_period_s=0,
            intent_wait_s=60,
            allowed_hosts=["testserver"],  # FastAPI's TestClient's Host
            **kw,
        )

    return make


@pytest.fixture
def onos_service(real_onos_settings):
    """The optimizer service against the session's real ONOS (no control loop), through
    FastAPI's TestClient; its intents go under the default app id."""
    from fastapi.testclient import TestClient

    from agg_optimizer.service.app import create_app

    app = create_app(real_onos_settings(), loop=False)
    with TestClient(app, headers={"Content-Type": "application/json"}) as c:
        yield c
    app.state.service.close()


@pytest.fixture(scope="session")
def onos_real() -> Iterator[onosd.OnosServer]:
    """One real ONOS 2.7.0 per session (boot takes a minute or more), with the null
    providers' spine-leaf (2 spines, 3 leaves, 2 hosts each), the apps of `onosd.APPS`, and
    our app installed from the built .oar. Skipped, saying why, where ONOS is not built."""
    why = onosd.missing()
    if why:
        pytest.skip(f"real ONOS unavailable: {why}")
    oar = built_oar()
    if oar is None:
        pytest.skip("no onos-app/target/*.oar to install: `make onos-app` builds it")
    attach = os.environ.get("INNET_AGG_ONOS_ATTACH")  # an OnosServer's dir, left running
    taken = None if attach else onosd.port_taken()
    if taken:
        pytest.skip(f"real ONOS unavailable: {taken}")
    srv = onosd.OnosServer.attach(Path(attach)) if attach else onosd.OnosServer("spineleaf,2,3,2")
    if not attach:
        srv.start()
    try:
        srv.install_app(oar, ONOS_APP, probe=ONOS_APP_PROBE)
        yield srv
    finally:
        srv.stop(remove=True)
