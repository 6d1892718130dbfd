"""The scheduler through the service (issue 17, item 3): jobs report progress, placed jobs
get priority classes by policy; bad input names the field (stand-in ONOS, real InfluxDB)."""

from __future__ import annotations

from fastapi.testclient import TestClient

H1, H2, H3, H4 = (f"00:00:00:00:00:0{i}/None" for i in range(1, 5))


def _place(client: TestClient, job_id: str, workers: list[str], size: int) -> None:
    r = client.post(
        "/api/v1/jobs", json={"id": job_id, "workers": workers, "ps": H4, "update_bytes": size}
    )
    assert r.status_code == 201, r.text
    r = client.post(f"/api/v1/jobs/{job_id}/placement")
    assert r.status_code == 200, r.text


def test_placed_jobs_get_classes_by_policy_and_progress(client: TestClient) -> None:
    _place(client, "small", [H1, H2], 100_000_000)
    _place(client, "big", [H3, H2], 500_000_000)
    s = client.get("/api/v1/schedule", params={"policy": "sincronia", "classes": 4}).json()
    # both end on the PS's downlink; the smaller round goes first
    assert s["order"] == ["small", "big"]
    assert s["class_of"] == {"small": 3, "big": 2} and s["background_class"] == 0
    fair = client.get("/api/v1/schedule", params={"policy": "fair"}).json()
    assert set(fair["class_of"].values()) == {3}

    r = client.post("/api/v1/jobs/small/progress", json={"iterations_done": 90,
                                                         "iterations_total": 100})  # fmt: skip
    assert r.status_code == 200 and r.json()["progress"] == 0.9, r.text
    assert client.post("/api/v1/jobs/big/progress", json={"progress": 0.1}).status_code == 200
    jpas = client.get("/api/v1/schedule", params={"policy": "jpas", "classes": 2}).json()
    assert jpas["order"] == ["big", "small"]  # the least progressed first
    assert jpas["class_of"] == {"big": 1, "small": 1}  # one class for jobs: 2 queues in all

    assert client.delete("/api/v1/jobs/big").status_code == 200
    assert client.get("/api/v1/schedule", params={"policy": "jpas"}).json()["order"] == ["small"]


def test_bad_progress_and_schedule_requests_name_the_field(client: TestClient) -> None:
    _place(client, "j", [H1, H2], 100_000_000)
    for body, field in (
        ({"progress": 1.5}, "progress"),
        ({"progress": True}, "progress"),
        ({"iterations_done": 5}, "progress"),
        ({"iterations_done": 11, "iterations_total": 10}, "iterations_done"),
        ({"progress": 0.5, "stage": -1}, "stage"),
        ({"progress": 0.5, "speed": 3}, "speed"),
    ):
        r = client.post("/api/v1/jobs/j/progress", json=body)
        assert r.status_code == 422, (body, r.text)
        assert r.json()["detail"][0]["loc"][-1] == field, (body, r.text)
    assert client.post("/api/v1/jobs/nope/progress", json={"progress": 0.1}).status_code == 404
    r = client.get("/api/v1/schedule", params={"policy": "magic"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "policy"]
    r = client.get("/api/v1/schedule", params={"classes": 1})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "classes"]
    # nothing stored was lost: the job still schedules, with no progress reported
    assert client.get("/api/v1/schedule").json()["order"] == ["j"]
