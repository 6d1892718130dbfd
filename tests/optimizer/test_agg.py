"""AGG on whole instances: forest == per-tree model, integral and feasible placements,
the MILP oracle as a bound, and a well-formed placement document for every strategy."""

from __future__ import annotations

import itertools
from collections import defaultdict
from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agg_optimizer.model.documents import Instance
from agg_optimizer.model.examples import example_instance, random_jobs, random_telemetry
from agg_optimizer.model.topology import fat_tree
from agg_optimizer.model.trees import evaluate
from agg_optimizer.placement import agg, engine, exact
from agg_optimizer.placement.context import Context
from agg_optimizer.placement.engine import STRATEGIES, solve
from agg_optimizer.placement.flow_lp import (
    NotTotallyUnimodular,
    solve_lp,
    solve_milp,
    solve_networkx,
)

seeds = st.integers(min_value=0, max_value=10_000)


@settings(max_examples=40, deadline=None)
@given(seeds)
def test_forest_matches_the_per_tree_model(seed):
    ctx = Context(example_instance(4, 5, seed))
    f = ctx.forest
    rng = np.random.default_rng(seed)
    mask = rng.random(len(f.job)) < 0.4
    costs = f.job_costs(mask)
    for j, job in enumerate(ctx.jobs):
        tree = ctx.int_trees[job.id]
        chosen = {ctx.net.ids[f.switch[v]] for v in np.nonzero(mask & (f.job == j))[0]}
        assert costs[j] == pytest.approx(evaluate(tree, chosen).surrogate, rel=1e-12)
        segs = {tuple(s) for s in agg.segments(tree)}
        fsegs = defaultdict(list)
        for lvl in f.levels:
            for v in lvl:
                if f.job[v] == j and f.segment[v] >= 0:
                    fsegs[f.segment[v]].append(ctx.net.ids[f.switch[v]])
        assert {tuple(s) for s in fsegs.values()} == segs


@pytest.mark.parametrize("seed", [0, 1])
def test_large_path_routes_read_the_checked_positions_as_the_names(seed):
    """Above SHARED_ROUTING_MAX_JOBS jobs the routes and the forest read the jobs' hosts as
    positions (`check_instance`'s `Checked.jobs`, or `JobNodes.of`): the roots are the
    PS switches by name, each job routes on its PS switch's row, every worker's path to it
    is on that row, and the forest is the same with or without the checked positions."""
    from agg_optimizer.model.validation import check_instance
    from agg_optimizer.placement.context import SHARED_ROUTING_MAX_JOBS

    inst = example_instance(8, SHARED_ROUTING_MAX_JOBS + 20, seed)
    given = Context(inst, nodes=check_instance(inst).jobs)
    worked = Context(inst)
    roots, pred, rows = given.int_routes
    assert roots == sorted({given.net.attach[j.ps] for j in inst.jobs})
    assert [roots[r] for r in rows] == [given.net.attach[j.ps] for j in inst.jobs]
    ids, at = given.net.switch_ids, given.net.sw_index
    for j, job in enumerate(inst.jobs):
        root = at[roots[rows[j]]]
        for w in job.workers:
            v, hops = at[given.net.attach[w]], 0
            while v != root:
                v, hops = int(pred[rows[j], v]), hops + 1
                assert 0 <= v < len(ids) and hops < len(ids)
    assert worked.int_routes[0] == roots and worked.int_routes[2] == rows
    assert np.array_equal(worked.int_routes[1], pred)
    fa, fb = given.forest, worked.forest
    for name in ("job", "switch", "parent", "direct", "tau", "dist", "segment", "w_node"):
        assert np.array_equal(getattr(fa, name), getattr(fb, name)), name


def _check_feasible(inst: Instance, placement) -> None:
    slots = {n.id: n.slots for n in inst.topology.nodes}
    prog = {n.id: n.programmable for n in inst.topology.nodes}
    jobs = {j.id: j for j in inst.jobs}
    used: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for jp in placement.jobs:
        job = jobs[jp.job_id]
        if job.max_aggregators is not None:
            assert len(jp.aggregators) <= job.max_aggregators
        emitters = set(job.workers) | {a.switch for a in jp.aggregators}
        fed = []
        for a in jp.aggregators:
            assert prog[a.switch]
            assert a.fan_in == len(a.children) >= 1
            assert set(a.children) <= emitters
            fed += a.children
            used[a.switch].append((a.pool.base, a.pool.base + a.pool.size))
        # every emitter feeds exactly one absorber (an aggregator or the PS)
        assert len(fed) + jp.ps_fan_in == len(emitters)
        for w, path in jp.worker_paths.items():
            assert path[0] == w and path[-1] == job.ps
    for s, pools in used.items():
        pools.sort()
        assert pools[-1][1] <= slots[s]
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(pools))


@settings(max_examples=25, deadline=None)
@given(seeds, st.sampled_from([128, 256, 1024]))
def test_agg_is_integral_feasible_and_bounded_by_the_oracles(seed, slots):
    inst = example_instance(4, 6, seed, slots=slots)
    with patch.object(engine, "FAMILY_MAX_JOBS", 0):  # the LP itself, not its family's best
        p = solve(inst, "agg")
    assert p.stats.path == "lp"
    assert p.stats.max_integrality_gap <= 1e-7
    _check_feasible(inst, p)
    _check_feasible(inst, solve(inst, "agg"))  # whichever member the family picks
    # On the same trees (no re-routing, which changes the trees and so the surrogate):
    # never worse than no summing, never better than the exact MILP of the full surrogate.
    with patch.object(engine, "REROUTE_ROUNDS", 0), patch.object(engine, "FAMILY_MAX_JOBS", 0):
        p = solve(inst, "agg")
        assert p.objective_s <= solve(inst, "ps").objective_s + 1e-9
        assert p.objective_s >= solve(inst, "milp").objective_s - 1e-6


def _weighted_cct(inst: Instance, strategy: str) -> tuple[float, str | None]:
    p = solve(inst, strategy)
    weight = {j.id: j.weight for j in inst.jobs}
    return sum(weight[jp.job_id] * jp.predicted_cct_s for jp in p.jobs), p.stats.family_choice


def test_agg_is_the_best_of_its_family():
    """On instances where a member of AGG's family beat the LP with re-routing (a scarce
    k=8 fat-tree: agg-own, greedy-rr; leaf-spine: agg-mm), AGG returns that member's
    placement; everywhere its weighted predicted CCT is no member's above."""
    from agg_optimizer.model.topology import leaf_spine

    cases = [example_instance(8, 10, seed, slots=128, workers=(3, 12)) for seed in (0, 1)]
    cases += [example_instance(4, 8, seed, topology=leaf_spine(3, 5, 4, uplink_gbps=25.0,
                                                               slots=128), workers=(3, 10))
              for seed in (0, 6)]  # fmt: skip
    chosen = set()
    for inst in cases:
        with patch.object(engine, "POLISH", False):  # the family alone (polish: test_optimum)
            agg_cct, choice = _weighted_cct(inst, "agg")
        members = {m: _weighted_cct(inst, m)[0] for m in ("agg-own", "agg-mm", "greedy-rr")}
        assert agg_cct <= min(members.values()) * (1 + 1e-12), members
        if choice != "agg":
            assert agg_cct == pytest.approx(members[choice], rel=1e-12)
        chosen.add(choice)
    assert {"agg-own", "agg-mm", "greedy-rr"} <= chosen  # each member won somewhere
    with patch.object(engine, "FAMILY_MAX_JOBS", 0):  # above the bound: AGG alone
        assert _weighted_cct(cases[0], "agg")[1] is None


def test_rerouting_never_raises_the_predicted_cct_and_lowers_it_on_contested_fabrics():
    """Re-routing keeps the best round, the first included: the jobs' weighted predicted CCT
    (bottleneck) can only fall. On scarce slots it falls on some instances."""
    lowered = 0
    for seed in range(12):
        inst = example_instance(8, 12, seed, slots=128)
        weight = {j.id: j.weight for j in inst.jobs}
        with patch.object(engine, "FAMILY_MAX_JOBS", 0):  # the re-routing alone
            with patch.object(engine, "REROUTE_ROUNDS", 0):
                before = solve(inst, "agg")
            after = solve(inst, "agg")
        _check_feasible(inst, after)
        score = [
            sum(weight[j.job_id] * j.predicted_cct_isolated_s for j in x.jobs)
            for x in (before, after)
        ]
        assert score[1] <= score[0] + 1e-9
        assert (after.stats.reroutes > 0) == (score[1] < score[0] - 1e-12)
        lowered += score[1] < score[0] - 1e-12
    assert lowered >= 3


@settings(max_examples=20, deadline=None)
@given(seeds)
def test_every_agg_iteration_is_exact_against_milp_and_networkx(seed):
    """Each problem AGG solves is solved again by the MILP and by networkx: same optimum."""
    seen = []

    def both(p):
        lp = solve_lp(p)
        assert solve_milp(p).objective == pytest.approx(lp.objective, abs=1e-7)
        assert solve_networkx(p)[0] == pytest.approx(lp.objective, abs=1e-6)
        seen.append(lp.objective)
        return lp

    ctx = Context(example_instance(4, 4, seed, slots=256))
    _, _, sols = agg.place(ctx, oracle=both)
    assert len(seen) == len(sols) >= 1


def test_all_strategies_give_well_formed_placements():
    inst = example_instance(4, 5, 3, slots=256)
    for name in STRATEGIES:
        _check_feasible(inst, solve(inst, name))


def test_scarce_slots_are_shared_across_jobs():
    inst = example_instance(4, 8, 5, slots=128)  # one pool per switch
    p = solve(inst, "agg")
    owners = defaultdict(int)
    for jp in p.jobs:
        for a in jp.aggregators:
            owners[a.switch] += 1
    assert owners and max(owners.values()) == 1


def test_hysteresis_keeps_the_current_placement_when_switching_is_expensive():
    inst = example_instance(4, 4, 9, slots=256)
    first = solve(inst, "agg")
    current = {jp.job_id: [a.switch for a in jp.aggregators] for jp in first.jobs}
    moved = example_instance(4, 4, 10, slots=256)  # only its telemetry is used
    moved = inst.model_copy(update={"telemetry": moved.telemetry, "current": current})
    sticky = solve(moved.model_copy(update={"switching_penalty_s": 1e6}), "agg")
    for jp in sticky.jobs:
        assert {a.switch for a in jp.aggregators} <= set(current[jp.job_id])
    free = solve(moved, "agg")
    assert free.objective_s <= sticky.objective_s


def test_unequal_pool_sizes_take_the_labelled_milp_path():
    inst = example_instance(4, 3, 2, slots=256)
    inst.jobs[0] = inst.jobs[0].model_copy(update={"pool_slots": 64})
    p = solve(inst, "agg")
    assert p.stats.path == "milp" and "knapsack" in p.stats.reason
    # the switch by the id a user knows, not the LP's index
    switch = p.stats.reason.rsplit("share switch ", 1)[1]
    assert switch in {n.id for n in inst.topology.nodes if n.kind == "switch"}, p.stats.reason
    _check_feasible(inst, p)
    with pytest.raises(NotTotallyUnimodular):
        agg.place(Context(inst), allow_milp=False)


def test_gap_to_the_exact_surrogate_is_small_on_average():
    gaps = []
    for seed in range(12):
        ctx = Context(example_instance(8, 30, seed, slots=256, workers=(4, 24)))
        a, _, _ = agg.place(ctx)
        e, _ = exact.place_exact(ctx)
        ga, ge = ctx.weighted_cost(ctx.int_trees, a), ctx.weighted_cost(ctx.int_trees, e)
        gaps.append(ga / ge - 1)
    assert min(gaps) >= -1e-9
    assert np.mean(gaps) < 0.02, gaps


def test_k32_with_1000_jobs_gives_an_integral_feasible_placement():
    rng = np.random.default_rng(0)
    topo = fat_tree(32, slots=1024)
    inst = Instance(
        topology=topo, telemetry=random_telemetry(topo, rng), jobs=random_jobs(topo, 1000, rng)
    )
    p = solve(inst, "agg")
    assert p.stats.path == "lp" and p.stats.max_integrality_gap <= 1e-7
    assert sum(len(j.aggregators) for j in p.jobs) > 1000
    _check_feasible(inst, p)


@pytest.mark.parametrize("strategy", ["agg", "ps", "sharp", "soar"])
def test_cct_of_a_given_placement_matches_the_prediction(strategy: str) -> None:
    """`trees.cct_of` (the service loop's judge of the applied placement) gives a one-job
    placement the CCT the solver predicted for it, and refuses paths that left the fabric."""
    from agg_optimizer.model.examples import example_instance
    from agg_optimizer.model.network import Network
    from agg_optimizer.model.trees import cct_of

    inst = example_instance(4, 1, 3)
    (jp,) = solve(inst, strategy).jobs
    net = Network.from_instance(inst)
    job = inst.jobs[0]
    aggs = {a.switch for a in jp.aggregators}
    assert cct_of(net, job, jp.worker_paths, aggs) == pytest.approx(jp.predicted_cct_isolated_s)
    w, path = next(iter(jp.worker_paths.items()))
    broken = {**jp.worker_paths, w: [path[0], path[1], "nowhere", *path[2:]]}
    assert cct_of(net, job, broken, aggs) is None


def test_a_binding_cap_does_not_leave_agg_above_greedy_and_the_milp() -> None:
    """Issue 16, item 2: k=6 fat-tree, 10 jobs, max_aggregators 2 on every job (example
    seed 7011). The descent from no aggregation stopped where one swap helps (job6 summed
    at a rack switch and a core, where a pod switch and the core is better): AGG's mean
    CCT was 10.3% above greedy's and the MILP's. With the second descent from greedy's
    choice it meets the exact optimum here, and is never above greedy on its own trees."""
    from agg_optimizer.model.examples import example_instance
    from agg_optimizer.placement.baselines import int_greedy
    from agg_optimizer.placement.context import Context
    from agg_optimizer.placement.engine import solve

    inst = example_instance(6, 10, 7011)
    for j in inst.jobs:
        j.max_aggregators = 2
    with patch.object(engine, "POLISH", False):  # the LP's descents (polish: below)
        got = {s: solve(inst, s) for s in ("agg", "greedy", "milp")}
    polished = solve(inst, "agg")  # the shared figure it reports is never above
    assert sum(j.predicted_cct_s for j in polished.jobs) <= sum(
        j.predicted_cct_s for j in got["agg"].jobs
    ) * (1 + 1e-12)
    surrogate = {s: sum(j.surrogate_s for j in p.jobs) for s, p in got.items()}
    assert surrogate["agg"] <= surrogate["milp"] * 1.01, surrogate
    cct = {s: sum(j.predicted_cct_isolated_s for j in p.jobs) for s, p in got.items()}
    assert cct["agg"] <= min(cct["greedy"], cct["milp"]) * 1.01, cct
    for p in got.values():
        assert all(len(jp.aggregators) <= 2 for jp in p.jobs)
    # On its own trees, over other seeds and caps: never above greedy.
    for seed, cap in ((1, 1), (2, 2), (3, 3), (7011, 3)):
        inst = example_instance(6, 8, seed)
        for j in inst.jobs:
            j.max_aggregators = cap
        ctx = Context(inst)
        mine, _, _ = agg.place(ctx)
        ours = ctx.weighted_cost(ctx.int_trees, mine)
        theirs = ctx.weighted_cost(ctx.int_trees, int_greedy(ctx))
        assert ours <= theirs * (1 + 1e-9), (seed, cap, ours, theirs)
