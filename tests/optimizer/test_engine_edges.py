"""Inputs the engine used to crash on (issue 28, item 5): an empty job list under every
strategy, a warm HiGHS re-solve that ends `Unknown`, and numbers past what the solver and
int64 take, which are refused naming their field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agg_optimizer.model.documents import Instance, Telemetry
from agg_optimizer.model.examples import example_instance
from agg_optimizer.placement.engine import STRATEGIES, solve


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_no_jobs_is_an_empty_placement(strategy: str) -> None:
    inst = example_instance(k=4, n_jobs=1, seed=0).model_copy(update={"jobs": []})
    p = solve(inst, strategy)
    assert p.jobs == [] and p.mean_predicted_cct_s == 0.0


def test_agg_mm_survives_a_warm_re_solve_that_ends_unknown() -> None:
    """Seed 157: the bisection's warm re-solve returned `Unknown` (a cold solve of the same
    LP is optimal), 10 of seeds 0-199 failed so; now retried cold."""
    inst = example_instance(k=4, n_jobs=3, seed=157)
    jobs = [j.model_copy(update={"max_aggregators": 1}) for j in inst.jobs]
    p = solve(inst.model_copy(update={"jobs": jobs}), "agg-mm")
    assert len(p.jobs) == 3
    assert all(len(jp.aggregators) <= 1 for jp in p.jobs)


@pytest.mark.parametrize(
    ("where", "value", "field"),
    [
        ("job", {"update_bytes": 10**400}, "update_bytes"),
        ("job", {"update_bytes": 1e400}, "update_bytes"),
        ("job", {"pool_slots": 10**30}, "pool_slots"),
        ("job", {"weight": 1e308}, "weight"),
        ("job", {"weight": float("nan")}, "weight"),
        ("node", {"slots": 10**30}, "slots"),
        ("link", {"capacity_gbps": float("inf")}, "capacity_gbps"),
        ("link", {"capacity_gbps": 1e-16}, "capacity_gbps"),
        ("job", {"weight": 1e-300}, "weight"),
        ("telemetry", {"latency_us": float("inf")}, "latency_us"),
    ],
)
def test_numbers_past_the_bounds_are_refused_naming_the_field(
    where: str, value: dict, field: str
) -> None:
    doc = example_instance(k=4, n_jobs=1, seed=0).model_dump(mode="json")
    target = {
        "job": doc["jobs"][0],
        "node": doc["topology"]["nodes"][0],
        "link": doc["topology"]["links"][0],
        "telemetry": (doc["telemetry"]["links"] or [{"src": "a", "dst": "b"}])[0],
    }[where]
    target.update(value)
    if where == "telemetry" and not doc["telemetry"]["links"]:
        doc["telemetry"]["links"] = [target]
    with pytest.raises(ValidationError) as e:
        Instance.model_validate(doc)
    locs = [".".join(str(x) for x in err["loc"]) for err in e.value.errors()]
    assert any(loc.endswith(field) for loc in locs), locs
    assert all(err["type"] != "model_type" for err in e.value.errors())


@pytest.mark.parametrize("strategy", ["agg", "agg-mm", "agg-own", "milp"])
def test_numbers_at_the_bounds_are_solved(strategy: str) -> None:
    """Links at 1e-6 Gb/s carrying 1e15-byte updates at weight 1e6 put costs of 1e19 s in
    the LP (HiGHS's infinity is 1e20; it answered `Solve error`): scaled by a power of two,
    AGG's LP finds the MILP's placement. Links at the lower bound (1e-9 Gb/s) solve too."""
    inst = example_instance(k=4, n_jobs=2, seed=0)
    for cap in (1e-6, 1e-9):
        topo = inst.topology.model_copy(deep=True)
        for ln in topo.links:
            ln.capacity_gbps = cap
        jobs = [j.model_copy(update={"update_bytes": 10**15, "weight": 1e6}) for j in inst.jobs]
        big = inst.model_copy(update={"topology": topo, "jobs": jobs, "telemetry": Telemetry()})
        p = solve(big, strategy)
        exact = solve(big, "milp")
        assert len(p.jobs) == 2 and all(j.predicted_cct_s > 0 for j in p.jobs)
        assert p.mean_predicted_cct_s <= exact.mean_predicted_cct_s * (1 + 1e-9)


def test_re_routing_never_makes_the_reported_cct_worse(monkeypatch: pytest.MonkeyPatch) -> None:
    """k=4, 10 jobs, seed 11, 256 slots: the re-routed rounds looked better judged on each
    job alone, and the shared figure the placement reports was 3.8% worse than without
    re-routing (9 of 96 such instances were worse). Kept only when the reported one is
    better."""
    from agg_optimizer.placement import engine

    inst = example_instance(k=4, n_jobs=10, seed=11, slots=256)

    def reported() -> float:
        p = solve(inst, "agg")
        return sum(j.weight * jp.predicted_cct_s for j, jp in zip(inst.jobs, p.jobs, strict=True))

    with_rr = reported()
    monkeypatch.setattr(engine, "REROUTE_ROUNDS", 0)
    assert with_rr <= reported() * (1 + 1e-9)
