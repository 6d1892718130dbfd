"""Inputs the engine used to crash on (issue 28, item 5): an empty job list under every
strategy, a warm HiGHS re-solve that ends `Unknown`, and numbers past what the solver and
int64 take, which are refused naming their field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agg_optimizer.documents import Instance
from agg_optimizer.engine import STRATEGIES, solve
from agg_optimizer.examples import example_instance


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


def test_re_routing_never_makes_the_reported_cct_worse(monkeypatch: pytest.MonkeyPatch) -> None:
    """k=4, 10 jobs, seed 11, 256 slots: the re-routed rounds looked better judged on each
    job alone, and the shared figure the placement reports was 3.8% worse than without
    re-routing (9 of 96 such instances were worse). Kept only when the reported one is
    better."""
    from agg_optimizer import engine

    inst = example_instance(k=4, n_jobs=10, seed=11, slots=256)

    def reported() -> float:
        p = solve(inst, "agg")
        return sum(j.weight * jp.predicted_cct_s for j, jp in zip(inst.jobs, p.jobs, strict=True))

    with_rr = reported()
    monkeypatch.setattr(engine, "REROUTE_ROUNDS", 0)
    assert with_rr <= reported() * (1 + 1e-9)
