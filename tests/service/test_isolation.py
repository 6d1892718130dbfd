"""One bad job must not block the others: a cap the fabric cannot meet is refused at
creation, naming the field, and a job that becomes unplaceable later (its PS gone from ONOS)
is reported with its reason while the other jobs are placed, re-optimised and what-if'd."""

from __future__ import annotations

from fastapi.testclient import TestClient

from .onos_standin import StandinOnos

H1, H2, H3, H4 = (f"00:00:00:00:00:0{i}/None" for i in range(1, 5))
GOOD = {"id": "good", "workers": [H1, H2], "ps": H3, "update_bytes": 10_000_000}
BAD = {"id": "bad", "workers": [H1, H3], "ps": H4, "update_bytes": 10_000_000}


def test_a_cap_above_the_programmable_switches_is_refused(client: TestClient) -> None:
    r = client.post("/api/v1/jobs", json={**GOOD, "max_aggregators": 10_000})
    assert r.status_code == 422, r.text
    assert "max_aggregators" in r.text and "programmable switches" in r.text
    assert client.get("/api/v1/jobs").json() == []
    # Within the fabric's switches it is fine.
    assert client.post("/api/v1/jobs", json={**GOOD, "max_aggregators": 2}).status_code == 201


def test_an_unplaceable_job_is_reported_and_the_others_placed(
    client: TestClient, onos: StandinOnos
) -> None:
    assert client.post("/api/v1/jobs", json=GOOD).status_code == 201
    assert client.post("/api/v1/jobs", json=BAD).status_code == 201
    # The bad job's PS leaves the fabric (ONOS no longer lists it).
    onos.hosts["hosts"] = [h for h in onos.hosts["hosts"] if h["id"] != H4]
    r = client.post("/api/v1/placements", json={})
    assert r.status_code == 200, r.text
    by_job = {x["job_id"]: x for x in r.json()}
    assert by_job["good"]["status"] == "applied"
    assert by_job["bad"]["status"] == "unplaceable" and "ps" in by_job["bad"]["reason"]
    # Asked alone, the bad job is a conflict naming it; the good one's what-if works.
    r = client.post("/api/v1/jobs/bad/placement")
    assert r.status_code == 409 and "'bad'" in r.json()["detail"], r.text
    assert client.get("/api/v1/jobs/good/what-if").status_code == 200
    assert client.get("/api/v1/jobs/bad/what-if").status_code == 409
    # The control loop goes on for the good job.
    svc = client.app.state.service  # type: ignore[attr-defined]
    out = svc.step()
    assert out["jobs"] == ["good"] and set(out["unplaceable"]) == {"bad"}, out
    # Once placed, a job whose PS leaves is reported by the loop, and the others still move.
    onos.hosts["hosts"] = [h for h in onos.hosts["hosts"] if h["id"] != H3]
    out = svc.step()
    assert "ps" in out["unplaceable"]["good"] and out["errors"] == {}, out
