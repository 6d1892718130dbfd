"""The service against a real ONOS 2.7.0 (null providers' spine-leaf with hosts, our app
installed): intents compile and install, the aggregation entries reach ONOS's flow store
through the app's REST resource, and reconcile restores what ONOS lost.

Needs the ONOS built from source outside the repository (docs/service.md, "Testing against
ONOS"); skipped with the reason where it is missing.
"""

from __future__ import annotations

from typing import Any

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


def test_an_intent_changed_inside_onos_is_put_back_by_reconcile(
    onos_real: onosd.OnosServer, onos_service: TestClient
) -> None:
    """Another writer replaces one of our intents under our key (no waypoints, another
    priority): reconcile compares what ONOS holds (`?detail=true`) with the desired body and
    submits it again; a second reconcile finds nothing to do (ONOS's encoding of an intent
    we sent reads as equal: no churn)."""
    from agg_optimizer.service.onos import intent_shape

    app_id = "org.innetagg.optimizer"
    assert onos_service.post("/api/v1/jobs", json=job(onos_real, "j4")).status_code == 201
    assert onos_service.post("/api/v1/jobs/j4/placement").json()["status"] == "applied"
    again = onos_service.post("/api/v1/reconcile").json()
    assert "j4" not in again["repaired"], again  # what ONOS holds equals what we sent
    svc = onos_service.app.state.service  # type: ignore[attr-defined]
    want = {k: intent_shape(b) for k, b in svc.store.desired("j4")["j4"]["bodies"].items()}
    key = sorted(want)[0]
    body = dict(svc.store.desired("j4")["j4"]["bodies"][key])
    body["constraints"], body["priority"] = [], 12345
    r = onos_real.request("POST", "/intents", json=body)
    assert r.status_code in (200, 201), r.text

    def held() -> dict:
        url = f"/intents/application/{app_id}?detail=true"
        return {i["key"]: i for i in onos_real.get(url)["intents"]}

    onosd.wait_for(lambda: held()[key].get("priority") == 12345, 60, "the foreign change")
    r = onos_service.post("/api/v1/reconcile").json()
    assert "j4" in r["repaired"] and key in r["resubmitted"], r
    onosd.wait_for(lambda: intent_shape(held()[key]) == want[key], 60, "our intent back")
    assert onos_service.post("/api/v1/reconcile").json()["repaired"] == []
    assert onos_service.delete("/api/v1/jobs/j4").status_code == 200
    onosd.wait_for(lambda: not onos_real.get(f"/intents/application/{app_id}")["intents"])


def test_scheduled_classes_reach_onos_and_leave_with_the_job(
    onos_real: onosd.OnosServer, real_onos_settings: Any
) -> None:
    """Issue 17 on a real ONOS: with a scheduling policy the service writes each placed
    job's class through the app's traffic-class resource, which holds it; a change of
    order rewrites both classes; deleting the job removes its class; a class no switch
    holds is reported as such."""
    from agg_optimizer.service.app import create_app

    settings = real_onos_settings(schedule_policy="jpas", schedule_classes=3)
    app = create_app(settings, loop=False)
    with TestClient(app, headers={"Content-Type": "application/json"}) as svc:
        try:
            for jid in ("c1", "c2"):
                assert svc.post("/api/v1/jobs", json=job(onos_real, jid)).status_code == 201
                assert svc.post(f"/api/v1/jobs/{jid}/placement").json()["status"] == "applied"
            for jid, p in (("c1", 0.8), ("c2", 0.1)):
                r = svc.post(f"/api/v1/jobs/{jid}/progress", json={"progress": p, "stage": 0})
                assert r.status_code == 200, r.text
            out = svc.post("/api/v1/schedule/apply").json()
            assert out["order"] == ["c2", "c1"], out
            # ONOS took both classes, but none of its (null) devices runs our pipeconf, and
            # the status says so rather than ok
            assert out["status"] == "no-switch" and out["held_by"] == {"c1": [], "c2": []}, out

            def held() -> dict[str, int]:
                got = {}
                for jid in ("c1", "c2"):
                    r = onos_real.request("GET", f"/onos/innet-agg/priority/{jid}")
                    if r.status_code == 200:
                        got[jid] = r.json()["priority_class"]
                return got

            assert held() == {"c2": 2, "c1": 1}
            # The null providers' devices do not run our pipeconf: the app keeps the class
            # and writes no entry (tests/onos/test_bmv2_device.py sees entries on bmv2).
            doc = onos_real.request("GET", "/onos/innet-agg/priority/c1").json()
            assert doc["switches"] == [] and onos_real.table_flows(".traffic_class") == [], doc
            r = svc.post("/api/v1/jobs/c2/progress", json={"progress": 0.95, "stage": 0})
            assert r.status_code == 200, r.text
            assert svc.post("/api/v1/schedule/apply").json()["written"] == {"c1": 2, "c2": 1}
            assert held() == {"c1": 2, "c2": 1}
            assert svc.delete("/api/v1/jobs/c2").status_code == 200
            assert held() == {"c1": 2}
        finally:
            for jid in ("c1", "c2"):
                svc.delete(f"/api/v1/jobs/{jid}")
    app.state.service.close()
    for jid in ("c1", "c2"):
        assert onos_real.request("GET", f"/onos/innet-agg/priority/{jid}").status_code == 404
