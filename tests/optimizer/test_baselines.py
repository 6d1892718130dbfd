"""Baselines on hand-checked cases; SOAR's dynamic program against brute force."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agg_optimizer.model.documents import Instance, Job
from agg_optimizer.model.examples import example_instance
from agg_optimizer.model.topology import leaf_spine
from agg_optimizer.model.trees import evaluate
from agg_optimizer.placement import baselines
from agg_optimizer.placement.context import Context
from agg_optimizer.placement.engine import solve

# leaf-spine: PS on l0 with two local workers, two workers on l1, one on l2
WORKERS = ["h0_1", "h0_2", "h1_0", "h1_1", "h2_0"]


def _inst(n_jobs: int = 1, slots: int = 1024) -> Instance:
    topo = leaf_spine(2, 3, 4, slots=slots)
    jobs = [Job(id=f"j{i}", workers=WORKERS, ps="h0_0", update_bytes=10**8) for i in range(n_jobs)]
    return Instance(topology=topo, jobs=jobs)


def _aggs(inst: Instance, name: str) -> list[set[str]]:
    return [{a.switch for a in jp.aggregators} for jp in solve(inst, name).jobs]


def test_ps_only_sends_every_stream_to_the_ps():
    jp = solve(_inst(), "ps").jobs[0]
    assert jp.aggregators == [] and jp.ps_fan_in == 5


def test_switchml_sums_at_every_worker_tor():
    assert _aggs(_inst(), "switchml") == [{"l0", "l1", "l2"}]


def test_atp_uses_worker_tors_then_the_ps_tor():
    assert _aggs(_inst(), "atp") == [{"l1", "l2", "l0"}]
    # with one pool per switch the second job gets nothing anywhere: the PS sums
    assert _aggs(_inst(2, slots=128), "atp")[1] == set()


def test_sharp_builds_the_full_reduction_tree():
    inst = _inst()
    (chosen,) = _aggs(inst, "sharp")
    tree = Context(inst).ecmp_trees["j0"]
    merge = {v for v in tree.order if tree.inputs(v) >= 2}
    assert chosen == merge
    assert {"l0", "l1"} <= chosen and "l2" not in chosen  # l2 has a single worker


def test_caps_limit_every_strategy():
    inst = _inst()
    inst.jobs[0] = inst.jobs[0].model_copy(update={"max_aggregators": 1})
    for name in ("switchml", "atp", "sharp", "soar", "greedy", "random", "grid", "agg", "milp"):
        assert len(_aggs(inst, name)[0]) <= 1, name


def test_random_and_grid_are_deterministic_under_a_seed():
    inst = example_instance(4, 5, 1, slots=256)
    for name in ("random", "grid"):
        a = solve(inst, name, seed=4).model_dump()
        b = solve(inst, name, seed=4).model_dump()
        for x in (a, b):
            x["stats"] = None
        assert a == b, name


def test_greedy_never_worse_than_ps_and_stops_when_nothing_helps():
    inst = example_instance(4, 5, 2)
    g = solve(inst, "greedy")
    assert g.objective_s < solve(inst, "ps").objective_s
    for jp in g.jobs:
        assert all(a.fan_in >= 2 for a in jp.aggregators)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 3))
def test_soar_dp_equals_brute_force(seed, k):
    inst = example_instance(4, 1, seed, workers=(3, 10))
    tree = Context(inst).ecmp_trees[inst.jobs[0].id]
    eligible = set(tree.order)
    value, chosen = baselines.soar_tree(tree, k, eligible)
    const = sum(tree.tau_worker.values())
    assert len(chosen) <= k
    assert value + const == pytest.approx(evaluate(tree, chosen).surrogate, rel=1e-12)
    best = min(
        evaluate(tree, set(c)).surrogate
        for r in range(k + 1)
        for c in itertools.combinations(tree.order, r)
    )
    assert value + const == pytest.approx(best, rel=1e-12)


def test_soar_respects_ineligible_switches():
    inst = example_instance(4, 1, 3, workers=(6, 10))
    tree = Context(inst).ecmp_trees[inst.jobs[0].id]
    banned = tree.root
    _, chosen = baselines.soar_tree(tree, 3, set(tree.order) - {banned})
    assert banned not in chosen
