"""The TU flow LP: integrality, agreement with three independent oracles, refusals."""

from __future__ import annotations

import highspy
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from agg_optimizer.placement import flow_lp
from agg_optimizer.placement.flow_lp import (
    FlowLP,
    FlowNetwork,
    FlowProblem,
    NotTotallyUnimodular,
    SolveError,
    build_network,
    check_incidence,
    incidence_csc,
    solve,
    solve_lp,
    solve_milp,
    solve_networkx,
    tree_basis,
)

from .helpers import brute_force, random_problem

seeds = st.integers(min_value=0, max_value=2**32 - 1)


@settings(max_examples=300, deadline=None)
@given(seeds)
def test_lp_equals_milp_bruteforce_and_networkx(seed):
    p = random_problem(seed)
    lp = solve_lp(p)
    assert lp.path == "lp"
    assert lp.max_integrality_gap <= 1e-7
    bf = brute_force(p)
    assert lp.objective == pytest.approx(bf, abs=1e-9)
    assert solve_milp(p).objective == pytest.approx(bf, abs=1e-9)
    nx_obj, _ = solve_networkx(p)
    assert nx_obj == pytest.approx(bf, abs=1e-6)


@settings(max_examples=200, deadline=None)
@given(seeds)
def test_chosen_arcs_are_feasible_and_every_column_integral(seed):
    p = random_problem(seed)
    sol = solve_lp(p)
    col = sol.extra["col_value"]
    assert np.all(np.abs(col - np.round(col)) <= 1e-7)
    groups = p.arc_group[sol.chosen]
    assert len(groups) == len(set(groups.tolist())), "a group summed twice"
    jobs = p.group_job[groups]
    assert np.all(np.bincount(jobs, minlength=p.n_jobs) <= p.job_cap)
    sw = np.bincount(p.arc_switch[sol.chosen], minlength=p.n_switches)
    assert np.all(sw * p.job_pool.max() <= p.switch_slots)


def test_incidence_certificate_catches_a_broken_column():
    p = random_problem(7)
    net = build_network(p)
    start, index, value = incidence_csc(net)
    check_incidence(net, start, index, value)  # the real matrix passes
    bad = value.copy()
    bad[1] = -bad[1]  # column 0 becomes (-1, -1) or (+1, +1)
    with pytest.raises(NotTotallyUnimodular, match="structure"):
        check_incidence(net, start, index, bad)
    net.upper = net.upper + 0.5
    with pytest.raises(NotTotallyUnimodular, match="non-integer"):
        check_incidence(net, start, index, value)


@pytest.mark.parametrize("kind", ["switch", "job"])
def test_incidence_certificate_catches_segment_costs_that_decrease(kind: str) -> None:
    """A node's convex cost is its segments, of nondecreasing cost in their order. Two nodes
    whose segments alternate: costs rising on each node pass (though not along the list),
    costs falling on one node are refused."""
    tail = np.array([2, 3, 2, 3])

    def net(cost: list[float]) -> FlowNetwork:
        return FlowNetwork(
            n_nodes=4,
            tail=tail,
            head=np.ones(4, dtype=np.int64),
            upper=np.ones(4),
            cost=np.array(cost),
            x_cols=np.zeros(0, dtype=np.int64),
            seg_kind=[kind] * 4,
        )

    ok = net([1.0, 5.0, 2.0, 6.0])  # node 2: 1 then 2; node 3: 5 then 6
    check_incidence(ok, *incidence_csc(ok))
    bad = net([2.0, 5.0, 1.0, 6.0])  # node 2: 2 then 1
    with pytest.raises(NotTotallyUnimodular, match=f"{kind} segment costs decrease"):
        check_incidence(bad, *incidence_csc(bad))


def _two_arcs(*, pools, group_job, costs, slots) -> FlowProblem:
    """Two groups, each with one candidate: switch 0."""
    return FlowProblem(
        job_cap=np.full(max(group_job) + 1, 2),
        job_pool=np.array(pools),
        group_job=np.array(group_job),
        arc_group=np.array([0, 1]),
        arc_switch=np.array([0, 0]),
        arc_cost=np.array(costs),
        switch_slots=np.array([slots]),
        switch_unit_cost=np.zeros(1),
    )


def _knapsack_problem() -> FlowProblem:
    # two jobs with pools of 1 and 2 slots compete for a switch with 2 slots
    return _two_arcs(pools=[1, 2], group_job=[0, 1], costs=[-1.0, -1.5], slots=2)


def _facility_problem() -> FlowProblem:
    # one job, two groups, both could be summed at switch 0, which has room for one pool
    return _two_arcs(pools=[1], group_job=[0, 0], costs=[-1.0, -1.0], slots=1)


@pytest.mark.parametrize(
    ("make", "kind"), [(_knapsack_problem, "knapsack"), (_facility_problem, "facility")]
)
def test_non_tu_structures_are_refused_or_sent_to_the_milp(make, kind):
    p = make()
    with pytest.raises(NotTotallyUnimodular) as e:
        FlowLP(p)
    assert e.value.kind == kind
    with pytest.raises(NotTotallyUnimodular):
        solve(p, allow_milp=False)
    sol = solve(p, allow_milp=True)
    assert sol.path == "milp" and kind in sol.reason
    assert sol.objective == pytest.approx(brute_force(p))


@settings(max_examples=150, deadline=None)
@given(seeds, st.booleans())
def test_milp_path_matches_brute_force_on_non_tu_problems(seed, facility):
    p = random_problem(seed, uniform_pool=facility, facility=facility)
    sol = solve(p)
    assert sol.objective == pytest.approx(brute_force(p), abs=1e-9)
    if sol.path == "lp":  # the random draw happened to be TU after all
        assert sol.max_integrality_gap <= 1e-7


def _tie_problem() -> FlowProblem:
    # two jobs want the same single pool with equal benefit: two optimal vertices
    return _two_arcs(pools=[1, 1], group_job=[0, 1], costs=[-1.0, -1.0], slots=1)


def test_tie_gives_a_vertex_with_production_settings():
    sol = solve_lp(_tie_problem())
    assert sorted(sol.chosen.tolist()) == [False, True]
    assert sol.max_integrality_gap == 0.0


def test_tie_is_fractional_under_ipm_without_crossover():
    """The negative control: interior point without crossover stops at the centre of the
    optimal face (0.5, 0.5); the solver must refuse it, not round it."""
    with pytest.raises(SolveError, match="fractional"):
        solve_lp(_tie_problem(), solver="ipm", crossover=False)


def test_warm_resolve_matches_a_cold_solve():
    p = random_problem(11)
    lp = FlowLP(p, prune=False)
    lp.run()
    new = p.arc_cost[::-1].copy() if len(p.arc_cost) > 1 else p.arc_cost - 1
    warm = lp.run(new)
    cold = solve_lp(FlowProblem(**{**p.__dict__, "arc_cost": new}))
    assert warm.objective == pytest.approx(cold.objective)


def test_infeasible_status_is_an_error_not_a_placement():
    p = random_problem(3)
    lp = FlowLP(p, prune=False)
    # force an impossible bound: the return arc must carry more than any job can send
    lp.highs.changeColBounds(lp.columns - 1, 1e6, 1e6)
    with pytest.raises(SolveError):
        lp.run()
    assert highspy.HighsModelStatus.kInfeasible == lp.highs.getModelStatus()


@settings(max_examples=200, deadline=None)
@given(seeds)
def test_tree_basis_is_a_spanning_tree_of_the_zero_flow(seed):
    """`tree_basis`: n - 1 basic arcs joining every node (and one basic slack), or None
    exactly where a switch has no segment to the sink (no slot for a pool)."""
    p = random_problem(seed)
    net = build_network(p, prune=False)
    b = tree_basis(net)
    no_segment = bool(np.any(flow_lp.switch_pools(p)[np.unique(p.arc_switch)] == 0))
    assert (b is None) == no_segment
    if b is None:
        return
    basic = np.array([s == highspy.HighsBasisStatus.kBasic for s in b.col_status])
    assert basic.sum() == net.n_nodes - 1
    assert [s == highspy.HighsBasisStatus.kBasic for s in b.row_status].count(True) == 1
    t, h = net.tail[basic], net.head[basic]
    g = coo_matrix((np.ones(len(t)), (t, h)), shape=(net.n_nodes, net.n_nodes))
    assert connected_components(g, directed=False)[0] == 1


@settings(max_examples=300, deadline=None)
@given(seeds)
def test_a_solve_from_the_tree_basis_is_exact(monkeypatch_tree_start, seed):
    """From the tree basis (every size here, not only from TREE_START_MIN_COLUMNS), the
    cold solve and a warm re-solve after it are optimal, integral and the brute force's,
    and so is the cold solve of the pruned network."""
    p = random_problem(seed)
    lp = FlowLP(p, prune=False)
    assert lp.tree_start == (tree_basis(lp.net) is not None)
    sol = lp.run()
    assert not lp.tree_start  # only the first solve starts from it
    assert sol.max_integrality_gap <= 1e-7
    assert sol.objective == pytest.approx(brute_force(p), abs=1e-9)
    new = p.arc_cost[::-1].copy() if len(p.arc_cost) > 1 else p.arc_cost - 1
    warm = lp.run(new)
    assert warm.objective == pytest.approx(
        brute_force(FlowProblem(**{**p.__dict__, "arc_cost": new})), abs=1e-9
    )
    # pruned (`solve_lp`: only the arcs of negative cost, and the nodes they touch)
    pruned = FlowLP(p)
    assert pruned.tree_start == (tree_basis(pruned.net) is not None)
    assert pruned.run().objective == pytest.approx(brute_force(p), abs=1e-9)


@pytest.fixture(scope="module")
def monkeypatch_tree_start():
    """The tree start on every LP, however small (module scope: hypothesis runs the test's
    examples within one call of the fixture)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(flow_lp, "TREE_START_MIN_COLUMNS", 0)
        yield
