"""Fixtures: a real InfluxDB 1.8.10 (as the collector's tests), the ONOS stand-in over HTTP,
and the service app driven through FastAPI's TestClient."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from fastapi.testclient import TestClient

from agg_optimizer.service.app import create_app
from agg_optimizer.service.settings import Settings
from int_collector import children
from int_collector.influxd import InfluxServer, free_port

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


# Real `agg-optimizer serve` processes (test_second_instance.py, test_replicas.py)
BIN = Path(sys.executable).parent / "agg-optimizer"
START_S = 300  # a cold start on a loaded 2-core machine


class Served:
    def __init__(self, proc: subprocess.Popen, port: int, log: Path) -> None:
        self.proc, self.port, self.log = proc, port, log
        self.url = f"http://127.0.0.1:{port}"

    def api(self, method: str, path: str, **kw: Any) -> requests.Response:
        headers = {"Content-Type": "application/json"}
        return requests.request(method, self.url + path, headers=headers, timeout=60, **kw)


@pytest.fixture
def serve(onos: StandinOnos, influx: InfluxServer, bucket: str, tmp_path: Path) -> Iterator[Any]:
    procs: list[subprocess.Popen] = []

    def start(db: str, port: int | None = None, wait: bool = True, **env: str) -> Served:
        port = port or free_port()
        log = tmp_path / f"serve-{len(procs)}.log"
        full = {
            **os.environ,
            "AGG_OPTIMIZER_ONOS_URL": onos.url,
            "AGG_OPTIMIZER_INFLUX_URL": influx.url,
            "AGG_OPTIMIZER_INFLUX_BUCKET": bucket,
            "AGG_OPTIMIZER_DB_PATH": str(tmp_path / db),
            "AGG_OPTIMIZER_REOPTIMIZE_PERIOD_S": "0",
            "AGG_OPTIMIZER_VIEW_MAX_AGE_S": "0",
            "AGG_OPTIMIZER_LEASE_TTL_S": "3",
            **env,
        }
        p = children.spawn([str(BIN), "serve", "--port", str(port)], env=full, log=log)
        procs.append(p)
        s = Served(p, port, log)
        if wait:

            def up() -> bool:
                if p.poll() is not None:
                    raise children.NotReady(f"exited: {log.read_text()[-2000:]}")
                return requests.get(s.url + "/healthz", timeout=2).status_code == 200

            children.wait_ready(up, "agg-optimizer serve", timeout_s=START_S, proc=p, log=log)
        return s

    yield start
    for p in procs:
        children.stop(p)
