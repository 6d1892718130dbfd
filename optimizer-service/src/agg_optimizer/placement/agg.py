"""AGG: all jobs placed jointly by the TU linear program of `flow_lp`, on INT-routed trees.

Groups. A job's tree is cut into segments: a segment starts at a switch where two or more
streams meet (workers or child switches) and runs up through switches with a single input,
so every switch of the tree where summing can help belongs to exactly one segment of the
job. Summing a segment at any of its switches turns its input streams into one. Segments are
disjoint within a job, so "job j uses switch s" is one arc and the facility structure that
breaks total unimodularity never arises.

Costs. Given the current choice A for all other segments, summing segment g at switch s
changes the job's surrogate by exactly
    c_gs = w_j * ( -(in_A(g) - 1) * (dist(s) - dist(anc_A(g))) + hop(s) ) + penalty(s)
where in_A(g) is the number of streams entering the segment, dist is the per-stream time from a
switch to the PS, and anc_A(g) the nearest aggregator above the segment (the PS if none).
The product of two choices on one path (rack and PS-side aggregation) is the one
nonlinearity; it is resolved by iterating: solve the LP with costs from A, evaluate the exact
surrogate of the result, keep it if it is better, and stop when it is not. Every solve is an
exact, integral LP over all jobs and slots at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from agg_optimizer.model.documents import SolverStats
from agg_optimizer.model.trees import JobTree
from agg_optimizer.placement.baselines import int_greedy
from agg_optimizer.placement.context import Context
from agg_optimizer.placement.flow_lp import (
    FlowLP,
    FlowProblem,
    FlowSolution,
    NotTotallyUnimodular,
    solve_milp,
)
from agg_optimizer.placement.forest import Forest

MAX_ITERATIONS = 6
# Stop when an iteration improves the surrogate by less than this fraction.
REL_TOL = 2e-3
# Per pool load cost at a switch (s): a tie-breaker that spreads jobs over switches when their
# benefits are equal; far below any transfer-time saving.
LOAD_COST_S = 1e-6


def segments(tree: JobTree) -> list[list[str]]:
    """Segments of a tree, each listed bottom-up."""
    out = []
    for v in tree.order:
        if tree.inputs(v) < 2:
            continue
        seg = [v]
        p = tree.parent[v]
        while p is not None and tree.inputs(p) == 1:
            seg.append(p)
            p = tree.parent[p]
        out.append(seg)
    return out


@dataclass
class AggModel:
    """The arcs of AGG's flow problem over a forest, fixed across iterations."""

    forest: Forest
    arc_node: np.ndarray  # forest node of each arc (its switch sums its segment)
    arc_top: np.ndarray  # top node of the arc's segment
    arc_bottom: np.ndarray
    in_current: np.ndarray  # per arc: the switch already sums this job (hysteresis)
    problem: FlowProblem


def build_model(ctx: Context) -> AggModel:
    f = ctx.forest
    net = ctx.net
    jobs = ctx.jobs
    pool = np.array([j.pool_slots for j in jobs], dtype=np.int64)
    seg = f.segment
    eligible = (seg >= 0) & net.programmable[f.switch] & (net.slots[f.switch] >= pool[f.job])
    arc_node = np.nonzero(eligible)[0]
    arc_bottom = seg[arc_node]
    groups, arc_group = np.unique(arc_bottom, return_inverse=True)
    group_job = f.job[groups]
    # top of each segment: its shallowest member (levels run deepest first)
    top = np.full(len(f.job), -1, dtype=np.int64)
    for lvl in f.levels:
        m = lvl[seg[lvl] >= 0]
        top[seg[m]] = m
    n_groups = np.bincount(group_job, minlength=len(jobs))
    caps = np.array(
        [
            n if j.max_aggregators is None else min(n, j.max_aggregators)
            for j, n in zip(jobs, n_groups, strict=True)
        ],
        dtype=np.int64,
    )
    cur = {(jid, s) for jid, sws in ctx.instance.current.items() for s in sws}
    job_ids = [j.id for j in jobs]
    if cur:
        in_current = np.array(
            [
                (job_ids[j], net.ids[s]) in cur
                for j, s in zip(f.job[arc_node].tolist(), f.switch[arc_node].tolist(), strict=True)
            ],
            dtype=bool,
        )
    else:  # nothing placed yet: no arc is in the current placement
        in_current = np.zeros(len(arc_node), dtype=bool)
    problem = FlowProblem(
        job_cap=caps,
        job_pool=pool,
        group_job=group_job,
        arc_group=arc_group,
        arc_switch=f.switch[arc_node],
        arc_cost=np.zeros(len(arc_node)),
        switch_slots=net.slots.copy(),
        switch_unit_cost=np.full(len(net.ids), LOAD_COST_S),
        switch_names=list(net.ids),
        job_names=list(job_ids),
    )
    return AggModel(f, arc_node, top[arc_bottom], arc_bottom, in_current, problem)


def arc_costs(ctx: Context, m: AggModel, agg: np.ndarray) -> np.ndarray:
    """c_gs against the current choice `agg` (bool per forest node)."""
    f = m.forest
    s = f.streams(agg)
    child_sum = np.zeros(len(f.job), dtype=np.int64)
    nr = f.parent >= 0
    np.add.at(child_sum, f.parent[nr], s[nr])
    n_in = f.direct + child_sum
    anc = f.anc_dist(agg)
    benefit = (n_in[m.arc_bottom] - 1) * (f.dist[m.arc_node] - anc[m.arc_top])
    w = f.weight[m.arc_node]
    cost = w * (f.hop[m.arc_node] - benefit)
    pen = ctx.instance.switching_penalty_s
    if pen:
        cost = cost + w * pen * ~m.in_current
    return cost


def objective(ctx: Context, m: AggModel, agg: np.ndarray) -> float:
    f = m.forest
    total = float(np.dot(ctx.job_weights, f.job_costs(agg)))
    pen = ctx.instance.switching_penalty_s
    if pen:
        total += pen * float(np.dot(f.weight[m.arc_node], agg[m.arc_node] & ~m.in_current))
    return total


def to_decision(ctx: Context, m: AggModel, agg: np.ndarray) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {j.id: set() for j in ctx.jobs}
    f = m.forest
    chosen = np.nonzero(agg)[0]
    jobs, ids = ctx.jobs, ctx.net.ids
    for j, s in zip(f.job[chosen].tolist(), f.switch[chosen].tolist(), strict=True):
        out[jobs[j].id].add(ids[s])
    return out


def place(
    ctx: Context,
    *,
    allow_milp: bool = True,
    oracle=None,
    model: AggModel | None = None,
    bias: np.ndarray | None = None,
) -> tuple[dict[str, set[str]], SolverStats, list[FlowSolution]]:
    """Iterate the LP to a fixed point of the exact surrogate. The LP is built once and
    re-solved with new costs (warm start). `oracle(problem)` replaces it when given (tests
    and benchmarks solve the same problems with the MILP or networkx).

    `bias` (per arc of `model`) is added to every iteration's arc costs: `bottleneck`
    passes a large negative bias on the arcs a threshold forces, so each LP first covers
    the forced segments and then minimises the surrogate; every solution of the descent
    then meets the threshold, and the first one is kept even where its surrogate is above
    the empty choice's.

    Where a job's cap binds, the descent from no aggregation can stop at a choice a single
    swap would improve: its first LP takes the segments nearest the PS (with nothing summed
    below, their input counts are largest), and afterwards every cost is linearised
    against that choice, under which the better swap looks worse (a switch that sums a
    whole pod is credited only with the streams left after a rack switch already summed).
    So with caps the descent runs a second time, from INT-greedy's choice on the same
    trees (feasible, and greedy picks by the true marginal drop), and the lower surrogate
    wins: AGG is then never above greedy on its own trees."""
    t0 = time.perf_counter()
    m = model if model is not None else build_model(ctx)
    f = m.forest
    stats = SolverStats(path="lp")
    sols: list[FlowSolution] = []
    state: dict[str, FlowLP | None] = {"lp": None}
    build_extra = time.perf_counter() - t0

    def descend(agg: np.ndarray, best_cost: float) -> tuple[np.ndarray, float]:
        nonlocal build_extra
        for _ in range(MAX_ITERATIONS):
            t1 = time.perf_counter()
            m.problem.arc_cost = arc_costs(ctx, m, agg)
            if bias is not None:
                m.problem.arc_cost = m.problem.arc_cost + bias
            build_extra += time.perf_counter() - t1
            lp = state["lp"]
            if oracle is not None:
                sol = oracle(m.problem)
            elif lp is not None:
                sol = lp.run(m.problem.arc_cost)
            else:
                try:
                    state["lp"] = FlowLP(m.problem, prune=False)
                    sol = state["lp"].run()
                except NotTotallyUnimodular as e:
                    if not allow_milp:
                        raise
                    sol = solve_milp(m.problem, reason=str(e))
            sols.append(sol)
            stats.iterations += 1
            stats.build_s += sol.build_s
            stats.solve_s += sol.solve_s
            stats.columns, stats.rows = sol.columns, sol.rows
            stats.max_integrality_gap = max(stats.max_integrality_gap, sol.max_integrality_gap)
            stats.objective = sol.objective
            if sol.path != "lp":
                stats.path, stats.reason = "milp", sol.reason
            t1 = time.perf_counter()
            cand = np.zeros_like(agg)
            cand[m.arc_node[sol.chosen]] = True
            cost = objective(ctx, m, cand)
            build_extra += time.perf_counter() - t1
            gain = best_cost - cost
            if best_cost == np.inf or gain > 1e-12 * max(1.0, abs(best_cost)):
                agg, best_cost = cand, cost
            if gain < REL_TOL * abs(best_cost):
                break
        return agg, best_cost

    none = np.zeros(len(f.job), dtype=bool)
    agg, best = descend(none, np.inf if bias is not None else objective(ctx, m, none))
    if bias is None and capped(ctx, m):
        t1 = time.perf_counter()
        seed = from_decision(ctx, m, int_greedy(ctx))
        build_extra += time.perf_counter() - t1
        other, cost = descend(seed, objective(ctx, m, seed))
        if cost < best - 1e-12 * max(1.0, abs(best)):
            agg, best = other, cost
            if stats.path == "lp":
                stats.reason = "the descent from INT-greedy's choice won (caps bind)"
    stats.build_s += build_extra
    return to_decision(ctx, m, agg), stats, sols


def capped(ctx: Context, m: AggModel) -> bool:
    """Whether some job's cap is below its number of segments (it binds)."""
    n_groups = np.bincount(m.problem.group_job, minlength=len(ctx.jobs))
    return bool(np.any(m.problem.job_cap < n_groups))


def from_decision(ctx: Context, m: AggModel, decision: dict[str, set[str]]) -> np.ndarray:
    """A decision as the forest's bool vector over AGG's arcs (choices that are no arc of
    the model, switches where nothing meets, are left out: they only add hop time)."""
    f = m.forest
    ids = [j.id for j in ctx.jobs]
    agg = np.zeros(len(f.job), dtype=bool)
    for v in m.arc_node:
        if ctx.net.ids[f.switch[v]] in decision.get(ids[f.job[v]], ()):
            agg[v] = True
    return agg
