"""One slot ledger for every job, whatever strategy placed it: two jobs' pools never overlap
on a switch, neither in the placements the service keeps nor in what reaches the ONOS app.
Before, each strategy's jobs were solved on their own and both an `agg` and a `switchml`
job got pool 0..127 on the same switch: on a real switch both would sum into the same
registers."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from fastapi.testclient import TestClient

from agg_optimizer.model.documents import JobPlacement

from .onos_standin import StandinOnos

H1, H2, H3, H4 = (f"00:00:00:00:00:0{i}/None" for i in range(1, 5))


def job(jid: str, strategy: str, **kw: Any) -> dict[str, Any]:
    return {
        "id": jid,
        "workers": [H1, H2],
        "ps": H4,
        "update_bytes": 10_000_000,
        "strategy": strategy,
        **kw,
    }


def pools(client: TestClient, jid: str) -> dict[str, tuple[int, int]]:
    r = client.get(f"/api/v1/jobs/{jid}/placement")
    assert r.status_code == 200, r.text
    cur = r.json()
    assert cur["status"] == "applied", cur
    return {
        a["switch"]: (a["pool"]["base"], a["pool"]["base"] + a["pool"]["size"])
        for a in cur["placement"]["aggregators"]
    }


def pushed(onos: StandinOnos, jid: str) -> dict[str, tuple[int, int]]:
    """The pools the ONOS app was given for the job."""
    assert onos.aggregation is not None
    doc = onos.aggregation[jid]
    (jp,) = [j for j in doc["jobs"] if j["job_id"] == jid]
    return {
        a["switch"]: (a["pool"]["base"], a["pool"]["base"] + a["pool"]["size"])
        for a in jp["aggregators"]
    }


def assert_disjoint(*by_job: dict[str, tuple[int, int]]) -> int:
    """No two jobs' pools overlap on any switch; returns how many switches hold several."""
    shared = 0
    switches = set().union(*by_job)
    for sw in switches:
        spans = sorted(p[sw] for p in by_job if sw in p)
        shared += len(spans) > 1
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end <= start, f"{sw}: pools overlap: {spans}"
        assert all(0 <= lo < hi <= 1024 for lo, hi in spans), spans
    return shared


@pytest.fixture
def app_onos(onos: StandinOnos) -> StandinOnos:
    onos.aggregation = {}  # the aggregation app installed
    return onos


def test_mixed_strategies_placed_together_share_switches_without_overlap(
    client: TestClient, app_onos: StandinOnos
) -> None:
    for jid, strat in (("a", "agg"), ("b", "switchml"), ("c", "sharp")):
        assert client.post("/api/v1/jobs", json=job(jid, strat)).status_code == 201
    r = client.post("/api/v1/placements", json={})
    assert r.status_code == 200, r.text
    assert {x["status"] for x in r.json()} == {"applied"}, r.text
    kept = [pools(client, j) for j in "abc"]
    sent = [pushed(app_onos, j) for j in "abc"]
    assert kept == sent
    # Same workers and PS: the strategies aggregate on common switches, and there the
    # pools are one after another.
    assert assert_disjoint(*kept) >= 1


def test_a_job_placed_alone_avoids_the_pools_of_applied_jobs_of_other_strategies(
    client: TestClient, app_onos: StandinOnos
) -> None:
    assert client.post("/api/v1/jobs", json=job("a", "agg")).status_code == 201
    assert client.post("/api/v1/jobs/a/placement").status_code == 200
    assert client.post("/api/v1/jobs", json=job("b", "switchml")).status_code == 201
    r = client.post("/api/v1/jobs/b/placement")
    assert r.status_code == 200 and r.json()["status"] == "applied", r.text
    a, b = pools(client, "a"), pools(client, "b")
    assert set(a) & set(b), (a, b)  # a common switch, else the test shows nothing
    assert_disjoint(a, b)
    assert pushed(app_onos, "b") == b
    # A dry run for a third job sees both as held.
    assert client.post("/api/v1/jobs", json=job("c", "atp")).status_code == 201
    r = client.post("/api/v1/placements", json={"jobs": ["c"], "dry_run": True})
    assert r.status_code == 200, r.text
    c = {
        x["switch"]: (x["pool"]["base"], x["pool"]["base"] + x["pool"]["size"])
        for x in r.json()[0]["placement"]["aggregators"]
    }
    assert_disjoint(a, b, c)


def test_a_job_re_placed_alone_avoids_its_own_strategys_applied_pools(
    client: TestClient, app_onos: StandinOnos
) -> None:
    for jid in "ac":
        assert client.post("/api/v1/jobs", json=job(jid, "agg")).status_code == 201
    assert client.post("/api/v1/placements", json={}).status_code == 200
    assert_disjoint(pools(client, "a"), pools(client, "c"))
    # c alone, with another strategy, then back: a's applied pools stay a's.
    assert client.put("/api/v1/jobs/c/strategy", json={"strategy": "switchml"}).status_code == 200
    assert client.post("/api/v1/jobs/c/placement").status_code == 200
    assert_disjoint(pools(client, "a"), pools(client, "c"))
    assert client.put("/api/v1/jobs/c/strategy", json={"strategy": "agg"}).status_code == 200
    assert client.post("/api/v1/jobs/c/placement").status_code == 200
    assert_disjoint(pools(client, "a"), pools(client, "c"))


def test_scarce_slots_one_pool_per_switch(client: TestClient, app_onos: StandinOnos) -> None:
    # 600 of a switch's 1024 slots each: no switch can hold two of these pools.
    for jid, strat in (("a", "agg"), ("b", "switchml")):
        r = client.post("/api/v1/jobs", json=job(jid, strat, pool_slots=600))
        assert r.status_code == 201, r.text
    assert client.post("/api/v1/jobs/a/placement").status_code == 200
    assert client.post("/api/v1/jobs/b/placement").status_code == 200
    a, b = pools(client, "a"), pools(client, "b")
    assert a, "a aggregates somewhere"
    assert not set(a) & set(b), (a, b)
    # Together, too.
    assert client.post("/api/v1/placements", json={}).status_code == 200
    a, b = pools(client, "a"), pools(client, "b")
    assert not set(a) & set(b), (a, b)


def test_a_job_the_loop_moves_never_takes_the_pool_of_a_job_it_keeps(
    client: TestClient, app_onos: StandinOnos, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop solves all placed jobs together and then keeps those whose move does not
    pay; the joint solution gave the movers pools as if the kept ones' were free. Here it
    gives job a exactly the pools job b holds, and only a's move pays: a must be placed
    again around b's pools (before, a was applied on b's registers)."""
    for jid in ("a", "b"):
        assert client.post("/api/v1/jobs", json=job(jid, "agg")).status_code == 201
    assert client.post("/api/v1/placements", json={}).status_code == 200
    svc = client.app.state.service
    b_doc = svc.store.current("b")["placement"]
    assert b_doc["aggregators"], "b aggregates somewhere"
    real = svc.planner.compute
    calls: list[list[str]] = []

    def compute(view: Any, ids: Any, strategy: Any = None, unplaceable: Any = None) -> Any:
        calls.append(sorted(ids))
        out = real(view, ids, strategy, unplaceable)
        if len(calls) == 1:
            strat, placement = out["a"]
            clash = JobPlacement.model_validate({**b_doc, "job_id": "a"})
            jobs = [clash if jp.job_id == "a" else jp for jp in placement.jobs]
            out["a"] = (strat, placement.model_copy(update={"jobs": jobs}))
        return out

    monkeypatch.setattr(svc.planner, "compute", compute)
    monkeypatch.setattr(svc, "_worth_moving", lambda _v, job, _o, _n: job["id"] == "a")
    out = svc.step()
    assert calls == [["a", "b"], ["a"]], calls
    assert "a" in out["changed"] and "b" not in out["changed"], out
    assert svc.store.current("b")["placement"]["aggregators"] == b_doc["aggregators"]
    assert_disjoint(pools(client, "a"), pools(client, "b"))
    assert_disjoint(pushed(app_onos, "a"), pushed(app_onos, "b"))
