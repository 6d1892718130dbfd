"""The service's API against the ONOS stand-in (real HTTP) and a real InfluxDB."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from fastapi.testclient import TestClient
from influxdb_client import InfluxDBClient, Point, WritePrecision
from influxdb_client.client.write_api import SYNCHRONOUS

from agg_optimizer.service.app import create_app
from agg_optimizer.service.onos import intent_key, job_of_key

from .conftest import make_settings
from .onos_standin import StandinOnos

H1, H2, H3, H4 = (f"00:00:00:00:00:0{i}/None" for i in range(1, 5))
JOB = {
    "id": "resnet-a",
    "workers": [H1, "00:00:00:00:00:02", "10.0.0.3"],
    "ps": "10.0.0.4",
    "update_bytes": 100_000_000,
}
APP = "org.innetagg.optimizer"


def ours(onos: StandinOnos) -> dict[str, dict]:
    return {k: b for (app, k), b in onos.intents.items() if app == APP}


def intent_posts(onos: StandinOnos) -> int:
    return sum(1 for m, p in onos.requests if m == "POST" and p.endswith("/intents"))


def test_intent_keys_name_their_job_both_ways() -> None:
    fwd, ack = intent_key("a-b", "00:00:00:00:00:0A"), intent_key("a-b", "00:00:00:00:00:0a", True)
    assert (fwd, ack) == ("ia-a-b-00000000000a", "ia-a-b-00000000000a-ack")
    assert job_of_key(fwd) == job_of_key(ack) == "a-b"
    assert job_of_key("ia-x-ack-00000000000a") == "x-ack"  # a job may end in -ack
    assert job_of_key("ia-x-00000000000a-ack-ack") is None
    assert job_of_key("other-intent") is None


def test_job_create_resolves_ids_macs_and_ips(client: TestClient) -> None:
    r = client.post("/api/v1/jobs", json=JOB)
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["workers"] == [H1, H2, H3]
    assert job["ps"] == H4
    assert job["strategy"] == "agg"
    assert job["placement_status"] == "none"
    assert [j["id"] for j in client.get("/api/v1/jobs").json()] == ["resnet-a"]


def test_bad_input_names_the_field(client: TestClient) -> None:
    r = client.post("/api/v1/jobs", json={**JOB, "workers": [H1, "10.9.9.9"]})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "workers", "1"]
    assert "10.9.9.9" in r.json()["detail"][0]["msg"]
    r = client.post("/api/v1/jobs", json={**JOB, "update_bytes": -1})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "update_bytes"]
    r = client.post("/api/v1/jobs", json={**JOB, "ps": H1})
    assert r.status_code == 422 and "ps" in r.json()["detail"][0]["loc"]
    r = client.post("/api/v1/jobs", json={**JOB, "strategy": "magic"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "strategy"]
    r = client.post(
        "/api/v1/jobs", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 422
    assert client.get("/api/v1/jobs/nope").status_code == 404
    assert client.post("/api/v1/jobs/nope/placement").status_code == 404
    assert client.post("/api/v1/jobs", json=JOB).status_code == 201
    assert client.post("/api/v1/jobs", json=JOB).status_code == 409


def test_limits_give_413(onos, influx, bucket, tmp_path) -> None:
    s = make_settings(
        onos,
        influx,
        bucket,
        tmp_path / "db",
        max_jobs=1,
        max_workers_per_job=2,
        max_request_bytes=2048,
    )
    with TestClient(create_app(s, loop=False), headers={"Content-Type": "application/json"}) as c:
        assert c.post("/api/v1/jobs", json=JOB).status_code == 413  # 3 workers > 2
        assert c.post("/api/v1/jobs", json={**JOB, "workers": [H1]}).status_code == 201
        r = c.post("/api/v1/jobs", json={**JOB, "id": "b", "workers": [H2]})
        assert r.status_code == 413 and "limit" in r.json()["detail"]
        big = {**JOB, "id": "c", "workers": [H1] * 400}
        assert c.post("/api/v1/jobs", json=big).status_code == 413


def test_place_applies_intents_pinned_through_the_aggregators(
    client: TestClient, onos: StandinOnos
) -> None:
    client.post("/api/v1/jobs", json=JOB)
    dry = client.post("/api/v1/jobs/resnet-a/placement", params={"dry_run": True}).json()
    assert dry["status"] == "dry-run" and not ours(onos)
    r = client.post("/api/v1/jobs/resnet-a/placement")
    assert r.status_code == 200, r.text
    res = r.json()
    assert res["status"] == "applied", res
    assert res["aggregation"] == "applied"
    assert onos.aggregation is not None and "resnet-a" in onos.aggregation
    assert {i["state"] for i in res["intents"]} == {"INSTALLED"}
    placed = res["placement"]
    macs = [h.split("/")[0] for h in (H1, H2, H3)]
    keys = {intent_key("resnet-a", m, ack) for m in macs for ack in (False, True)}
    assert set(ours(onos)) == keys
    ps = {"device": "device:leaf2", "port": "2"}
    for worker, path in placed["worker_paths"].items():
        mac = worker.split("/")[0]
        switches = [n for n in path if n.startswith("device:")]
        body = ours(onos)[intent_key("resnet-a", mac)]
        assert body["constraints"][0]["waypoints"] == switches
        assert body["egressPoint"] == ps
        # The PS acknowledges every chunk to each worker: the same switches, reversed.
        ack = ours(onos)[intent_key("resnet-a", mac, ack=True)]
        assert ack["constraints"][0]["waypoints"] == switches[::-1]
        assert ack["ingressPoint"] == ps and ack["egressPoint"] == body["ingressPoint"]
        assert ack["selector"]["criteria"] == [
            {"type": "ETH_SRC", "mac": "00:00:00:00:00:04"},
            {"type": "ETH_DST", "mac": mac},
        ]
    for agg in placed["aggregators"]:
        for child in agg["children"]:
            if child in placed["worker_paths"]:
                assert agg["switch"] in placed["worker_paths"][child]
    cur = client.get("/api/v1/jobs/resnet-a/placement").json()
    assert cur["status"] == "applied" and cur["placement"] == placed


def test_intents_onos_does_not_know_yet_are_waited_for_not_failed(
    client: TestClient, onos: StandinOnos
) -> None:
    # ONOS 2.7 answers 201 to a submission before its store holds the intent; a lookup in
    # between answers 400 "For input string" (Long.decode of our key), as it does for a key it
    # never saw. The placement waits for the intents instead of failing with 503.
    onos.unknown_lookups = 3
    client.post("/api/v1/jobs", json=JOB)
    res = client.post("/api/v1/jobs/resnet-a/placement").json()
    assert res["status"] == "applied", res
    assert {i["state"] for i in res["intents"]} == {"INSTALLED"}
    gets = [p for m, p in onos.requests if m == "GET" and "/intents/org.innetagg" in p]
    assert len(gets) >= 6 * 4  # each of the 6 intents: 3 unknown answers, then INSTALLED
    assert client.delete("/api/v1/jobs/resnet-a").status_code == 200
    assert ours(onos) == {}


def test_reapply_changes_nothing_and_delete_removes_everything(
    client: TestClient, onos: StandinOnos
) -> None:
    client.post("/api/v1/jobs", json=JOB)
    client.post("/api/v1/jobs/resnet-a/placement")
    posts = intent_posts(onos)
    again = client.post("/api/v1/jobs/resnet-a/placement").json()
    assert again["changes"]["submit"] == [] and len(again["changes"]["unchanged"]) == 6
    assert intent_posts(onos) == posts
    assert len(client.get("/api/v1/jobs/resnet-a/placements").json()) == 2
    r = client.delete("/api/v1/jobs/resnet-a")
    assert r.status_code == 200 and r.json()["intents_removed"] == 6
    assert ours(onos) == {}
    assert client.get("/api/v1/jobs/resnet-a").status_code == 404


def test_update_touches_only_what_changed(client: TestClient, onos: StandinOnos) -> None:
    client.post("/api/v1/jobs", json=JOB)
    client.post("/api/v1/jobs/resnet-a/placement")
    before = dict(ours(onos))
    posts = intent_posts(onos)
    assert client.put("/api/v1/jobs/resnet-a/strategy", json={"strategy": "ps"}).status_code == 200
    res = client.post("/api/v1/jobs/resnet-a/placement").json()
    assert res["strategy"] == "ps" and res["placement"]["aggregators"] == []
    changed = {k for k in before if before[k] != ours(onos).get(k)}
    assert set(res["changes"]["submit"]) == changed
    assert intent_posts(onos) - posts == len(changed)


def test_onos_down_mid_apply_is_partial_then_reconciled(
    client: TestClient, onos: StandinOnos
) -> None:
    client.post("/api/v1/jobs", json=JOB)
    original = onos.route
    posted = []

    def failing(method: str, path: str, body: object) -> tuple[int, object]:
        if method == "POST" and path.endswith("/intents"):
            if len(posted) >= 1:
                return 503, {"code": 503, "message": "down"}
            posted.append(path)
        return original(method, path, body)

    onos.route = failing  # type: ignore[method-assign]
    r = client.post("/api/v1/jobs/resnet-a/placement")
    assert r.status_code == 503
    assert "partial" in r.json()["detail"] and "1 intent(s) submitted" in r.json()["detail"]
    assert client.get("/api/v1/jobs/resnet-a/placement").json()["status"] == "partial"
    assert len(ours(onos)) == 1
    onos.route = original  # type: ignore[method-assign]
    # The placement was recorded as desired before anything was sent: reconcile finishes
    # it (the five intents ONOS never got, and the aggregation document).
    rec = client.post("/api/v1/reconcile").json()
    assert rec["removed"] == [] and len(rec["resubmitted"]) == 5, rec
    assert rec["repaired"] == ["resnet-a"]
    assert client.get("/api/v1/jobs/resnet-a/placement").json()["status"] == "applied"
    assert len(ours(onos)) == 6 and "resnet-a" in onos.aggregation
    res = client.post("/api/v1/jobs/resnet-a/placement").json()
    assert res["status"] == "applied" and res["changes"]["submit"] == []


def test_onos_unreachable_gives_503_with_reason(client: TestClient, onos: StandinOnos) -> None:
    onos.stop()
    r = client.post("/api/v1/jobs", json=JOB)
    assert r.status_code == 503 and "unreachable" in r.json()["detail"]
    # /readyz answers from the background probe (every PROBE_PERIOD_S, 1 s): at once, and
    # with ONOS down by the next probe.
    deadline = time.monotonic() + 60  # a loaded machine
    while (r := client.get("/readyz")).status_code != 503 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert r.status_code == 503 and r.json()["checks"]["influxdb"] == "ok"
    assert client.get("/healthz").status_code == 200


def test_restart_reconciles_no_duplicates_no_orphans(onos, influx, bucket, tmp_path) -> None:
    s = make_settings(onos, influx, bucket, tmp_path / "db")
    app = create_app(s, loop=False)
    with TestClient(app, headers={"Content-Type": "application/json"}) as c:
        c.post("/api/v1/jobs", json=JOB)
        c.post("/api/v1/jobs", json={**JOB, "id": "b", "workers": [H3], "ps": H1})
        c.post("/api/v1/placements", json={})
    app.state.service.close()
    assert len(ours(onos)) == 8  # 4 workers: an intent each way
    # While the service was down: ONOS lost one intent, and holds one of a job nobody knows.
    gone = intent_key("resnet-a", "00:00:00:00:00:01")
    kept = onos.intents.pop((APP, gone))
    onos.intents[(APP, "ia-ghost-000000000009")] = {**kept, "key": "ia-ghost-000000000009"}
    app2 = create_app(s, loop=False)
    with TestClient(app2, headers={"Content-Type": "application/json"}) as c:
        assert {j["id"] for j in c.get("/api/v1/jobs").json()} == {"resnet-a", "b"}
        keys = set(ours(onos))
        # The ghost is no intent this store ever submitted: another instance's, maybe.
        assert gone in keys and "ia-ghost-000000000009" in keys and len(keys) == 9
        res = c.post("/api/v1/placements", json={}).json()
        assert all(r["changes"]["submit"] == [] for r in res)
        assert c.post("/api/v1/reconcile").json()["foreign"] == ["ia-ghost-000000000009"]
    app2.state.service.close()
    # Taking the fabric over (its database lost) withdraws what the store does not own.
    s3 = s.model_copy(update={"withdraw_foreign_intents": True})
    app3 = create_app(s3, loop=False)
    with TestClient(app3, headers={"Content-Type": "application/json"}):
        keys = set(ours(onos))
        assert "ia-ghost-000000000009" not in keys and len(keys) == 8
    app3.state.service.close()


def test_bearer_token_guards_mutations(onos, influx, bucket, tmp_path) -> None:
    s = make_settings(onos, influx, bucket, tmp_path / "db", api_token="s3cret")
    with TestClient(create_app(s, loop=False), headers={"Content-Type": "application/json"}) as c:
        assert c.post("/api/v1/jobs", json=JOB).status_code == 401
        bad = {"Authorization": "Bearer nope"}
        assert c.post("/api/v1/jobs", json=JOB, headers=bad).status_code == 401
        ok = {"Authorization": "Bearer s3cret"}
        assert c.post("/api/v1/jobs", json=JOB, headers=ok).status_code == 201
        assert c.get("/api/v1/jobs").status_code == 200
        assert c.delete("/api/v1/jobs/resnet-a").status_code == 401


def _write(influx, bucket: str, points: list[Point]) -> None:
    with (
        InfluxDBClient(url=influx.url, token="", org="-") as c,
        c.write_api(write_options=SYNCHRONOUS) as w,
    ):
        w.write(bucket=bucket, org="-", record=points)


def test_telemetry_latest_state_stale_links_and_decisions(
    client: TestClient, onos: StandinOnos, influx, bucket: str
) -> None:
    for i, d in enumerate(onos.devices["devices"]):
        d["annotations"]["intSwitchId"] = str(i + 1)  # spine1=1 spine2=2 leaf1=3 leaf2=4
    now = datetime.now(UTC)
    link = lambda sw, port, u, t: (  # noqa: E731
        Point("int_link")
        .tag("switch", sw)
        .tag("port", port)
        .field("utilization", u)
        .field("latency_ns", 5000.0)
        .field("queue_occupancy", 7.0)
        .time(t, WritePrecision.NS)
    )
    _write(
        influx,
        bucket,
        [
            link("3", "3", 0.2, now - timedelta(seconds=5)),
            link("3", "3", 0.9, now - timedelta(seconds=1)),  # leaf1 -> spine1, latest
            link("4", "3", 0.5, now - timedelta(seconds=120)),  # leaf2 -> spine1: stale
            link("99", "1", 0.5, now),  # no such switch
        ],
    )
    t = client.get("/api/v1/telemetry").json()
    assert t["links"] == [
        {
            "src": "device:leaf1",
            "dst": "device:spine1",
            "utilization": 0.9,
            "queue_bytes": 7.0,
            "latency_us": 5.0,
            "flows": None,  # the collector does not count flows per link (yet)
        }
    ]
    assert [(s["src"], s["dst"]) for s in t["stale"]] == [("device:leaf2", "device:spine1")]
    assert t["unmapped_rows"] == 3
    client.post("/api/v1/jobs", json=JOB)
    res = client.post("/api/v1/jobs/resnet-a/placement").json()
    assert res["telemetry"]["status"] == "ok" and res["telemetry"]["stale"] == 1
    # The loaded spine1 uplink of leaf1 is avoided.
    for path in res["placement"]["worker_paths"].values():
        assert "device:spine1" not in path
    assert client.app.state.service.flush_decisions()  # type: ignore[attr-defined]
    with InfluxDBClient(url=influx.url, token="", org="-") as c:
        tables = c.query_api().query(
            f'from(bucket: "{bucket}") |> range(start: -1h) '
            '|> filter(fn: (r) => r._measurement == "placement_decision")',
            org="-",
        )
    rows = [r.values for tb in tables for r in tb.records]
    assert {r["job"] for r in rows} == {"resnet-a"}
    assert {r["_field"] for r in rows} >= {"predicted_cct_s", "switches"}


def test_control_loop_reacts_to_a_link_down_with_hysteresis(
    client: TestClient, onos: StandinOnos
) -> None:
    svc = client.app.state.service  # type: ignore[attr-defined]
    client.post("/api/v1/jobs", json=JOB)
    client.post("/api/v1/jobs/resnet-a/placement")
    first = svc.step()
    assert first["changed"] == []
    again = svc.step()
    assert (again["trigger"], again["jobs"], again["changed"]) == ("periodic", ["resnet-a"], [])
    assert again["kept"] == again["restored"] == []
    cur = client.get("/api/v1/jobs/resnet-a/placement").json()["placement"]
    used = {n for p in cur["worker_paths"].values() for n in p if n.startswith("device:spine")}
    for spine in used:
        onos.set_link("device:leaf1", spine, "INACTIVE")
    out = svc.step()
    assert out["trigger"] == "topology" and out["changed"] == ["resnet-a"]
    new = client.get("/api/v1/jobs/resnet-a/placement").json()
    assert new["status"] == "applied"
    for p in new["placement"]["worker_paths"].values():
        assert not (used & set(p)) or p[1] != "device:leaf1"
    listed = onos.route("GET", f"/onos/v1/intents/application/{APP}", None)[1]["intents"]
    assert {i["state"] for i in listed} == {"INSTALLED"}


def test_what_if_predicts_every_strategy(client: TestClient) -> None:
    client.post("/api/v1/jobs", json=JOB)
    w = client.get("/api/v1/jobs/resnet-a/what-if").json()
    assert {"agg", "ps", "switchml", "milp"} <= set(w["strategies"])
    agg, ps = w["strategies"]["agg"], w["strategies"]["ps"]
    assert agg["predicted_cct_s"] <= ps["predicted_cct_s"] + 1e-12
    assert ps["aggregators"] == []
    # the network bound beside them: below every strategy's prediction, above zero
    assert 0 < w["floor_cct_s"] <= min(s["predicted_cct_s"] for s in w["strategies"].values())


def test_topology_metrics_and_openapi(client: TestClient) -> None:
    topo = client.get("/api/v1/topology").json()
    assert {n["id"] for n in topo["nodes"] if n["kind"] == "host"} == {H1, H2, H3, H4}
    client.get("/api/v1/jobs/x")
    m = client.get("/metrics").text
    assert 'agg_optimizer_requests_total{route="/api/v1/jobs/{job_id}",status="404"}' in m
    spec = client.get("/openapi.json").json()
    assert "/api/v1/jobs" in spec["paths"]
    assert spec["components"]["schemas"]["JobIn"]["examples"]
