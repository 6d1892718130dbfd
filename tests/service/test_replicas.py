"""Replicas of the service on one PostgreSQL (issue 33, item 2): real `agg-optimizer serve`
processes, a real PostgreSQL (Debian's, `.ci/run` installs it), the ONOS stand-in over
real HTTP and a real InfluxDB.

Any replica serves the API, changes included, serialised through the database (its apply
lock), not a process lock; one leader, elected by a lease row in the database, runs the
control loop, the scheduler and reconcile; SIGKILL the leader and another leads within two
loop periods, with nothing lost and no intent withdrawn. The store's semantics are the same
on SQLite and PostgreSQL (`test_store_backends.py`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from agg_optimizer.service.app import create_app
from int_collector import children
from int_collector.influxd import InfluxServer, free_port

from . import pgserver
from .conftest import Served, make_settings
from .onos_standin import StandinOnos
from .test_failures import APP, JOBS, spines_of
from .test_second_instance import ours

pytestmark = pytest.mark.skipif(
    pgserver.skip_reason() is not None, reason=str(pgserver.skip_reason())
)

LOOP_S = 5.0  # the control loop's period here: failover must take under two of them


@pytest.fixture
def pg(tmp_path: Path) -> Iterator[pgserver.PgServer]:
    with pgserver.PgServer(tmp_path) as server:
        yield server


def replica(serve: Any, pg: pgserver.PgServer, **env: str) -> Served:
    return serve(
        "unused.sqlite",
        AGG_OPTIMIZER_DATABASE_URL=pg.url,
        AGG_OPTIMIZER_REOPTIMIZE_PERIOD_S=str(LOOP_S),
        AGG_OPTIMIZER_MIN_IMPROVEMENT="0",
        **env,
    )


def role(s: Served) -> str:
    return str(s.api("GET", "/readyz").json()["role"])


def intent_deletes(onos: StandinOnos) -> list[str]:
    return [p for m, p in list(onos.requests) if m == "DELETE" and "/intents/" in p]


def test_any_replica_serves_changes_one_at_a_time(
    pg: pgserver.PgServer, serve: Any, onos: StandinOnos
) -> None:
    a = replica(serve, pg)
    b = replica(serve, pg)
    assert role(a) == "leader" and role(b).startswith("standby"), (role(a), role(b))
    onos.set_link("device:leaf1", "device:leaf2", "INACTIVE")
    # Jobs created through either replica; the same id from both at once: one wins
    assert a.api("POST", "/api/v1/jobs", json=JOBS[0]).status_code == 201
    assert b.api("POST", "/api/v1/jobs", json=JOBS[1]).status_code == 201
    codes: list[int] = []
    racers = [
        threading.Thread(target=lambda s=s: codes.append(
            s.api("POST", "/api/v1/jobs", json=JOBS[2]).status_code))
        for s in (a, b)
    ]  # fmt: skip
    for t in racers:
        t.start()
    for t in racers:
        t.join()
    assert sorted(codes) == [201, 409], codes
    assert {j["id"] for j in a.api("GET", "/api/v1/jobs").json()} == {"a", "b", "s"}
    # Placements from both replicas at the same time: every one applied, ONOS holds
    # exactly what the shared database says it should
    got: dict[str, Any] = {}

    def place(s: Served, job: str) -> None:
        got[job] = s.api("POST", f"/api/v1/jobs/{job}/placement").json()

    threads = [
        threading.Thread(target=place, args=(s, j)) for s, j in ((a, "a"), (b, "b"), (b, "s"))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {j: r["status"] for j, r in got.items()} == dict.fromkeys("abs", "applied"), got
    held = ours(onos)
    assert len(held) == 2 * 5  # 5 workers, an intent each way
    assert sorted(onos.job_numbers) == ["a", "b", "s"]
    assert len(set(onos.job_numbers.values())) == 3, onos.job_numbers
    # Read through one, change through the other: the same state
    for job in "abs":
        pa = a.api("GET", f"/api/v1/jobs/{job}/placement").json()
        pb = b.api("GET", f"/api/v1/jobs/{job}/placement").json()
        assert pa == pb, (pa, pb)
    r = b.api("DELETE", "/api/v1/jobs/a")
    assert r.status_code == 200, r.text
    assert a.api("GET", "/api/v1/jobs/a").status_code == 404
    assert all(not k.startswith("ia-a-") for k in ours(onos)), ours(onos)
    assert "a" not in (onos.aggregation or {})
    again = a.api("POST", "/api/v1/reconcile").json()
    assert again["repaired"] == again["resubmitted"] == again["removed"] == [], again


def test_the_leader_killed_another_leads_within_two_loop_periods(
    pg: pgserver.PgServer, serve: Any, onos: StandinOnos
) -> None:
    a = replica(serve, pg)
    b = replica(serve, pg)
    assert role(a) == "leader"
    onos.set_link("device:leaf1", "device:leaf2", "INACTIVE")
    for j in JOBS:
        assert b.api("POST", "/api/v1/jobs", json=j).status_code == 201
    res = b.api("POST", "/api/v1/placements", json={}).json()
    assert {r["status"] for r in res} == {"applied"}, res
    held = ours(onos)
    before = {j: b.api("GET", f"/api/v1/jobs/{j}/placement").json() for j in "abs"}
    deletes = len(intent_deletes(onos))

    a.proc.kill()  # SIGKILL: no release of the lease, its database sessions cut
    t0 = time.monotonic()
    a.proc.wait(30)

    def leads() -> bool:
        return role(b) == "leader"

    children.wait_ready(leads, "the standby leading", timeout_s=4 * LOOP_S, proc=b.proc,
                        log=b.log, poll_s=0.05)  # fmt: skip
    took = time.monotonic() - t0
    print(f"failover took {took:.2f} s (loop period {LOOP_S} s)")
    assert took < 2 * LOOP_S, f"failover took {took:.1f} s, over two loop periods"
    # Nothing lost, nothing withdrawn
    assert ours(onos) == held
    assert len(intent_deletes(onos)) == deletes, intent_deletes(onos)[deletes:]
    for j in "abs":
        assert b.api("GET", f"/api/v1/jobs/{j}/placement").json() == before[j]
    # The new leader runs the loop: congestion on job a's spine moves it
    spine = sorted(spines_of(before["a"]["placement"]))[0]
    onos.set_link("device:leaf1", spine, "INACTIVE")

    def moved() -> bool:
        cur = b.api("GET", "/api/v1/jobs/a/placement").json()
        return cur["status"] == "applied" and spine not in spines_of(cur["placement"])

    children.wait_ready(moved, "the new leader's loop moving job a", timeout_s=120,
                        proc=b.proc, log=b.log)  # fmt: skip
    # The killed replica comes back as a standby and sees the move
    a2 = replica(serve, pg)
    assert role(a2).startswith("standby") and role(b) == "leader"
    assert (
        a2.api("GET", "/api/v1/jobs/a/placement").json()
        == b.api("GET", "/api/v1/jobs/a/placement").json()
    )
    assert {k for k in ours(onos) if not k.startswith("ia-a-")} == {
        k for k in held if not k.startswith("ia-a-")
    }


def test_the_database_down_is_a_503_and_recovers(
    pg: pgserver.PgServer, serve: Any, onos: StandinOnos
) -> None:
    a = replica(serve, pg)
    assert a.api("POST", "/api/v1/jobs", json=JOBS[1]).status_code == 201
    pg.kill()

    def down() -> bool:
        return a.api("GET", "/readyz").json()["checks"]["database"] != "ok"

    children.wait_ready(down, "readyz reporting the database", timeout_s=60, proc=a.proc,
                        log=a.log)  # fmt: skip
    r = a.api("GET", "/api/v1/jobs")
    assert r.status_code == 503 and "PostgreSQL" in r.json()["detail"], r.text
    assert "Traceback" not in a.log.read_text()
    r = a.api("POST", "/api/v1/jobs", json=JOBS[2])
    assert r.status_code == 503, r.text
    pg.start()

    def up() -> bool:
        return a.api("GET", "/api/v1/jobs").status_code == 200

    children.wait_ready(up, "the service reading again", timeout_s=60, proc=a.proc, log=a.log)
    assert [j["id"] for j in a.api("GET", "/api/v1/jobs").json()] == ["b"]
    assert a.api("POST", "/api/v1/jobs", json=JOBS[2]).status_code == 201
    assert role(a) == "leader"
    # The database gone again as the service stops (SIGTERM): it stops all the same, exit
    # status 0 or SIGTERM's, its lease left to expire (uvicorn logged "Application shutdown
    # failed" before: releasing the lease raised)
    pg.kill()
    status = children.stop(a.proc, timeout_s=30)
    assert status in (0, -15), (status, a.log.read_text()[-2000:])
    text = a.log.read_text()
    assert "not released" in text and "shutdown failed" not in text, text[-2000:]


def test_several_onos_urls_any_live_node_serves(
    onos: StandinOnos, influx: InfluxServer, bucket: str, tmp_path: Path
) -> None:
    from fastapi.testclient import TestClient

    dead = f"http://127.0.0.1:{free_port()}/onos/v1"
    s = make_settings(onos, influx, bucket, tmp_path / "db", onos_url=f"{dead}, {onos.url}")
    app = create_app(s, loop=False)
    with TestClient(app, headers={"Content-Type": "application/json"}) as c:
        assert c.get("/readyz").json()["checks"]["onos"] == "ok"
        onos.set_link("device:leaf1", "device:leaf2", "INACTIVE")
        assert c.post("/api/v1/jobs", json=JOBS[1]).status_code == 201
        assert c.post("/api/v1/jobs/b/placement").json()["status"] == "applied"
        assert any(k.startswith("ia-b-") for k in ours(onos))
        onos.stop()  # no node left
        r = c.post("/api/v1/jobs/b/placement")
        assert r.status_code == 503 and "tried 2 nodes" in r.json()["detail"], r.text
    app.state.service.close()
    assert APP in {a for a, _ in onos.intents}
    with pytest.raises(requests.ConnectionError):
        requests.get(onos.url, timeout=2)
