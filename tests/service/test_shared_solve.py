"""Per-job dry runs of jobs of one strategy all need that group's joint solve; concurrent
ones share it instead of each repeating it (at 50 clients over 6 jobs that tripled the
answers per second, docs/benchmarks/service-load.md). Sharing must not change an answer:
each request still gets exactly what it gets alone."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

import agg_optimizer.service.planner as planner
from agg_optimizer.service.app import create_app
from int_collector.influxd import InfluxServer

from .conftest import make_settings
from .onos_standin import StandinOnos

HOSTS = [f"00:00:00:00:00:0{i}/None" for i in range(1, 5)]
JOBS = {
    "a": {"workers": HOSTS[:2], "ps": HOSTS[3]},
    "b": {"workers": HOSTS[1:3], "ps": HOSTS[0]},
    "c": {"workers": [HOSTS[0], HOSTS[2]], "ps": HOSTS[1]},
}


@pytest.fixture
def svc_client(onos: StandinOnos, influx: InfluxServer, bucket: str, tmp_path: Path) -> Any:
    s = make_settings(
        onos, influx, bucket, tmp_path / "db.sqlite", dry_run_cache=False, view_max_age_s=3600
    )  # one view throughout: answers comparable
    app = create_app(s, loop=False)
    with TestClient(app, headers={"Content-Type": "application/json"}) as c:
        for jid, spec in JOBS.items():
            r = c.post("/api/v1/jobs", json={"id": jid, "update_bytes": 10_000_000, **spec})
            assert r.status_code == 201, r.text
        assert c.post("/api/v1/placements", json={}).status_code == 200
        yield app.state.service, c
    app.state.service.close()


def test_concurrent_per_job_dry_runs_share_their_groups_solve(
    svc_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc, _ = svc_client
    alone = {j: svc.dry_run_json([j]) for j in JOBS}  # one at a time: one solve each

    calls: list[int] = []
    release = threading.Event()
    real = planner.solve

    def held_solve(instance: Any, strategy: str, **kw: Any) -> Any:
        calls.append(len(instance.jobs))
        assert release.wait(120), "the solve was never released"
        return real(instance, strategy, **kw)

    monkeypatch.setattr(planner, "solve", held_solve)
    out: dict[str, bytes] = {}
    threads = [
        threading.Thread(target=lambda j=j: out.__setitem__(j, svc.dry_run_json([j]))) for j in JOBS
    ]
    threads[0].start()
    deadline = time.monotonic() + 120
    while not calls:  # the first request is solving the group (held)
        assert time.monotonic() < deadline, "no solve started"
        time.sleep(0.01)
    for t in threads[1:]:
        t.start()
    # The others wait on that solve's future (its condition's waiters), not on their own.
    (flight,) = svc.planner._solve_flight.values()
    while len(flight._condition._waiters) < len(JOBS) - 1:
        assert time.monotonic() < deadline, f"only {len(flight._condition._waiters)} joined"
        assert len(calls) == 1, "a second solve started"
        time.sleep(0.01)
    release.set()
    for t in threads:
        t.join(120)
    assert calls == [len(JOBS)], calls  # one joint solve of the group, for all three
    assert out == alone  # each answer is the one it gets alone
    assert not svc.planner._solve_flight  # nothing kept: the next request solves again
    assert svc.dry_run_json(["a"]) == alone["a"] and calls == [3, 3]


def test_a_failed_shared_solve_fails_every_request_that_waited_for_it(
    svc_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc, c = svc_client
    started = threading.Event()
    release = threading.Event()

    def failing(instance: Any, strategy: str, **kw: Any) -> Any:
        started.set()
        assert release.wait(120)
        raise RuntimeError("solver exploded")

    monkeypatch.setattr(planner, "solve", failing)
    errors: dict[str, str] = {}

    def run(j: str) -> None:
        try:
            svc.dry_run_json([j])
        except RuntimeError as e:
            errors[j] = str(e)

    threads = [threading.Thread(target=run, args=(j,)) for j in JOBS]
    threads[0].start()
    assert started.wait(120)
    for t in threads[1:]:
        t.start()
    (flight,) = svc.planner._solve_flight.values()
    deadline = time.monotonic() + 120
    while len(flight._condition._waiters) < len(JOBS) - 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    release.set()
    for t in threads:
        t.join(120)
    assert errors == dict.fromkeys(JOBS, "solver exploded")
    assert not svc.planner._solve_flight
    monkeypatch.undo()  # the real solver again: the service answers as before
    r = c.post("/api/v1/jobs/a/placement?dry_run=true")
    assert r.status_code == 200 and r.json()["status"] == "dry-run"
