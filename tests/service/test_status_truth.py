"""A job's status says what ONOS holds, not only what the record says (issue 54): after ONOS
went away (and came back empty, as after `docker compose down` and `up`), or while our app
is absent, a recorded `applied` reads `repairing` with the reason until a reconcile has seen
the job's intents and aggregation in ONOS again; /readyz is not ready while the app does not
serve its REST. Against the ONOS stand-in over real HTTP (tests/service/onos_standin.py),
without the control loop, so only the steps of each test act."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from agg_optimizer.service.app import create_app
from agg_optimizer.service.onosd import wait_for

from .conftest import make_settings
from .onos_standin import StandinOnos

H1, H2, H3 = (f"00:00:00:00:00:0{i}/None" for i in range(1, 4))
JOB = {"id": "j", "workers": [H1, H2], "ps": H3, "update_bytes": 50_000_000}
APP = "org.innetagg.optimizer"


@pytest.fixture
def svc(onos, influx, bucket, tmp_path) -> Iterator[TestClient]:
    s = make_settings(onos, influx, bucket, tmp_path / "db", probe_period_s=0.2)
    app = create_app(s, loop=False)
    with TestClient(app, headers={"Content-Type": "application/json"}) as c:
        yield c
    app.state.service.close()


def status(c: TestClient) -> dict:
    return dict(c.get("/api/v1/jobs/j/placement").json())


def restarted(onos: StandinOnos, app_installed: bool = True) -> StandinOnos:
    fresh = StandinOnos(port=onos.port)
    fresh.aggregation = {} if app_installed else None
    fresh.start()
    return fresh


def test_onos_gone_and_back_empty_reads_repairing_until_reconciled(svc, onos) -> None:
    assert svc.post("/api/v1/jobs", json=JOB).status_code == 201
    assert svc.post("/api/v1/jobs/j/placement").json()["status"] == "applied"
    assert status(svc)["status"] == "applied"
    assert svc.get("/api/v1/jobs/j").json()["placement_status"] == "applied"
    onos.stop()
    wait_for(lambda: status(svc)["status"] == "repairing", 30, "the job read as repairing")
    cur = status(svc)
    assert cur["recorded_status"] == "applied"
    assert "ONOS stopped answering" in cur["repairing"], cur
    fresh = restarted(onos)
    try:
        wait_for(lambda: svc.get("/readyz").status_code == 200, 30, "ONOS seen again")
        # ONOS answers, holding nothing of the job: still not `applied`
        assert not {k for (app, k) in fresh.intents if app == APP}
        job = svc.get("/api/v1/jobs/j").json()
        assert job["placement_status"] == "repairing" and job["repairing"], job
        out = svc.post("/api/v1/reconcile").json()
        assert len(out["resubmitted"]) == 4 and out["repaired"] == ["j"], out
        assert "j" in fresh.aggregation
        cur = status(svc)
        assert cur["status"] == "applied" and "repairing" not in cur, cur
    finally:
        fresh.stop()


def test_a_restarted_service_reads_repairing_until_it_has_compared(
    onos, influx, bucket, tmp_path: Path
) -> None:
    """The service's own restart (its record kept, ONOS emptied meanwhile, as `docker
    compose down` and `up` do both): `applied` only once its first reconcile has run."""
    db = tmp_path / "db"
    s = make_settings(onos, influx, bucket, db, probe_period_s=0.2)
    app = create_app(s, loop=False)
    with TestClient(app, headers={"Content-Type": "application/json"}) as c:
        assert c.post("/api/v1/jobs", json=JOB).status_code == 201
        assert c.post("/api/v1/jobs/j/placement").json()["status"] == "applied"
    app.state.service.close()
    onos.stop()  # ONOS down while the service starts again: nothing can be compared
    app = create_app(s, loop=False)
    with TestClient(app, headers={"Content-Type": "application/json"}) as c:
        cur = status(c)
        assert cur["status"] == "repairing", cur
        assert "reconcile failed" in cur["repairing"], cur
        fresh = restarted(onos)
        try:
            wait_for(lambda: c.get("/readyz").status_code == 200, 30, "ONOS seen again")
            # refused (503) until the owner claim on ONOS is renewed, in the background
            out = wait_for(lambda: c.post("/api/v1/reconcile").json().get("repaired"), 60,
                           "a reconcile accepted")  # fmt: skip
            assert out == ["j"], out
            assert status(c)["status"] == "applied"
        finally:
            fresh.stop()
    app.state.service.close()


def test_the_app_absent_is_not_ready_and_the_job_reads_intents_only(svc, onos) -> None:
    assert svc.get("/readyz").json()["checks"]["onos_app"] == "ok"
    assert svc.post("/api/v1/jobs", json=JOB).status_code == 201
    assert svc.post("/api/v1/jobs/j/placement").json()["status"] == "applied"
    onos.aggregation = None  # the app uninstalled (its REST gone; ONOS itself answers)
    wait_for(lambda: svc.get("/readyz").status_code == 503, 30, "readyz not ready")
    checks = svc.get("/readyz").json()["checks"]
    assert checks["onos"] == "ok" and "org.innetagg.app" in checks["onos_app"], checks
    assert status(svc)["status"] == "repairing"
    out = svc.post("/api/v1/reconcile").json()
    assert out["repaired"] == ["j"], out
    cur = status(svc)  # the paths are there, no switch sums: said as it is
    assert cur["status"] == "intents-only" and "aggregation not applied" in cur["reason"], cur
    onos.aggregation = {}  # the app back
    wait_for(lambda: svc.get("/readyz").status_code == 200, 30, "readyz ready again")
    svc.post("/api/v1/reconcile")
    assert status(svc)["status"] == "applied" and "j" in onos.aggregation


def test_readyz_can_leave_the_app_out_for_an_intents_only_fabric(
    onos, influx, bucket, tmp_path: Path
) -> None:
    onos.aggregation = None
    s = make_settings(onos, influx, bucket, tmp_path / "db", require_onos_app=False)
    app = create_app(s, loop=False)
    with TestClient(app) as c:
        r = c.get("/readyz")
        assert r.status_code == 200 and "onos_app" not in r.json()["checks"], r.json()
    app.state.service.close()
