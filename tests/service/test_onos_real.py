"""The service against a real ONOS 2.7.0 with null providers (spine-leaf with hosts).

Needs `make onos`: the release tarball from the Maven repository and a Java 11 runtime.
Skipped, with the reason, where that repository does not serve the tarball.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import requests
from fastapi.testclient import TestClient

from agg_optimizer.service import onosd
from agg_optimizer.service.app import create_app
from agg_optimizer.service.settings import Settings


@pytest.fixture(scope="session")
def real_onos() -> Iterator[onosd.OnosServer]:
    why = onosd.missing()
    if why:
        pytest.skip(f"real ONOS unavailable: {why} (get-onos.sh reports why the download failed)")
    srv = onosd.OnosServer("spineleaf,2,3,2")
    srv.start()
    yield srv
    srv.stop(remove=True)


def test_job_placement_installs_intents_then_delete_removes_them(
    real_onos: onosd.OnosServer, influx, bucket, tmp_path
) -> None:
    hosts = real_onos.get("/hosts")["hosts"]
    assert len(hosts) >= 4
    s = Settings(
        onos_url=real_onos.url,
        influx_url=influx.url,
        influx_bucket=bucket,
        db_path=tmp_path / "db",
        reoptimize_period_s=0,
        intent_wait_s=60,
    )
    app = create_app(s, loop=False)
    with TestClient(app) as c:
        job = {
            "id": "j1",
            "workers": [h["id"] for h in hosts[:3]],
            "ps": hosts[-1]["id"],
            "update_bytes": 10_000_000,
        }
        assert c.post("/api/v1/jobs", json=job).status_code == 201
        res = c.post("/api/v1/jobs/j1/placement").json()
        assert res["status"] == "applied", res
        assert res["aggregation"] == "app-not-installed"
        listed = real_onos.get(f"/intents/application/{s.onos_app_id}")["intents"]
        assert {i["state"] for i in listed} == {"INSTALLED"} and len(listed) == 3
        assert c.post("/api/v1/jobs/j1/placement").json()["changes"]["submit"] == []
        assert c.delete("/api/v1/jobs/j1").status_code == 200
        deadline = time.monotonic() + 30
        while real_onos.get(f"/intents/application/{s.onos_app_id}")["intents"]:
            assert time.monotonic() < deadline
            time.sleep(1)
    app.state.service.close()
    r = requests.get(real_onos.url + "/intents", auth=real_onos.auth, timeout=10)
    assert r.status_code == 200
