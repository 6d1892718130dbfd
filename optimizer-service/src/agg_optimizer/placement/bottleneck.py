"""AGG with the min-max (bottleneck) objective: threshold bisection over TU flow problems.

A job's predicted CCT is set by its slowest link: max over its tree's edges of (streams
on the edge) x (per-stream time tau), the worker edges included (`trees.evaluate`).
The jobs' bottleneck objective is T* = min over placements of max over jobs of that.

For a threshold T, an edge e may carry at most floor(T / tau_e) streams. Per job, a
bottom-up pass over the segments (`agg.segments`: a segment is summed at one of its
switches or not at all) finds what T forces:

  * a segment whose input streams n_in fit every edge of its chain is left alone (its
    n_in streams go on up, and its parent may still force it);
  * else it must be summed at a switch at or below its first edge that n_in overflows:
    those arcs stay, the others of the segment are deleted (for this threshold);
  * where no such switch can host a pool, some child segments must be summed first to
    bring n_in down: the fewest that do, largest reduction (n_in(child) - 1) first.

Summing a segment costs one pool and leaves one stream, the least any choice in its
subtree can; so per job the forced set is the fewest pools meeting T (with ample slots
and caps T* is exact; tests check it against brute force). Whether the forced segments
fit the switches' pools and the jobs' caps together is then a min-cost flow on AGG's own
network (`flow_lp`, totally unimodular): forced arcs get a large negative cost, and T is
feasible iff every forced segment is covered. Bisection runs over the finite set of
values n x tau_e. Where pools are scarce the lazy choice can pick a segment whose
switches are full while another choice would fit: T* is then an upper bound (tests
measure how often against brute force).

At T* the surrogate descent of `agg.place` runs with the same forced costs, so the
placement meets T* and, among those, minimises the sum surrogate (more aggregation only
lowers stream counts, so optional arcs never break T*).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from agg_optimizer.model.documents import SolverStats
from agg_optimizer.placement import agg
from agg_optimizer.placement.context import Context
from agg_optimizer.placement.flow_lp import FlowLP, NotTotallyUnimodular, solve_milp


@dataclass
class _Shape:
    """Per job, the segment structure the bottom-up pass walks (fixed across thresholds)."""

    chains: dict[int, list[int]]  # segment bottom -> its nodes, bottom first
    children: list[list[int]]  # forest node -> child nodes
    arc_of: dict[int, int]  # forest node -> AGG arc index (the switch can host a pool)
    order: list[int]  # forest nodes, deepest first
    worker_tau: np.ndarray  # per job: the slowest worker edge (a floor for every T)


def _shape(ctx: Context, m: agg.AggModel) -> _Shape:
    f = m.forest
    n = len(f.job)
    children: list[list[int]] = [[] for _ in range(n)]
    for v in range(n):
        if f.parent[v] >= 0:
            children[int(f.parent[v])].append(v)
    chains: dict[int, list[int]] = {}
    for b in np.unique(f.segment[f.segment >= 0]):
        chain, v = [int(b)], int(b)
        while f.parent[v] >= 0 and f.segment[f.parent[v]] == b:
            v = int(f.parent[v])
            chain.append(v)
        chains[int(b)] = chain
    net = ctx.net
    worker_tau = np.array(
        [
            max(8.0 * j.update_bytes / net.resid[(w, net.attach[w])] for w in j.workers)
            for j in ctx.jobs
        ]
    )
    order = [int(v) for lvl in f.levels for v in lvl]
    arc_of = {int(v): i for i, v in enumerate(m.arc_node)}
    return _Shape(chains, children, arc_of, order, worker_tau)


def forced(
    m: agg.AggModel, shape: _Shape, threshold: float
) -> tuple[np.ndarray, np.ndarray] | None:
    """(forced segment bottoms, per AGG arc: allowed and forced) at `threshold`, or None
    where some job cannot meet it whatever the pools (an edge overflows with one stream,
    or no switch low enough can sum)."""
    f = m.forest
    # every edge carries at least one stream, summed or not
    if np.any(shape.worker_tau > threshold) or np.any(f.tau > threshold):
        return None
    out = np.zeros(len(f.job), dtype=np.int64)  # streams leaving each node upwards
    is_forced: dict[int, bool] = {}
    allowed = np.zeros(len(m.arc_node), dtype=bool)
    tau = f.tau
    for v in shape.order:
        b = int(f.segment[v])
        if b < 0:
            out[v] = f.direct[v] + sum(out[c] for c in shape.children[v])
            if out[v] * tau[v] > threshold:
                return None
            continue
        if b != v:
            continue  # a chain member above its bottom: handled with the bottom
        chain = shape.chains[b]
        kids = shape.children[b]
        while True:
            n_in = int(f.direct[b] + sum(out[c] for c in kids))
            over = [i for i, u in enumerate(chain) if n_in * tau[u] > threshold]
            if not over:
                out[chain] = n_in
                is_forced[b] = False
                break
            arcs = [shape.arc_of[u] for u in chain[: over[0] + 1] if u in shape.arc_of]
            if arcs:
                allowed[arcs] = True
                is_forced[b] = True
                out[chain[: over[0]]] = n_in
                out[chain[over[0] :]] = 1
                break
            # bring n_in down: sum the child segment that removes the most streams
            best, gain = -1, 0
            for c in kids:
                cb = int(f.segment[c])
                if cb < 0 or is_forced.get(cb, True) or out[c] - 1 <= gain:
                    continue
                if any(u in shape.arc_of for u in shape.chains[cb]):
                    best, gain = c, int(out[c] - 1)
            if best < 0:
                return None
            cb = int(f.segment[best])
            allowed[[shape.arc_of[u] for u in shape.chains[cb] if u in shape.arc_of]] = True
            is_forced[cb] = True
            out[best] = 1
    bottoms = np.array(sorted(b for b, x in is_forced.items() if x), dtype=np.int64)
    return bottoms, allowed


def candidates(m: agg.AggModel, shape: _Shape) -> np.ndarray:
    """Every value a job's bottleneck can take: n x tau_e for n up to the edge's raw
    streams, and the worker edges; the optimum is one of them."""
    f = m.forest
    vals = [shape.worker_tau]
    for n in range(1, int(f.raw.max(initial=1)) + 1):
        vals.append(n * f.tau[f.raw >= n])
    out = np.unique(np.concatenate(vals))
    return out[out >= shape.worker_tau.max(initial=0.0)]


def bottlenecks(ctx: Context, m: agg.AggModel, shape: _Shape, chosen: np.ndarray) -> np.ndarray:
    """Per job, max over its edges of streams x tau for the bool choice per forest node."""
    f = m.forest
    load = f.tau * f.streams(chosen)
    per_job = shape.worker_tau.copy()
    np.maximum.at(per_job, f.job, load)
    return per_job


def place(ctx: Context, *, allow_milp: bool = True) -> tuple[dict[str, set[str]], SolverStats]:
    """The least threshold T* every job can meet, then the surrogate descent within it."""
    decision, stats, _ = place_within(ctx, allow_milp=allow_milp)
    return decision, stats


def place_within(
    ctx: Context, *, allow_milp: bool = True
) -> tuple[dict[str, set[str]], SolverStats, float]:
    """`place`, and the threshold T* (s) its placement meets."""
    t0 = time.perf_counter()
    m = agg.build_model(ctx)
    shape = _shape(ctx, m)
    none = np.zeros(len(m.forest.job), dtype=bool)
    base = agg.arc_costs(ctx, m, none)
    big = 4.0 * (float(np.abs(base).sum()) + float(np.abs(m.forest.hop).sum()) + 1.0)
    big += 4.0 * ctx.instance.switching_penalty_s * len(base)
    p = m.problem
    arc_bottom = m.arc_bottom
    lp: FlowLP | None = None
    checks = 0

    def bias_at(threshold: float) -> np.ndarray | None:
        """The forced arcs' bias where T is feasible, else None."""
        nonlocal lp, checks
        got = forced(m, shape, threshold)
        if got is None:
            return None
        bottoms, allowed = got
        bias = np.where(allowed, -big, 0.0)
        if not len(bottoms):
            return bias
        checks += 1
        p.arc_cost = base + bias
        try:
            if lp is None:
                lp = FlowLP(p, prune=False)
            sol = lp.run(p.arc_cost)
        except NotTotallyUnimodular as e:
            if not allow_milp:
                raise
            sol = solve_milp(p, reason=str(e))
        covered = np.unique(arc_bottom[sol.chosen & allowed])
        return bias if len(covered) == len(bottoms) else None

    ts = candidates(m, shape)
    lo, hi = 0, len(ts) - 1
    best = bias_at(ts[hi])
    if best is None:  # cannot happen: at the largest value nothing is forced
        raise RuntimeError("bottleneck: no threshold is feasible")
    while lo < hi:
        mid = (lo + hi) // 2
        b = bias_at(ts[mid])
        if b is None:
            lo = mid + 1
        else:
            hi, best = mid, b
    threshold = float(ts[hi])
    search_s = time.perf_counter() - t0
    decision, stats, _ = agg.place(ctx, allow_milp=allow_milp, model=m, bias=best)
    stats.build_s += search_s
    forced_n = int(np.count_nonzero(best))
    stats.reason = (
        f"bottleneck {threshold:.6g} s met by every job "
        f"({checks} flow checks, {forced_n} forced arcs)"
        + (f"; {stats.reason}" if stats.reason else "")
    )
    return decision, stats, threshold
