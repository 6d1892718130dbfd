"""The true optimum of the predicted CCT on small instances: an exact search, not a solver's
surrogate.

What it searches: for every job, every in-tree towards its PS's switch made of shortest paths
by hops (every route equal-cost multipath can give it: `route_trees`), plus the trees of
`start` (the ones a strategy chose, on INT-weighted or sideways routes, so the
optimum is never above it); on each tree every set of aggregators (programmable switches where
two or more of the job's streams meet, within the job's cap); jointly, every combination whose
pools fit the switches' free slots. The figure minimised is the one the placement document
reports: the jobs' weighted predicted CCT with all of them sharing the fabric
(`polish.Judge`, equal to `engine._reported`).

How: depth-first branch and bound over the jobs, each job's options sorted by their CCT
alone. A job sharing the fabric is never faster than alone (the document takes the max), so
the weighted sum of the chosen options' lone CCTs plus the remaining jobs' best lone CCTs is a
lower bound of every completion of a partial choice; a branch whose bound is not below the
best found is cut. The search starts from `start` (AGG's placement) as the best found.
Everything else is evaluated, so when it ends within its budget the answer is the optimum of
that space (`Optimum.proven`); when the budget runs out, the best found and the lowest bound
still open bracket it.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np

from agg_optimizer.model.documents import Job
from agg_optimizer.model.trees import JobTree, build_tree, evaluate
from agg_optimizer.placement.context import Context
from agg_optimizer.placement.polish import Choice, Judge, Moves

# Trees enumerated per job at most; above it the instance is too large for this search.
MAX_TREES = 4096


class TooLarge(ValueError):
    """The instance's search space is beyond what `optimum` enumerates."""


@dataclass
class Optimum:
    score: float  # the jobs' weighted predicted CCT of the best choice found
    choice: dict[str, Choice]
    proven: bool  # the whole space was searched (bounds cut the rest)
    lower_bound: float  # no choice of the space is below it
    evaluations: int
    options: int  # (tree, aggregators) options over all jobs
    seconds: float


def route_trees(ctx: Context, moves: Moves, job: Job, limit: int = MAX_TREES) -> list[JobTree]:
    """Every in-tree towards the job's PS's switch through its workers' switches in which
    each switch's parent is a neighbour one hop nearer the PS's switch."""
    net = ctx.net
    root = net.attach[job.ps]
    hops = moves.hops(root)
    tors = sorted({net.attach[w] for w in job.workers})
    found: list[dict[str, str | None]] = []

    def rec(parent: dict[str, str | None], todo: list[str]) -> None:
        if len(found) > limit:
            return
        if not todo:
            found.append(dict(parent))
            return
        v, rest = todo[0], todo[1:]
        if v in parent:
            rec(parent, rest)
            return
        if v == root:
            parent[v] = None
            rec(parent, rest)
            del parent[v]
            return
        for u in moves.adj[v]:
            if hops[u] != hops[v] - 1:
                continue
            parent[v] = u
            rec(parent, [*rest, u])
            del parent[v]

    rec({}, tors)
    if len(found) > limit:
        raise TooLarge(f"job {job.id!r}: more than {limit} route trees")
    out = []
    for parent in found:
        pred = np.full(len(net.switch_ids), -1, dtype=np.int64)
        for v, p in parent.items():
            if p is not None:
                pred[net.sw_index[v]] = net.sw_index[p]
        out.append(build_tree(net, job, pred))
    return out


def _options(ctx: Context, job: Job, trees: list[JobTree]) -> list[tuple[float, Choice]]:
    """(CCT alone, (tree, aggregators)) for every tree and aggregator set, the fastest
    first; a tree given twice counts once."""
    net = ctx.net
    cap = job.max_aggregators
    seen = set()
    out = []
    for tree in trees:
        key = tuple(sorted(tree.parent.items()))
        if key in seen:
            continue
        seen.add(key)
        elig = [
            v
            for v in tree.order
            if tree.programmable[v]
            and tree.inputs(v) >= 2
            and net.slots[net.index[v]] >= job.pool_slots
        ]
        top = len(elig) if cap is None else min(cap, len(elig))
        for r in range(top + 1):
            for sub in itertools.combinations(elig, r):
                aggs = frozenset(sub)
                out.append((evaluate(tree, set(aggs)).cct, (tree, aggs)))
    out.sort(key=lambda o: o[0])
    return out


def optimum(
    ctx: Context,
    start: dict[str, Choice] | None = None,
    *,
    max_evals: int = 2_000_000,
    max_seconds: float = 600.0,
) -> Optimum:
    """The exact search described above (`TooLarge` when a job has more than MAX_TREES
    trees)."""
    t0 = time.perf_counter()
    judge = Judge.of(ctx, compiled=True)  # numba's fair shares: hundreds of thousands
    moves = Moves(ctx)
    net = ctx.net
    jobs = list(ctx.jobs)
    opts = {}
    for i, job in enumerate(jobs):
        try:
            trees = route_trees(ctx, moves, job)
        except TooLarge:
            raise TooLarge(
                f"jobs[{i}]: job {job.id!r} has more than {MAX_TREES} shortest route trees; "
                "the exact search is for small instances (docs/evaluation.md)"
            ) from None
        if start is not None:
            trees.append(start[job.id][0])
        opts[job.id] = _options(ctx, job, trees)
    w = {j.id: j.weight for j in jobs}
    # jobs with the most to lose first: their choice moves the bound the most
    jobs.sort(key=lambda j: (-w[j.id] * opts[j.id][0][0], j.id))
    rest_min = [0.0] * (len(jobs) + 1)
    for i in range(len(jobs) - 1, -1, -1):
        rest_min[i] = rest_min[i + 1] + w[jobs[i].id] * opts[jobs[i].id][0][0]
    links = LinkBound.of(judge, jobs, opts)
    free = {s: int(net.slots[net.index[s]]) for s in net.switch_ids}
    best_score = np.inf
    best: dict[str, Choice] | None = None
    if start is not None:
        best_score, best = judge.score(start), dict(start)
    state = {"open": np.inf, "stopped": False}
    chosen: dict[str, Choice] = {}

    def out_of_budget() -> bool:
        return judge.evals >= max_evals or time.perf_counter() - t0 > max_seconds

    def dfs(i: int, partial: float) -> None:
        nonlocal best_score, best
        if i == len(jobs):
            score = judge.score(chosen)
            if score < best_score:
                best_score, best = score, dict(chosen)
            return
        job = jobs[i]
        cut = best_score * (1.0 - 1e-12)
        for k, (iso, (tree, aggs)) in enumerate(opts[job.id]):
            bound = partial + w[job.id] * iso + rest_min[i + 1]
            if bound >= cut:
                break  # options are sorted by iso: every later one is bounded too
            if any(free[a] < job.pool_slots for a in aggs):
                continue
            bound = max(bound, links.bound(i, k))
            if bound >= cut:
                continue
            if state["stopped"] or out_of_budget():
                state["stopped"] = True
                state["open"] = min(state["open"], bound)
                return
            for a in aggs:
                free[a] -= job.pool_slots
            chosen[job.id] = (tree, aggs)
            links.push(i, k)
            dfs(i + 1, partial + w[job.id] * iso)
            links.pop(i)
            del chosen[job.id]
            for a in aggs:
                free[a] += job.pool_slots
            cut = best_score * (1.0 - 1e-12)

    dfs(0, 0.0)
    assert best is not None, "the empty placement is always an option"
    proven = not state["stopped"]
    return Optimum(
        score=float(best_score),
        choice=best,
        proven=proven,
        lower_bound=float(best_score if proven else min(best_score, state["open"])),
        evaluations=judge.evals,
        options=sum(len(o) for o in opts.values()),
        seconds=time.perf_counter() - t0,
    )


class LinkBound:
    """A lower bound of the jobs' weighted CCT from the links they must share.

    Every job moves a known volume over each link: for a chosen option its flows' bytes times
    their multiplicity, for a job not chosen yet the least any of its options moves there
    (host links: every option sends the whole update over each worker's uplink). A link is a
    single machine whatever the sharing: the jobs' completions on it weighted and summed are
    at least what Smith's rule (shortest volume per weight first) gives, and a job completes
    no earlier than its last byte on any link plus its path latency, nor than alone. For
    links whose jobs are disjoint, those excesses over the jobs' lone CCTs add up; the links
    are taken greedily, largest excess first."""

    def __init__(self, vol: list[list[np.ndarray]], low: np.ndarray, iso: list[np.ndarray],
                 lat: list[np.ndarray], weight: np.ndarray) -> None:  # fmt: skip
        self.vol = vol  # per job position, per option: seconds on each link
        self.low = low  # per job position: least seconds on each link over its options
        self.iso = iso  # per job position, per option: CCT alone
        self.lat = lat  # per job position, per option: path latency
        self.w = weight
        self.rows = low.copy()
        self.lone = np.array([float(i[0]) for i in iso])  # best lone CCT while unchosen
        self.late = np.array([float(x.min()) for x in lat])

    @classmethod
    def of(cls, judge: Judge, jobs: list[Job], opts: dict) -> LinkBound:
        n = len(judge.fabric.links)
        cap = judge.fabric.capacity
        vol, iso, lat = [], [], []
        for job in jobs:
            rows = []
            for _, (tree, aggs) in opts[job.id]:
                v = np.zeros(n)
                for links, mult in judge._flows_cached(job, tree, aggs):
                    np.add.at(v, links, mult * 8.0 * job.update_bytes / cap[links])
                rows.append(v)
            vol.append(rows)
            iso.append(np.array([o[0] for o in opts[job.id]]))
            lat.append(np.array([max(o[1][0].worker_delay.values()) for o in opts[job.id]]))
        low = np.array([np.min(np.array(r), axis=0) for r in vol])
        return cls(vol, low, iso, lat, np.array([j.weight for j in jobs]))

    def push(self, i: int, k: int) -> None:
        self.rows[i] = self.vol[i][k]
        self.lone[i] = self.iso[i][k]
        self.late[i] = self.lat[i][k]

    def pop(self, i: int) -> None:
        self.rows[i] = self.low[i]
        self.lone[i] = self.iso[i][0]
        self.late[i] = self.lat[i].min()

    def bound(self, i: int, k: int) -> float:
        """The bound with job position `i` taking option `k` (the others as pushed)."""
        rows, lone, late = self.rows.copy(), self.lone.copy(), self.late.copy()
        rows[i], lone[i], late[i] = self.vol[i][k], self.iso[i][k], self.lat[i][k]
        w = self.w[:, None]
        ratio = np.where(rows > 0, rows / w, np.inf)
        order = np.argsort(ratio, axis=0)
        p = np.take_along_axis(rows, order, axis=0)
        done = np.cumsum(p, axis=0)  # each job's Smith completion on the link, in order
        ws = np.take_along_axis(np.broadcast_to(w, rows.shape), order, axis=0)
        on = p > 0
        smith = np.where(
            on,
            ws
            * (
                done + np.take_along_axis(np.broadcast_to(late[:, None], rows.shape), order, axis=0)
            ),
            0.0,
        ).sum(axis=0)
        alone = np.where(rows > 0, (self.w * lone)[:, None], 0.0).sum(axis=0)
        excess = smith - alone
        base = float(np.dot(self.w, lone))
        used = np.zeros(len(lone), dtype=bool)
        for e in np.argsort(-excess):
            if excess[e] <= 0:
                break
            members = rows[:, e] > 0
            if np.any(used & members):
                continue
            used |= members
            base += float(excess[e])
        return base
