"""The service against a real ONOS 2.7.0 (null providers' spine-leaf with hosts, our app
installed): intents compile and install, the aggregation entries reach ONOS's flow store
through the app's REST resource, and reconcile restores what ONOS lost.

Needs the ONOS built from source outside the repository (docs/service.md, "Testing against
ONOS"); skipped with the reason where it is missing.
"""

from __future__ import annotations

from fastapi.testclient import TestClient

from agg_optimizer.service import onosd

ONOS_APP = "org.innetagg.app"


def job(onos: onosd.OnosServer, job_id: str) -> dict:
    hosts = sorted(h["id"] for h in onos.get("/hosts")["hosts"])
    assert len(hosts) == 6
    # workers on all three leaves, the PS on the last: the tree needs a spine
    return {"id": job_id, "workers": hosts[:5:2], "ps": hosts[-1], "update_bytes": 10_000_000}


def test_placement_installs_intents_and_aggregation_entries_delete_removes_both(
    onos_real: onosd.OnosServer, onos_service: TestClient
) -> None:
    app_id = "org.innetagg.optimizer"
    assert onos_service.post("/api/v1/jobs", json=job(onos_real, "j1")).status_code == 201
    res = onos_service.post("/api/v1/jobs/j1/placement").json()
    assert res["status"] == "applied", res
    assert res["aggregation"] == "applied"
    listed = onos_real.get(f"/intents/application/{app_id}")["intents"]
    assert {i["state"] for i in listed} == {"INSTALLED"} and len(listed) == 6
    placed = res["placement"]
    assert placed["aggregators"], placed
    rules = onos_real.table_flows(".agg_job")
    assert {r["deviceId"] for r in rules} == {a["switch"] for a in placed["aggregators"]}
    stored = onos_real.request("GET", "/onos/innet-agg/aggregation/j1")
    assert stored.status_code == 200, stored.text
    assert onos_service.post("/api/v1/jobs/j1/placement").json()["changes"]["submit"] == []
    assert onos_service.delete("/api/v1/jobs/j1").status_code == 200
    onosd.wait_for(lambda: not onos_real.get(f"/intents/application/{app_id}")["intents"])
    onosd.wait_for(lambda: not onos_real.table_flows(".agg_job"))
    assert onos_real.request("GET", "/onos/innet-agg/aggregation/j1").status_code == 404


def test_reconcile_resubmits_intents_onos_lost(
    onos_real: onosd.OnosServer, onos_service: TestClient
) -> None:
    app_id = "org.innetagg.optimizer"
    assert onos_service.post("/api/v1/jobs", json=job(onos_real, "j2")).status_code == 201
    assert onos_service.post("/api/v1/jobs/j2/placement").json()["status"] == "applied"
    keys = sorted(i["key"] for i in onos_real.get(f"/intents/application/{app_id}")["intents"])
    lost = keys[0]
    assert onos_real.request("DELETE", f"/intents/{app_id}/{lost}").status_code == 204
    onosd.wait_for(
        lambda: (
            lost
            not in {i["key"] for i in onos_real.get(f"/intents/application/{app_id}")["intents"]}
        )
    )
    r = onos_service.post("/api/v1/reconcile").json()
    assert r["resubmitted"] == [lost] and r["removed"] == [] and r["failed"] == []
    states = {
        i["key"]: i["state"] for i in onos_real.get(f"/intents/application/{app_id}")["intents"]
    }
    assert states == dict.fromkeys(keys, "INSTALLED")
    assert onos_service.delete("/api/v1/jobs/j2").status_code == 200
    onosd.wait_for(lambda: not onos_real.get(f"/intents/application/{app_id}")["intents"])
