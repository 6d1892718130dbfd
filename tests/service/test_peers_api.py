"""`GET /api/v1/jobs/{id}/peers` (issue 19): NetMax peer probabilities for a job's workers
on the topology ONOS reports and the telemetry in InfluxDB (stand-in ONOS, real InfluxDB)."""

from __future__ import annotations

from fastapi.testclient import TestClient

H1, H2, H3, H4 = (f"00:00:00:00:00:0{i}/None" for i in range(1, 5))


def test_peers_of_a_job_under_each_policy(client: TestClient) -> None:
    r = client.post(
        "/api/v1/jobs",
        json={"id": "g", "workers": [H1, H2, H3], "ps": H4, "update_bytes": 50_000_000},
    )
    assert r.status_code == 201, r.text
    r = client.get("/api/v1/jobs/g/peers", params={"compute_s": 0.05})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["policy"] == "netmax" and body["workers"] == [H1, H2, H3]
    assert body["model_bytes"] == 50_000_000
    for w, row in body["probabilities"].items():
        assert w not in row and abs(sum(row.values()) - 1.0) < 1e-5
    times = {}
    for policy in ("netmax", "adpsgd", "allreduce", "ps", "prague"):
        r = client.get("/api/v1/jobs/g/peers", params={"policy": policy, "compute_s": 0.05})
        assert r.status_code == 200, (policy, r.text)
        times[policy] = r.json()["predicted_s"]
    assert times["netmax"] <= times["adpsgd"] + 1e-12


def test_bad_peer_requests_name_the_field(client: TestClient) -> None:
    client.post("/api/v1/jobs", json={"id": "g", "workers": [H1, H2], "ps": H4,
                                      "update_bytes": 1000})  # fmt: skip
    assert client.get("/api/v1/jobs/nope/peers").status_code == 404
    for params, field in (
        ({"policy": "magic"}, "policy"),
        ({"compute_s": -1}, "compute_s"),
        ({"kappa": 0}, "kappa"),
        ({"model_bytes": 0}, "model_bytes"),
    ):
        r = client.get("/api/v1/jobs/g/peers", params=params)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", field], r.text
    client.post("/api/v1/jobs", json={"id": "one", "workers": [H1], "ps": H4,
                                      "update_bytes": 1000})  # fmt: skip
    r = client.get("/api/v1/jobs/one/peers")
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "workers", r.text
