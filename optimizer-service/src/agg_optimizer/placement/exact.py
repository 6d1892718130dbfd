"""The exact MILP of the tree surrogate (the `milp` oracle) and its LP relaxation (GRID).

Per job j and tree switch v: y_jv = 1 if v sums job j, s_jv = streams leaving v upwards.
    min  sum_j w_j [ sum_v tau_jv s_jv + sum_v (hop_v + penalty_jv) y_jv ]
    s.t. s_jv >= direct_jv + sum_{c child of v} s_jc - (raw_jv - 1) y_jv
         s_jv >= 1,  sum_v y_jv <= K_j,  sum_j pool_j y_jv <= slots_v,  y binary
Minimisation drives s_jv to 1 where v sums and to its input count elsewhere, so this is the
surrogate of `trees.evaluate` exactly, products of choices on one path included. It is not
TU (the s rows chain the levels), which is why AGG does not solve it directly.
"""

from __future__ import annotations

import time

import highspy
import numpy as np

from agg_optimizer.model.documents import SolverStats
from agg_optimizer.model.trees import JobTree
from agg_optimizer.placement.context import Context
from agg_optimizer.placement.flow_lp import SolveError


def _model(ctx: Context, trees: dict[str, JobTree], *, relax: bool, time_limit: float):
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", time_limit)
    h.setOptionValue("threads", 1)
    h.setOptionValue("mip_rel_gap", 1e-9)
    inf = highspy.kHighsInf
    pen = ctx.instance.switching_penalty_s
    ycols: dict[tuple[str, str], int] = {}
    cost: list[float] = []
    lo: list[float] = []
    hi: list[float] = []
    integer: list[int] = []
    rows: list[tuple[float, float, list[int], list[float]]] = []
    by_switch: dict[str, list[tuple[int, int]]] = {}
    for job in ctx.jobs:
        tree = trees[job.id]
        current = set(ctx.instance.current.get(job.id, []))
        scol: dict[str, int] = {}
        jy: list[int] = []
        for v in tree.order:
            scol[v] = len(cost)
            cost.append(job.weight * tree.tau[v])
            lo.append(1.0)
            hi.append(float(tree.raw[v]))
            eligible = (
                tree.programmable[v]
                and tree.raw[v] >= 2
                and ctx.net.slots[ctx.net.index[v]] >= job.pool_slots
            )
            cols = [scol[v]] + [scol[c] for c in tree.children[v]]
            vals = [1.0] + [-1.0] * len(tree.children[v])
            if eligible:
                y = len(cost)
                ycols[(job.id, v)] = y
                cost.append(job.weight * (tree.hop[v] + (pen if v not in current else 0.0)))
                lo.append(0.0)
                hi.append(1.0)
                integer.append(y)
                jy.append(y)
                by_switch.setdefault(v, []).append((y, job.pool_slots))
                cols.append(y)
                vals.append(float(tree.raw[v] - 1))
            rows.append((float(len(tree.direct[v])), inf, cols, vals))
        if job.max_aggregators is not None and jy:
            rows.append((-inf, float(job.max_aggregators), jy, [1.0] * len(jy)))
    for v, items in by_switch.items():
        slots = float(ctx.net.slots[ctx.net.index[v]])
        rows.append((-inf, slots, [c for c, _ in items], [float(p) for _, p in items]))
    n = len(cost)
    h.addVars(n, np.array(lo), np.array(hi))
    h.changeColsCost(n, np.arange(n, dtype=np.int32), np.array(cost))
    if not relax and integer:
        h.changeColsIntegrality(
            len(integer),
            np.array(integer, dtype=np.int32),
            np.full(len(integer), highspy.HighsVarType.kInteger),
        )
    for rlo, rhi, cols, vals in rows:
        h.addRow(rlo, rhi, len(cols), np.array(cols, dtype=np.int32), np.array(vals))
    return h, ycols


def solve_exact(
    ctx: Context, trees: dict[str, JobTree], *, relax: bool = False, time_limit: float = 120.0
) -> tuple[dict[tuple[str, str], float], SolverStats]:
    """y values per (job id, switch) and solver stats."""
    t0 = time.perf_counter()
    h, ycols = _model(ctx, trees, relax=relax, time_limit=time_limit)
    t1 = time.perf_counter()
    h.run()
    t2 = time.perf_counter()
    status = h.getModelStatus()
    ok = status == highspy.HighsModelStatus.kOptimal
    has_sol = h.getInfo().primal_solution_status == 2  # feasible point available
    if not ok and not (status == highspy.HighsModelStatus.kTimeLimit and has_sol):
        raise SolveError(f"HiGHS returned {h.modelStatusToString(status)}")
    col = np.asarray(h.getSolution().col_value)
    y = {key: float(col[c]) for key, c in ycols.items()}
    yv = np.array(list(y.values())) if y else np.zeros(0)
    stats = SolverStats(
        path="milp",
        status="optimal" if ok else "time limit (best found)",
        build_s=t1 - t0,
        solve_s=t2 - t1,
        objective=float(h.getInfo().objective_function_value),
        max_integrality_gap=float(np.max(np.abs(yv - np.round(yv)))) if len(yv) else 0.0,
        columns=h.getNumCol(),
        rows=h.getNumRow(),
        iterations=1,
    )
    return y, stats


def place_exact(
    ctx: Context, *, time_limit: float = 120.0
) -> tuple[dict[str, set[str]], SolverStats]:
    y, stats = solve_exact(ctx, ctx.int_trees, time_limit=time_limit)
    aggs: dict[str, set[str]] = {j.id: set() for j in ctx.jobs}
    for (jid, v), val in y.items():
        if val > 0.5:
            aggs[jid].add(v)
    return aggs, stats
