"""Two jobs never sum into the same registers: the invariant at each layer that decides, each
able to refuse on its own (docs/service.md, "Invariants").

- the loop: whatever it keeps and moves, no mover's new pool overlaps a pool another job
  holds (a deterministic case of the bug found from outside, and a property test of
  `ControlLoop.around_stayers` against a model of the service);
- the store: a desired placement that overlaps another job's claim is refused in the
  transaction that would record it, by the database's own constraint too;
- the ONOS app (its stand-in here; tests/onos for the real one): 409 naming both jobs;
- reconcile: overlaps already recorded are found, reported by /healthz and repaired.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agg_optimizer.model.documents import JobPlacement, SlotPool
from agg_optimizer.model.pools import doc_claims, overlaps
from agg_optimizer.service.errors import PoolConflict
from agg_optimizer.service.loop import ControlLoop
from agg_optimizer.service.store import Store

from .onos_standin import StandinOnos
from .test_slot_ledger import assert_disjoint, job, pools, pushed


def _with_pools(doc: dict[str, Any], jid: str) -> JobPlacement:
    return JobPlacement.model_validate({**doc, "job_id": jid})


def test_a_mover_dropped_after_the_re_solve_keeps_its_pools_from_the_other_movers(
    client: TestClient, onos: StandinOnos, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The case found from outside (job j0 moved onto the slots j17 kept): the joint solve
    gives `a` the pools of `b`, which stays; solved again without b's pools, `a` gets the
    pools `c` holds now, and then c's move no longer pays, so c keeps them. Before, nothing
    checked a's new pools against c's again: both were applied on the same registers."""
    for jid in "abc":
        assert client.post("/api/v1/jobs", json=job(jid, "agg")).status_code == 201
    assert client.post("/api/v1/placements", json={}).status_code == 200
    svc = client.app.state.service
    docs = {j: svc.store.current(j)["placement"] for j in "abc"}
    assert all(d["aggregators"] for d in docs.values())
    assert_disjoint(*(pools(client, j) for j in "abc"))
    real = svc.planner.compute
    calls: list[list[str]] = []

    def compute(view: Any, ids: Any, strategy: Any = None, unplaceable: Any = None) -> Any:
        calls.append(sorted(ids))
        out = real(view, ids, strategy, unplaceable)
        # First a takes b's pools and c a's; solved again, a takes c's.
        forced = {1: {"a": docs["b"], "c": docs["a"]}, 2: {"a": docs["c"]}}.get(len(calls), {})
        for jid, doc in forced.items():
            strat, placement = out[jid]
            jobs = [_with_pools(doc, jid) if jp.job_id == jid else jp for jp in placement.jobs]
            out[jid] = (strat, placement.model_copy(update={"jobs": jobs}))
        return out

    judged: dict[str, int] = {}

    def worth(_v: Any, job: dict, _o: Any, _n: Any) -> bool:
        judged[job["id"]] = judged.get(job["id"], 0) + 1
        return job["id"] == "a" or (job["id"] == "c" and judged["c"] == 1)

    monkeypatch.setattr(svc.planner, "compute", compute)
    monkeypatch.setattr(svc, "_worth_moving", worth)
    out = svc.step()
    assert calls[:2] == [["a", "b", "c"], ["a", "c"]], calls
    assert len(calls) == 3 and calls[2] == ["a"], calls  # solved again once c stayed
    assert out["changed"] == ["a"], out
    for j in "bc":
        assert svc.store.current(j)["placement"]["aggregators"] == docs[j]["aggregators"]
    assert_disjoint(*(pools(client, j) for j in "abc"))
    assert_disjoint(*(pushed(onos, j) for j in "abc"))
    assert svc.store.overlaps() == []


# --- property: around_stayers against a model of the service ------------------------------

SWITCHES = ("s1", "s2")
SLOTS = 8


class _Store:
    def __init__(self, current: dict[str, JobPlacement]) -> None:
        self.cur = current

    def jobs(self) -> list[dict[str, Any]]:
        return [{"id": j} for j in sorted(self.cur)]

    def job(self, jid: str) -> dict[str, Any]:
        return {"id": jid}

    def current(self, jid: str) -> dict[str, Any]:
        return {"status": "applied", "placement": self.cur[jid].model_dump(mode="json")}


class _Model:
    """What `around_stayers` uses of the service: the store's current placements, the
    planner's `held` (the pools of the jobs not asked), and `compute`, which keeps its word
    (asked jobs get pools clear of the others' and of each other's, or none) but is
    otherwise chosen by hypothesis, as is every `_worth_moving` answer."""

    def __init__(self, current: dict[str, JobPlacement], data: st.DataObject) -> None:
        self.store = _Store(current)
        self.data = data
        self.planner = self  # its `held`

    def held(self, jobs: list[dict], wanted: set[str]) -> dict[str, list[tuple[str, SlotPool]]]:
        out: dict[str, list[tuple[str, SlotPool]]] = {}
        for j in jobs:
            if j["id"] not in wanted:
                for a in self.store.cur[j["id"]].aggregators:
                    out.setdefault(a.switch, []).append((j["id"], a.pool))
        return out

    def compute(self, _view: Any, ids: list[str], unplaceable: Any = None) -> dict[str, Any]:
        taken = {
            sw: {s for _, p in ps for s in range(p.base, p.base + p.size)}
            for sw, ps in self.held(self.store.jobs(), set(ids)).items()
        }
        out = {}
        for jid in ids:
            if self.data.draw(st.booleans(), label=f"{jid} unplaceable"):
                continue
            aggs = []
            for sw in self.data.draw(st.sets(st.sampled_from(SWITCHES), min_size=1)):
                free = [b for b in range(SLOTS) if b not in taken.setdefault(sw, set())]
                if not free:
                    continue
                b = self.data.draw(st.sampled_from(free), label=f"{jid} base on {sw}")
                taken[sw].add(b)
                aggs.append(_agg(sw, b, 1))
            jp = _placement(jid, aggs)
            out[jid] = ("agg", _Placement([jp]))
        return out

    def _worth_moving(self, _view: Any, job: dict, _old: Any, _new: Any) -> bool:
        return self.data.draw(st.booleans(), label=f"worth moving {job['id']}")


class _Placement:
    def __init__(self, jobs: list[JobPlacement]) -> None:
        self.jobs = jobs


def _agg(sw: str, base: int, size: int) -> dict[str, Any]:
    return {
        "switch": sw,
        "children": ["h1"],
        "fan_in": 1,
        "next_hop": "h9",
        "pool": {"base": base, "size": size},
    }


def _placement(jid: str, aggs: list[dict[str, Any]]) -> JobPlacement:
    return JobPlacement.model_validate(
        {
            "job_id": jid,
            "aggregators": aggs,
            "worker_paths": {},
            "ps_fan_in": 1,
            "predicted_cct_s": 1.0,
            "surrogate_s": 1.0,
        }
    )


@st.composite
def _scenario(draw: st.DrawFn) -> tuple[dict[str, JobPlacement], set[str], dict[str, JobPlacement]]:
    """Jobs with disjoint current pools; which the loop keeps; the joint solve's new pools
    (disjoint among themselves, anywhere relative to the current ones)."""
    n = draw(st.integers(2, 6))
    jobs = [f"j{i}" for i in range(n)]
    free = {sw: list(range(SLOTS)) for sw in SWITCHES}
    fresh = {sw: list(range(SLOTS)) for sw in SWITCHES}
    current, new = {}, {}
    for jid in jobs:
        for pools_left, into in ((free, current), (fresh, new)):
            aggs = []
            for sw in SWITCHES:
                if pools_left[sw] and draw(st.booleans()):
                    b = draw(st.sampled_from(pools_left[sw]))
                    pools_left[sw].remove(b)
                    aggs.append(_agg(sw, b, 1))
            into[jid] = _placement(jid, aggs)
    stay = set(draw(st.sets(st.sampled_from(jobs))))
    return current, stay, new


def _no_overlap(current: dict[str, JobPlacement], moves: dict[str, Any]) -> list[Any]:
    claims = []
    for jid, jp in current.items():
        doc = (moves[jid][1] if jid in moves else jp).model_dump(mode="json")
        claims += doc_claims(jid, doc)
    return overlaps(claims)


@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
@given(_scenario(), st.data())
def test_whatever_the_loop_keeps_and_moves_no_two_jobs_share_a_slot(
    case: tuple[dict[str, JobPlacement], set[str], dict[str, JobPlacement]], data: st.DataObject
) -> None:
    current, stay_ids, new = case
    model = _Model(current, data)
    moves = {j: ("agg", jp) for j, jp in new.items() if j not in stay_ids}
    stay = {j: current[j].model_dump(mode="json")["aggregators"] for j in stay_ids}
    kept: list[str] = []
    loop = ControlLoop(model)  # type: ignore[arg-type]
    loop.around_stayers(None, moves, stay, kept)  # type: ignore[arg-type]
    assert _no_overlap(current, moves) == []
    assert not set(moves) & set(kept)


# --- the store ------------------------------------------------------------------------------


def _doc(jid: str, *pools: tuple[str, int, int]) -> dict[str, Any]:
    return _placement(jid, [_agg(sw, lo, hi - lo) for sw, lo, hi in pools]).model_dump(mode="json")


def test_the_store_refuses_a_desired_pool_another_job_holds(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    for j in "ab":
        store.add_job(j, {"id": j}, "agg")
    gen = store.set_desired("a", "agg", _doc("a", ("leaf1", 0, 128)), {})
    store.converge("a", gen, "agg", "applied", None, _doc("a", ("leaf1", 0, 128)))
    before = store.desired()
    with pytest.raises(PoolConflict, match=r"job 'a' slots \[0, 128\).*job 'b'"):
        store.set_desired("b", "agg", _doc("b", ("leaf1", 64, 192)), {})
    assert store.desired() == before  # nothing recorded
    # Another switch, or the same switch's free slots: accepted.
    store.set_desired("b", "agg", _doc("b", ("leaf1", 128, 256), ("spine1", 0, 128)), {})
    # a's own move may overlap its own pools (old and new held while it moves).
    store.set_desired("a", "agg", _doc("a", ("leaf1", 64, 128)), {})
    # While a's apply is pending, both its pools are held: b cannot take a's old slots.
    with pytest.raises(PoolConflict):
        store.set_desired("b", "agg", _doc("b", ("leaf1", 0, 64)), {})
    assert store.overlaps() == []


def test_the_database_itself_refuses_overlapping_claims(tmp_path: Path) -> None:
    """The layer under the store's own check: a row written past it is refused by SQLite
    (the PostgreSQL exclusion constraint: test_store_backends.py)."""
    store = Store(tmp_path / "s.sqlite")
    store.add_job("a", {"id": "a"}, "agg")
    store.set_desired("a", "agg", _doc("a", ("leaf1", 0, 128)), {})
    store.close()
    db = sqlite3.connect(tmp_path / "s.sqlite")
    with pytest.raises(sqlite3.IntegrityError, match="pools_disjoint"):
        db.execute("INSERT INTO pools VALUES ('b', 'leaf1', 100, 200)")
    db.execute("INSERT INTO pools VALUES ('b', 'leaf1', 128, 200)")  # adjacent is fine
    db.execute("INSERT INTO pools VALUES ('a', 'leaf1', 100, 128)")  # its own
    db.close()


def test_a_store_from_before_the_ledger_with_an_overlap_is_opened_and_reports_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.sqlite"
    store = Store(path)
    for j in "ab":
        store.add_job(j, {"id": j}, "agg")
    store.close()
    # Written as an older version did: no ledger, and two placements on the same slots.
    db = sqlite3.connect(path)
    db.execute("DROP TABLE pools")
    db.execute("DELETE FROM meta WHERE key = 'pools_ledger'")
    for j in "ab":
        db.execute(
            "INSERT INTO placements (job_id, strategy, status, reason, doc, created) "
            "VALUES (?, 'agg', 'applied', NULL, ?, 0)",
            (j, json.dumps(_doc(j, ("leaf1", 0, 128)))),
        )
    db.commit()
    db.close()
    store = Store(path)
    (pair,) = store.overlaps()
    assert {pair[0][0], pair[1][0]} == {"a", "b"}
    # The earlier job keeps the contested pool in the ledger; the later one can move away.
    store.set_desired("b", "agg", _doc("b", ("leaf1", 128, 256)), {})
    with pytest.raises(PoolConflict):
        store.set_desired("b", "agg", _doc("b", ("leaf1", 0, 64)), {})


# --- the ONOS app's refusal, and reconcile -------------------------------------------------


def test_the_app_refuses_an_overlapping_document_naming_both_jobs(
    client: TestClient, onos: StandinOnos
) -> None:
    """The ONOS app's check, met through the service: the store and the planner are
    bypassed (a document written into the app behind the service's back)."""
    assert client.post("/api/v1/jobs", json=job("a", "agg")).status_code == 201
    assert client.post("/api/v1/jobs/a/placement").status_code == 200
    svc = client.app.state.service
    jp = JobPlacement.model_validate({**svc.store.current("a")["placement"], "job_id": "z"})
    from agg_optimizer.service.onos import OnosError

    with pytest.raises(OnosError) as e:
        svc.applier.aggregation.apply(jp, "agg")
    assert e.value.status == 409
    assert "job 'z'" in str(e.value) and "job 'a'" in str(e.value), e.value


def test_reconcile_repairs_an_overlap_already_recorded_and_healthz_says_so(
    client: TestClient, onos: StandinOnos
) -> None:
    """Overlapping pools that reached the record (written by a version before the ledger,
    or by hand) are reported by /healthz as degraded, and reconcile re-places the later job
    around the earlier one's pools."""
    for jid in "ab":
        assert client.post("/api/v1/jobs", json=job(jid, "agg")).status_code == 201
        assert client.post(f"/api/v1/jobs/{jid}/placement").status_code == 200
    svc = client.app.state.service
    a = svc.store.current("a")
    forged = {**a["placement"], "job_id": "b"}
    # Past every check: straight into the tables, as a store from before the ledger holds it.
    svc.store._db.run("DELETE FROM pools WHERE job_id = 'b'")
    svc.store._db.run(
        "INSERT INTO placements (job_id, strategy, status, reason, doc, created) "
        "VALUES ('b', 'agg', 'applied', NULL, ?, 1e10)",
        (json.dumps(forged),),
    )
    svc.store._db.run("UPDATE desired SET doc = ? WHERE job_id = 'b'", (json.dumps(forged),))
    svc.store._db.run("UPDATE version SET value = value + 1 WHERE id = 0")
    # The readiness probe (every second) finds it; /healthz never waits on the database.
    h = _healthz_until(client, "degraded")
    assert "'a'" in h["overlaps"][0] and "'b'" in h["overlaps"][0], h
    r = client.post("/api/v1/reconcile")
    assert r.status_code == 200, r.text
    assert r.json()["overlaps_repaired"] == ["b"], r.json()
    assert svc.store.overlaps() == []
    assert_disjoint(pools(client, "a"), pools(client, "b"))
    assert_disjoint(pushed(onos, "a"), pushed(onos, "b"))
    _healthz_until(client, "ok")


def _healthz_until(client: TestClient, status: str, within_s: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + within_s
    while True:
        h = client.get("/healthz").json()
        if h["status"] == status or time.monotonic() > deadline:
            assert h["status"] == status, h
            return h
        time.sleep(0.05)
