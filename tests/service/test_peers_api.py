"""`GET /api/v1/jobs/{id}/peers` (issue 19): NetMax peer probabilities for a job's workers
on the topology ONOS reports and the telemetry in InfluxDB (stand-in ONOS, real InfluxDB)."""

from __future__ import annotations

import time

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


def test_a_plan_follows_the_telemetry_and_pollers_share_one_solve(
    settings, onos, influx, bucket: str, monkeypatch
) -> None:
    """Workers poll their plan (`agg-agent gossip --refresh-s`): every poll of one view gets
    the same answer from one solve, and the next view's telemetry moves the peers."""
    from datetime import UTC, datetime

    from influxdb_client import InfluxDBClient, Point, WritePrecision
    from influxdb_client.client.write_api import SYNCHRONOUS

    import agg_optimizer.peers.selection as peers_mod
    import agg_optimizer.service.views as views_mod
    from agg_optimizer.service.app import create_app

    for i, d in enumerate(onos.devices["devices"]):
        d["annotations"]["intSwitchId"] = str(i + 1)  # spine1=1 spine2=2 leaf1=3 leaf2=4
    ids = {d["id"]: d["annotations"]["intSwitchId"] for d in onos.devices["devices"]}
    # The view's age runs on a clock the test moves: with 0.3 s of real time, five polls on
    # a loaded machine outlived one view (CI saw two solves for the first five polls).
    settings = settings.model_copy(update={"view_max_age_s": 0.3})
    skew = [0.0]

    class Clock:  # views.py's `time`, with monotonic() moved on by `skew`
        def __getattr__(self, name: str):
            return getattr(time, name)

        @staticmethod
        def monotonic() -> float:
            return time.monotonic() + skew[0]

    monkeypatch.setattr(views_mod, "time", Clock())
    app = create_app(settings, loop=False)
    solves = []
    real_plan = peers_mod.plan

    def counting_plan(*a, **kw):  # the real solver, counted
        solves.append(a[0])
        return real_plan(*a, **kw)

    monkeypatch.setattr(peers_mod, "plan", counting_plan)
    try:
        with TestClient(app, headers={"Content-Type": "application/json"}) as c:
            c.post("/api/v1/jobs", json={"id": "g", "workers": [H1, H2, H3], "ps": H4,
                                         "update_bytes": 50_000_000})  # fmt: skip
            skew[0] -= 3600.0  # time stands still for the polls of one view ...
            first = [c.get("/api/v1/jobs/g/peers").json() for _ in range(5)]
            assert all(f == first[0] for f in first) and len(solves) == 1, solves
            # every path out of leaf2 (H3's leaf) runs at 95%
            hot = [(ln["src"]["device"], ln["src"]["port"]) for ln in onos.links["links"]
                   if "device:leaf2" in (ln["src"]["device"], ln["dst"]["device"])]  # fmt: skip
            now = datetime.now(UTC)
            with (
                InfluxDBClient(url=influx.url, token="", org="-") as ic,
                ic.write_api(write_options=SYNCHRONOUS) as w,
            ):
                w.write(bucket=bucket, org="-", record=[
                    Point("int_link").tag("switch", ids[d]).tag("port", p)
                    .field("utilization", 0.95).time(now, WritePrecision.NS)
                    for d, p in hot
                ])  # fmt: skip
            skew[0] += 3601.0  # ... and then the view ages out
            after = c.get("/api/v1/jobs/g/peers").json()
    finally:
        app.state.service.close()
    assert len(solves) == 2
    before_row, after_row = first[0]["probabilities"][H1], after["probabilities"][H1]
    assert after_row[H2] > before_row[H2] + 0.1, (before_row, after_row)
