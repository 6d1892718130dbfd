"""The failures the control loop exists for, against the ONOS stand-in (real HTTP) and a real
InfluxDB: a switch that leaves re-places exactly the jobs that used it and blocks nothing
else; a crash between any two steps of an apply or a delete is repaired by one reconcile."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from agg_optimizer.placement.engine import STRATEGIES
from agg_optimizer.service.applier import Killed
from agg_optimizer.service.core import Service
from agg_optimizer.service.onos import intent_digest
from agg_optimizer.service.settings import Settings

from .conftest import make_settings
from .onos_standin import StandinOnos

H1, H2, H3, H4 = (f"00:00:00:00:00:0{i}/None" for i in range(1, 5))
APP = "org.innetagg.optimizer"
# a: workers on both leaves, PS on leaf2 (aggregates on a spine and leaf2 once the direct
# leaf link is down); b and s: small jobs between the leaves.
JOBS = [
    {"id": "a", "workers": [H1, H2, H3], "ps": H4, "update_bytes": 100_000_000},
    {"id": "b", "workers": [H3], "ps": H1, "update_bytes": 1_000_000},
    {"id": "s", "workers": [H2], "ps": H4, "update_bytes": 1_000_000},
]
SPINES = ("device:spine1", "device:spine2")


def spines_of(doc: dict[str, Any]) -> set[str]:
    return {n for p in doc["worker_paths"].values() for n in p if n in SPINES}


def intent_states(onos: StandinOnos) -> dict[str, str]:
    listed = onos.route("GET", f"/onos/v1/intents/application/{APP}", None)[1]["intents"]
    return {i["key"]: i["state"] for i in listed}


@pytest.fixture
def settings(onos: StandinOnos, influx: Any, bucket: str, tmp_path: Path) -> Settings:
    # Reads see ONOS as it is now (by default they may reuse a view up to 1 s old).
    return make_settings(onos, influx, bucket, tmp_path / "state.sqlite", view_max_age_s=0)


@pytest.fixture
def placed(client: TestClient, onos: StandinOnos) -> Service:
    onos.set_link("device:leaf1", "device:leaf2", "INACTIVE")  # every path over a spine
    for j in JOBS:
        assert client.post("/api/v1/jobs", json=j).status_code == 201
    res = client.post("/api/v1/placements", json={}).json()
    assert {r["status"] for r in res} == {"applied"}, res
    return client.app.state.service  # type: ignore[attr-defined,no-any-return]


def test_a_switch_that_leaves_re_places_its_jobs_and_blocks_nothing(
    client: TestClient, onos: StandinOnos, placed: Service
) -> None:
    svc = placed
    assert svc.step()["changed"] == []  # the loop's first look at the fabric
    before = {j["id"]: svc.store.current(j["id"])["placement"] for j in JOBS}
    gone = sorted(spines_of(before["a"]))[0]
    users = sorted(j for j, doc in before.items() if gone in spines_of(doc))
    onos.set_device(gone, False)
    # Every kind of request still answers: all jobs, one job, every strategy, dry runs.
    r = client.post("/api/v1/placements", json={"dry_run": True})
    assert r.status_code == 200, r.text
    assert {x["status"] for x in r.json()} == {"dry-run"}
    for x in r.json():
        assert gone not in spines_of(x["placement"]), x
    for strat in STRATEGIES:
        r = client.post("/api/v1/jobs/a/placement?dry_run=true")
        assert r.status_code == 200, (strat, r.text)
    assert client.get("/api/v1/jobs/a/what-if").status_code == 200
    # One loop pass re-places exactly the jobs that used the switch, around it.
    out = svc.step()
    assert out["trigger"] == "topology" and sorted(out["changed"]) == users, out
    assert out["unplaceable"] == {} and out["errors"] == {}, out
    for j in JOBS:
        cur = svc.store.current(j["id"])
        assert cur["status"] == "applied", cur
        assert gone not in spines_of(cur["placement"]), cur
        assert gone not in {a["switch"] for a in cur["placement"]["aggregators"]}
        if j["id"] not in users:
            assert cur["placement"] == before[j["id"]]
    assert set(intent_states(onos).values()) == {"INSTALLED"}
    # The switch returns: nothing moves back for a tie.
    onos.set_device(gone, True)
    out = svc.step()
    assert out["trigger"] == "topology" and out["changed"] == [], out


# --- a crash between any two steps --------------------------------------------------------


def agreement(svc: Service, onos: StandinOnos) -> None:
    """ONOS holds exactly what the store wants, and the store records it as applied."""
    jobs = {j["id"] for j in svc.store.jobs()}
    desired = svc.store.desired()
    assert set(desired) == jobs, (desired.keys(), jobs)
    want: dict[str, dict[str, Any]] = {}
    for jid in jobs:
        d = desired[jid]
        assert d["state"] == "converged", (jid, d["state"])
        cur = svc.store.current(jid)
        assert cur["status"] == "applied" and cur["placement"] == d["placement"], (jid, cur)
        want.update(d["bodies"])
        held = onos.aggregation[jid]
        pools = [a for jp in held["jobs"] for a in jp["aggregators"]]
        assert pools == d["placement"]["aggregators"], (jid, pools)
    ours = {k: b for (app, k), b in onos.intents.items() if app == APP}
    assert {k: intent_digest(b) for k, b in ours.items()} == {
        k: intent_digest(b) for k, b in want.items()
    }
    assert set(intent_states(onos).values()) <= {"INSTALLED"}
    assert set(onos.aggregation) == jobs
    owned = svc.store.owned()
    assert set(owned) == set(want) and not any(r for _, r in owned.values())


def move_a(client: TestClient, onos: StandinOnos, svc: Service) -> None:
    """Job a re-placed off the spine it uses (a link of it down)."""
    spine = sorted(spines_of(svc.store.current("a")["placement"]))[0]
    onos.set_link("device:leaf1", spine, "INACTIVE")
    client.post("/api/v1/jobs/a/placement")


def delete_b(client: TestClient, onos: StandinOnos, svc: Service) -> None:
    client.delete("/api/v1/jobs/b")


def steps_of(action: Any, client: TestClient, onos: StandinOnos, svc: Service) -> list[str]:
    seen: list[str] = []
    svc.applier.on_fault = lambda n, point: seen.append(point)
    action(client, onos, svc)
    svc.applier.on_fault = None
    return seen


@pytest.mark.parametrize("action", [move_a, delete_b], ids=["move", "delete"])
def test_a_crash_at_every_step_is_repaired_by_one_reconcile(
    onos: StandinOnos, settings: Settings, tmp_path: Path, action: Any
) -> None:
    from agg_optimizer.service.app import create_app

    def fresh(db: Path) -> tuple[TestClient, Service]:
        s = settings.model_copy(update={"db_path": db})
        app = create_app(s, loop=False)
        c = TestClient(app, headers={"Content-Type": "application/json"})
        c.__enter__()
        return c, app.state.service

    def setup(db: Path) -> tuple[TestClient, Service]:
        onos.intents.clear()
        onos.aggregation = {}
        onos.job_numbers.clear()
        onos.owner = None  # a fresh ONOS for each new database: no owner claim yet
        for ln in onos.links["links"]:
            ln["state"] = "ACTIVE"
        onos.set_link("device:leaf1", "device:leaf2", "INACTIVE")
        c, svc = fresh(db)
        for j in JOBS:
            assert c.post("/api/v1/jobs", json=j).status_code == 201
        assert {r["status"] for r in c.post("/api/v1/placements", json={}).json()} == {"applied"}
        return c, svc

    c, svc = setup(tmp_path / "trace.sqlite")
    points = steps_of(action, c, onos, svc)
    c.__exit__(None, None, None)
    svc.close()
    assert len(points) >= 5, points
    for n in range(1, len(points) + 1):
        c, svc = setup(tmp_path / f"kill{n}.sqlite")

        def die(hit: int, point: str, n: int = n) -> None:
            if hit == n:
                raise Killed(point)

        svc.applier._hits = 0
        svc.applier.on_fault = die
        with pytest.raises(Killed):
            action(c, onos, svc)
        # The process is gone: nothing of it runs on. A new one on the same database
        # reconciles at start.
        svc.applier.on_fault = None
        svc.close()
        c2, svc2 = fresh(tmp_path / f"kill{n}.sqlite")
        try:
            agreement(svc2, onos)
            # and nothing more to repair
            again = c2.post("/api/v1/reconcile").json()
            assert again["repaired"] == again["removed"] == again["resubmitted"] == [], again
        except AssertionError as e:
            raise AssertionError(f"killed at step {n} ({points[n - 1]}): {e}") from None
        finally:
            c2.__exit__(None, None, None)
            svc2.close()


# --- a hung InfluxDB ----------------------------------------------------------------------


@pytest.fixture
def hung_influx() -> Any:
    """A TCP server that accepts connections and never answers (InfluxDB hung)."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    t.join(5)
    for c in held:
        c.close()
    srv.close()


def test_a_hung_influxdb_never_holds_an_apply(
    onos: StandinOnos, influx: Any, bucket: str, tmp_path: Path, hung_influx: str
) -> None:
    """Once the readiness probe sees InfluxDB hang, applies and dry runs skip the query
    (placed on no-data defaults, saying so) and the decision goes to InfluxDB from its own
    thread, counted when it is lost."""
    import time

    from agg_optimizer.service.app import create_app

    s = make_settings(onos, influx, bucket, tmp_path / "db", influx_url=hung_influx)
    app = create_app(s, loop=False)
    with TestClient(app, headers={"Content-Type": "application/json"}) as c:
        svc: Service = app.state.service
        deadline = time.monotonic() + 120
        while svc.readiness().get("influxdb") == "ok" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert svc.readiness()["influxdb"] != "ok"
        assert c.post("/api/v1/jobs", json=JOBS[0]).status_code == 201
        res = c.post("/api/v1/jobs/a/placement").json()
        assert res["status"] == "applied", res
        assert res["telemetry"]["status"] == "unavailable"
        assert "readiness probe" in res["telemetry"]["reason"], res["telemetry"]
        dry = c.post("/api/v1/placements", json={"dry_run": True}).json()
        assert "readiness probe" in dry[0]["telemetry"]["reason"]
        assert svc.flush_decisions(120)
        assert svc.counters.get("decisions_unwritten") == 1
    svc.close()


def test_a_switch_that_returns_takes_load_when_the_jobs_gain_together(
    client: TestClient, onos: StandinOnos
) -> None:
    """Four equal jobs between the leaves all cross spine1 while spine2 is away. When it
    returns, each job judged alone on telemetry that shows no congestion gains nothing, so
    before, all stayed on spine1 until congestion showed. Judged together, sharing the
    fabric, spreading them halves their transfers: the loop moves some to spine2."""
    svc = client.app.state.service
    onos.set_link("device:leaf1", "device:leaf2", "INACTIVE")  # every path over a spine
    onos.set_device("device:spine2", False)
    jobs = [
        {"id": f"e{i}", "workers": [w], "ps": p, "update_bytes": 100_000_000}
        for i, (w, p) in enumerate([(H1, H3), (H2, H4), (H3, H1), (H4, H2)])
    ]
    for j in jobs:
        assert client.post("/api/v1/jobs", json=j).status_code == 201
    res = client.post("/api/v1/placements", json={}).json()
    assert {r["status"] for r in res} == {"applied"}, res
    assert svc.step()["changed"] == []
    for j in jobs:
        assert spines_of(svc.store.current(j["id"])["placement"]) == {"device:spine1"}
    onos.set_device("device:spine2", True)
    out = svc.step()
    assert out["trigger"] == "topology" and out["changed"], out
    on = {j["id"]: spines_of(svc.store.current(j["id"])["placement"]) for j in jobs}
    assert {"device:spine1"} in on.values() and {"device:spine2"} in on.values(), on
    assert set(intent_states(onos).values()) == {"INSTALLED"}
    # Nothing more to gain: the next pass keeps them.
    assert svc.step()["changed"] == []
