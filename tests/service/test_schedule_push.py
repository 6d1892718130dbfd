"""The scheduler's classes pushed to the switches (issue 17 item 3): the service orders
the placed jobs by its configured policy and writes each job's class through the ONOS
app's traffic-class resource (stand-in ONOS over HTTP, real InfluxDB); only changed
classes are written, a stage change re-orders at once, deleted jobs lose their entry,
ONOS down gives an explicit status and the next run recovers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from agg_optimizer.service.app import create_app
from int_collector.influxd import InfluxServer

from .conftest import make_settings
from .onos_standin import StandinOnos

H1, H2, H3, H4 = (f"00:00:00:00:00:0{i}/None" for i in range(1, 5))


def _client(
    onos: StandinOnos, influx: InfluxServer, bucket: str, tmp: Path, loop: bool, **kw: object
) -> Iterator[TestClient]:
    settings = make_settings(onos, influx, bucket, tmp / "s.sqlite", **kw)
    app = create_app(settings, loop=loop)
    with TestClient(app, headers={"Content-Type": "application/json"}) as c:
        yield c
    app.state.service.close()


@pytest.fixture
def jpas(
    onos: StandinOnos, influx: InfluxServer, bucket: str, tmp_path: Path
) -> Iterator[TestClient]:
    yield from _client(
        onos, influx, bucket, tmp_path, False, schedule_policy="jpas", schedule_classes=3
    )


def _place(client: TestClient, job_id: str, workers: list[str]) -> None:
    r = client.post(
        "/api/v1/jobs", json={"id": job_id, "workers": workers, "ps": H4, "update_bytes": 10**8}
    )
    assert r.status_code == 201, r.text
    assert client.post(f"/api/v1/jobs/{job_id}/placement").status_code == 200


def _progress(client: TestClient, job: str, p: float, stage: int = 0) -> None:
    r = client.post(f"/api/v1/jobs/{job}/progress", json={"progress": p, "stage": stage})
    assert r.status_code == 200, r.text


def test_classes_follow_progress_and_only_changes_are_written(
    jpas: TestClient, onos: StandinOnos
) -> None:
    _place(jpas, "a", [H1, H2])
    _place(jpas, "b", [H3, H2])
    _progress(jpas, "a", 0.8)
    _progress(jpas, "b", 0.1)
    r = jpas.post("/api/v1/schedule/apply")
    assert r.status_code == 200, r.text
    # JPAS: the least progressed first; 3 queues = 2 classes for jobs above the background
    assert r.json()["order"] == ["b", "a"]
    assert {j: d["priority_class"] for j, d in onos.priority.items()} == {"b": 2, "a": 1}
    assert all(d["job_id"] == j for j, d in onos.priority.items())
    posts = [p for m, p in onos.requests if m == "POST" and "/priority/" in p]
    assert len(posts) == 2

    assert jpas.post("/api/v1/schedule/apply").json()["written"] == {}  # nothing changed
    assert len([p for m, p in onos.requests if m == "POST" and "/priority/" in p]) == 2

    _progress(jpas, "b", 0.9)  # b overtakes a: both classes change
    out = jpas.post("/api/v1/schedule/apply").json()
    assert out["written"] == {"a": 2, "b": 1} and out["status"] == "ok"
    assert {j: d["priority_class"] for j, d in onos.priority.items()} == {"a": 2, "b": 1}

    assert jpas.delete("/api/v1/jobs/b").status_code == 200
    assert set(onos.priority) == {"a"}
    status = jpas.get("/api/v1/schedule/status").json()
    assert status["pushed"] == {"a": 2} and status["policy"] == "jpas"


def test_onos_down_and_app_missing_are_explicit_and_recover(
    jpas: TestClient, onos: StandinOnos
) -> None:
    _place(jpas, "a", [H1, H2])
    agg = onos.aggregation
    onos.aggregation = None  # the app uninstalled: its resources answer 404
    r = jpas.post("/api/v1/schedule/apply")
    assert r.status_code == 200 and r.json()["status"] == "app-not-installed", r.text
    assert r.json()["pushed"] == {}
    onos.aggregation = agg

    port = onos.port
    onos.stop()
    r = jpas.post("/api/v1/schedule/apply")
    assert r.status_code == 503 and "unreachable" in r.json()["detail"], r.text
    st = jpas.get("/api/v1/schedule/status").json()
    assert st["status"] == "onos-unavailable" and st["pushed"] == {}
    onos.port = port
    onos.start()
    r = jpas.post("/api/v1/schedule/apply")
    assert r.status_code == 200 and r.json()["status"] == "ok", r.text
    assert onos.priority["a"]["priority_class"] == 2


def test_without_a_policy_nothing_is_pushed(client: TestClient, onos: StandinOnos) -> None:
    _place(client, "a", [H1, H2])
    r = client.post("/api/v1/schedule/apply")
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "schedule_policy"
    assert client.get("/api/v1/schedule/status").json()["status"] == "off"
    assert onos.priority == {}


def test_unknown_policy_in_settings_is_refused(
    onos: StandinOnos, influx: InfluxServer, bucket: str, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="schedule_policy"):
        make_settings(onos, influx, bucket, tmp_path / "s.sqlite", schedule_policy="magic")


def test_a_stage_change_reorders_at_once(
    onos: StandinOnos, influx: InfluxServer, bucket: str, tmp_path: Path
) -> None:
    """The loop's period is long; the stage change alone must push the new order."""
    gen = _client(
        onos, influx, bucket, tmp_path, True,
        schedule_policy="jpas", schedule_classes=3, schedule_period_s=3600,
    )  # fmt: skip
    client = next(gen)
    try:
        _place(client, "a", [H1, H2])
        _place(client, "b", [H3, H2])
        deadline = time.monotonic() + 60
        while len(onos.priority) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # placing them woke the scheduler
        assert set(onos.priority) == {"a", "b"}
        _progress(client, "a", 0.5, stage=0)
        _progress(client, "b", 0.2, stage=0)
        _progress(client, "a", 0.1, stage=1)  # a's next stage: it is behind now
        _progress(client, "b", 0.6, stage=1)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if {j: d["priority_class"] for j, d in onos.priority.items()} == {"a": 2, "b": 1}:
                break
            time.sleep(0.05)
        assert {j: d["priority_class"] for j, d in onos.priority.items()} == {"a": 2, "b": 1}
        assert client.get("/api/v1/schedule/status").json()["last_trigger"] == "stage"
    finally:
        next(gen, None)


def test_standin_resource_refuses_bad_documents_naming_the_field(onos: StandinOnos) -> None:
    for body, field in (
        ({"job_id": "x", "priority_class": 8}, "priority_class"),
        ({"job_id": "x", "priority_class": True}, "priority_class"),
        ({"job_id": "y", "priority_class": 1}, "job_id"),
        ({"job_id": "x", "priority_class": 1, "switches": ["device:nope"]}, "switches[0]"),
    ):
        code, out = onos.route("POST", "/onos/innet-agg/priority/x", body)
        assert code == 400 and out["message"].startswith(f"{field}:"), (body, out)
    assert onos.priority == {}


def test_a_class_no_switch_holds_is_reported_and_written_again(
    jpas: TestClient, onos: StandinOnos
) -> None:
    """ONOS accepts a class when no device runs our pipeconf (201, `switches: []`, as the
    real app answers): the status must not say ok, and the next run writes it again."""
    _place(jpas, "a", [H1, H2])
    onos.pipeconf_devices = set()  # no device of ours
    r = jpas.post("/api/v1/schedule/apply")
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["status"] == "no-switch" and "a" in out["error"], out
    assert out["held_by"] == {"a": []} and out["pushed"] == {"a": 2}
    onos.pipeconf_devices = None  # every device runs it again
    out = jpas.post("/api/v1/schedule/apply").json()
    assert out["status"] == "ok" and out["written"] == {"a": 2}, out
    assert out["held_by"]["a"] and out["held_by"]["a"] == onos.priority["a"]["switches"], out
    assert jpas.post("/api/v1/schedule/apply").json()["written"] == {}  # held: not re-sent
