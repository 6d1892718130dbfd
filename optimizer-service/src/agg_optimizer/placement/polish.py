"""Local search on the predicted CCT itself, after AGG's LP and its family.

The LP minimises a surrogate of each job alone (`trees.evaluate`); the placement document
reports every job sharing the fabric (`shared.shared_ccts`), where two jobs that funnel onto
one spine each move at half its rate. `polish` starts from the placement AGG chose and tries,
job by job (the slowest weighted first), the moves that change what the report sees:

- add, drop or move one aggregator of a job (within its cap; on a full switch, taking the
  pool of another job that sums there, which then gives it up);
- re-route one switch of a job's tree to another neighbour (any neighbour not below it and
  no farther from the PS's switch by hops, so the tree stays a tree towards the PS),
  keeping the aggregators that still sum two or more inputs, with and without an
  aggregator at the new parent;
- move a hub: every switch below one switch to another switch at its distance from the PS
  that neighbours them all, the hub's aggregator going along; and the same move traded
  with another job whose summing hub is there (two jobs swapping spines, which neither
  move alone improves).

A move is kept when it lowers the jobs' weighted predicted CCT as the document reports it
(`Judge.score`, the same numbers as `engine._reported`) by `MIN_GAIN`, plus the instance's
switching penalty for each aggregator not in `current` where it sets one. The search ends
when no move of any job improves it or after `MAX_EVALS` evaluations; it never returns a
placement worse than the one it was given. `optimum.py` computes the true optimum of the
same figure on small instances, which is what this is measured against
(docs/evaluation.md, "How far from the optimum?").
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from agg_optimizer.model.documents import Job
from agg_optimizer.model.trees import JobTree, build_tree, evaluate
from agg_optimizer.placement.context import Context
from agg_optimizer.placement.shared import Flows, job_flows, round_ends
from agg_optimizer.sim.fabric import Fabric

# Evaluations of the shared model a polish may spend (each one simulates one round of every
# job: 0.5-2 ms for 4-12 jobs here). On the 40 instances of `make bench-family` the search
# ended by itself after 106-1,753 evaluations; capped at 600 it kept all but 0.7% of the
# figure an unbounded search reached (docs/benchmarks/family.md), at 1.2 s of CPU at most.
MAX_EVALS = 600
# A move must lower the weighted CCT by this fraction to be kept (float noise is not a gain).
MIN_GAIN = 1e-4

Choice = tuple[JobTree, frozenset[str]]


@dataclass
class Judge:
    """The placement document's weighted predicted CCT of any choice of trees and
    aggregators, without building the document: per job max(shared transfer + path latency,
    isolated CCT), as `engine.build_placement` reports it up to `shared.EXACT_MAX_JOBS`."""

    ctx: Context
    fabric: Fabric
    evals: int = 0
    compiled: bool = False  # numba's fair shares (`Simulator`): for many evaluations
    # per (job, tree, aggregators): its flows, and its lone CCT with its path latency
    _flows: dict[tuple, Flows] = field(default_factory=dict, repr=False)
    _lone: dict[tuple, tuple[float, float]] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, ctx: Context, *, compiled: bool = False) -> Judge:
        fabric = Fabric.from_topology(ctx.instance.topology)
        fabric.capacity = np.array([ctx.net.resid[e] for e in fabric.links], dtype=np.float64)
        return cls(ctx, fabric, compiled=compiled)

    def flows(self, job: Job, tree: JobTree, aggs: frozenset[str]) -> Flows:
        """The job's components as (links, multiplicity), as `shared_ccts` adds them."""
        paths = SimpleNamespace(worker_paths={w: tree.path(w) for w in job.workers})
        return job_flows(self.fabric, paths, set(aggs), job.ps)

    def job_costs(self, choice: dict[str, Choice]) -> dict[str, float]:
        """Each job's predicted CCT (seconds) under `choice` (job id -> (tree, aggregators))."""
        self.evals += 1
        rounds = [
            (job.id, float(job.update_bytes), self._flows_cached(job, *choice[job.id]))
            for job in self.ctx.jobs
        ]
        width = max((len(links) for _, _, fl in rounds for links, _ in fl), default=8)
        done = round_ends(self.fabric, rounds, compiled=self.compiled, width=width)
        out = {}
        for job in self.ctx.jobs:
            tree, aggs = choice[job.id]
            iso, latency = self._alone(job, tree, aggs)
            out[job.id] = max(done[job.id] + latency, iso) if job.id in done else iso
        return out

    def _alone(self, job: Job, tree: JobTree, aggs: frozenset[str]) -> tuple[float, float]:
        """The job's CCT alone (`trees.evaluate`) and its path latency."""
        key = (job.id, _tree_key(tree), aggs)
        if key not in self._lone:
            self._lone[key] = (evaluate(tree, set(aggs)).cct, max(tree.worker_delay.values()))
        return self._lone[key]

    def score(self, choice: dict[str, Choice]) -> float:
        costs = self.job_costs(choice)
        return sum(job.weight * costs[job.id] for job in self.ctx.jobs)

    def _flows_cached(self, job: Job, tree: JobTree, aggs: frozenset[str]) -> Flows:
        key = (job.id, _tree_key(tree), aggs)
        if key not in self._flows:
            self._flows[key] = self.flows(job, tree, aggs)
        return self._flows[key]


def _tree_key(tree: JobTree) -> tuple[tuple[str, str | None], ...]:
    return tuple(sorted(tree.parent.items(), key=lambda kv: kv[0]))


class Moves:
    """The neighbourhood of one job's choice in a placement of all jobs: each move is a
    mapping of job ids to their new choice (one job, or two where one job takes a pool
    another held)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        net = ctx.net
        self.adj: dict[str, list[str]] = {s: [] for s in net.switch_ids}
        kind = {n.id: n.kind for n in ctx.instance.topology.nodes}
        for ln in ctx.instance.topology.links:
            if kind[ln.src] == "switch" and kind[ln.dst] == "switch":
                self.adj[ln.src].append(ln.dst)
                self.adj[ln.dst].append(ln.src)
        for s in self.adj:
            self.adj[s].sort()
        self._hops: dict[str, dict[str, int]] = {}

    def hops(self, root: str) -> dict[str, int]:
        """Hop distance of every switch to `root`."""
        if root not in self._hops:
            d = {root: 0}
            queue = [root]
            for x in queue:
                for y in self.adj[x]:
                    if y not in d:
                        d[y] = d[x] + 1
                        queue.append(y)
            self._hops[root] = d
        return self._hops[root]

    def of(
        self, job: Job, choice: dict[str, Choice], free: dict[str, int]
    ) -> Iterator[dict[str, Choice]]:
        """Moves of `job` in `choice`; `free` counts the slots the other jobs leave."""
        tree, aggs = choice[job.id]
        cap = job.max_aggregators if job.max_aggregators is not None else len(tree.order)
        meet = [v for v in tree.order if tree.programmable[v] and tree.inputs(v) >= 2]
        outside = [v for v in meet if v not in aggs]
        for a in sorted(aggs):  # drop one
            yield {job.id: (tree, aggs - {a})}
        if len(aggs) < cap:  # add one
            for v in outside:
                yield from self._taking(job, choice, free, v, {job.id: (tree, aggs | {v})})
        for a in sorted(aggs):  # move one
            for v in outside:
                yield from self._taking(job, choice, free, v, {job.id: (tree, (aggs - {a}) | {v})})
        yield from self._reroutes(job, choice, free, cap)

    def _taking(
        self,
        job: Job,
        choice: dict[str, Choice],
        free: dict[str, int],
        v: str,
        move: dict[str, Choice],
    ) -> Iterator[dict[str, Choice]]:
        """`move` (which puts one of `job`'s pools on `v`) where `v` has a free pool, else
        the same move with each other job that holds a pool on `v` giving it up."""
        if free.get(v, 0) >= job.pool_slots:
            yield move
            return
        for other in self.ctx.jobs:
            if other.id == job.id:
                continue
            t, a = choice[other.id]
            if v in a and free.get(v, 0) + other.pool_slots >= job.pool_slots:
                yield {**move, other.id: (t, a - {v})}

    def _tree(self, job: Job, tree: JobTree, moved: dict[str, str]) -> JobTree | None:
        """`tree` with each switch in `moved` sent to its new parent (and a new parent that
        was not in the tree sent up by hops), or None where that is no tree to the PS."""
        net = self.ctx.net
        hops = self.hops(tree.root)
        pred = np.full(len(net.switch_ids), -1, dtype=np.int64)
        parent = {x: px for x, px in tree.parent.items() if px is not None}
        parent.update(moved)
        for u in set(moved.values()):
            x = u
            while x != tree.root and x not in parent:
                x_next = min(y for y in self.adj[x] if hops.get(y, 1 << 30) < hops[x])
                parent[x] = x_next
                x = x_next
        for x, px in parent.items():
            pred[net.sw_index[x]] = net.sw_index[px]
        # every workers' switch must reach the root without a cycle
        for w in job.workers:
            x, seen = net.attach[w], set()
            while x != tree.root:
                if x in seen:
                    return None
                seen.add(x)
                x = parent[x]
        return build_tree(net, job, pred)

    def _reroutes(
        self, job: Job, choice: dict[str, Choice], free: dict[str, int], cap: int
    ) -> Iterator[dict[str, Choice]]:
        """One switch to another parent; or every switch below one (a hub) to another
        switch at the hub's distance from the PS, the hub's aggregator going with them."""
        tree, aggs = choice[job.id]
        hops = self.hops(tree.root)
        for v in tree.order:
            p = tree.parent[v]
            if p is None:
                continue
            below = _subtree(tree, v)
            for u in self.adj[v]:
                if u == p or u in below or hops.get(u, 1 << 30) > hops[v]:
                    continue
                new = self._tree(job, tree, {v: u})
                if new is None:
                    continue
                kept = frozenset(a for a in aggs if a in new.parent and new.inputs(a) >= 2)
                yield {job.id: (new, kept)}
                if u not in kept and len(kept) < cap and new.programmable[u] and new.inputs(u) >= 2:
                    yield from self._taking(job, choice, free, u, {job.id: (new, kept | {u})})
        for hub in tree.order:  # move a hub: all its switch children go to another switch
            for u, new in self._hub_moves(job, tree, hub):
                kept = frozenset(a for a in aggs if a in new.parent and new.inputs(a) >= 2)
                yield {job.id: (new, kept)}
                if hub in aggs and new.programmable[u] and new.inputs(u) >= 2:
                    move = {job.id: (new, kept | {u})}
                    yield from self._taking(job, choice, free, u, move)
                    yield from self._swapping(job, choice, free, hub, u, move)

    def _hub_moves(self, job: Job, tree: JobTree, hub: str) -> Iterator[tuple[str, JobTree]]:
        """(u, the tree with every switch below `hub` sent to u) for each switch u that
        neighbours them all, at the hub's distance from the PS and not in the tree."""
        kids = tree.children[hub]
        if tree.parent[hub] is None or not kids or tree.direct[hub]:
            return
        hops = self.hops(tree.root)
        for u in sorted(set.intersection(*(set(self.adj[c]) for c in kids))):
            if u == hub or u in tree.parent or hops.get(u, 1 << 30) != hops[hub]:
                continue
            new = self._tree(job, tree, dict.fromkeys(kids, u))
            if new is not None:
                yield u, new

    def _swapping(
        self,
        job: Job,
        choice: dict[str, Choice],
        free: dict[str, int],
        hub: str,
        u: str,
        move: dict[str, Choice],
    ) -> Iterator[dict[str, Choice]]:
        """`move` (the job's summing hub to u) with each other job whose summing hub is u
        moving to the job's old hub: two jobs trading their spines, which neither move
        alone improves where each would then share the other's."""
        for other in self.ctx.jobs:
            if other.id == job.id:
                continue
            t, a = choice[other.id]
            if u not in a or hub in t.parent:
                continue
            # `free` leaves the job's own pools free: its hub pool is the other's to take
            if free.get(hub, 0) < other.pool_slots or (
                free.get(u, 0) + other.pool_slots < job.pool_slots
            ):
                continue
            for x, new in self._hub_moves(other, t, u):
                if x == hub and new.programmable[hub] and new.inputs(hub) >= 2:
                    kept = frozenset(b for b in a if b in new.parent and new.inputs(b) >= 2)
                    yield {**move, other.id: (new, kept | {hub})}


def _subtree(tree: JobTree, v: str) -> set[str]:
    out = {v}
    stack = [v]
    while stack:
        x = stack.pop()
        for c in tree.children[x]:
            out.add(c)
            stack.append(c)
    return out


def polish(
    ctx: Context,
    trees: dict[str, JobTree],
    aggs: dict[str, set[str]],
    *,
    max_evals: int = MAX_EVALS,
) -> tuple[dict[str, JobTree], dict[str, set[str]], int]:
    """A local optimum of the reported weighted CCT from (`trees`, `aggs`): the trees, the
    aggregators and how many moves were kept."""
    from agg_optimizer.sim import fairshare

    # numba's fair shares where this process has loaded them already (a service after its
    # first solve, a simulation): 4-5x faster an evaluation, but their load costs as much
    # as a polish's 600 evaluations without them (docs/benchmarks/family.md)
    judge = Judge.of(ctx, compiled=fairshare._compiled is not None)
    moves = Moves(ctx)
    net = ctx.net
    choice: dict[str, Choice] = {
        j.id: (trees[j.id], frozenset(aggs.get(j.id, set()))) for j in ctx.jobs
    }
    slots = {s: int(net.slots[net.index[s]]) for s in net.switch_ids}
    pen = ctx.instance.switching_penalty_s
    current = {jid: set(sw) for jid, sw in ctx.instance.current.items()}

    def cost(c: dict[str, Choice]) -> float:
        """The reported figure, plus the instance's switching penalty for every aggregator
        not in `current` (weighted as `Context.weighted_cost` weighs it): a move must pay
        for the churn it makes, as the LP's does."""
        out = judge.score(c)
        if pen:
            for j in ctx.jobs:
                out += j.weight * pen * len(c[j.id][1] - current.get(j.id, set()))
        return out

    best = cost(choice)
    kept = 0
    improved = True
    # Passes over the jobs, the slowest weighted job first; within a job, the first move
    # that lowers the figure is kept and the job is searched again from its new choice.
    while improved and judge.evals < max_evals:
        improved = False
        costs = judge.job_costs(choice)
        order = sorted(ctx.jobs, key=lambda j: (-j.weight * costs[j.id], j.id))
        for job in order:
            again = True
            while again and judge.evals < max_evals:
                again = False
                free = _free(ctx, slots, choice, job)
                for move in moves.of(job, choice, free):
                    if judge.evals >= max_evals:
                        break
                    trial = {**choice, **move}
                    score = cost(trial)
                    if score < best * (1.0 - MIN_GAIN):
                        choice, best, kept = trial, score, kept + 1
                        improved = again = True
                        break
    return (
        {jid: c[0] for jid, c in choice.items()},
        {jid: set(c[1]) for jid, c in choice.items()},
        kept,
    )


def _free(
    ctx: Context, slots: dict[str, int], choice: dict[str, Choice], job: Job
) -> dict[str, int]:
    """Slots each switch has free for `job`: what the other jobs' pools leave."""
    free = dict(slots)
    for other in ctx.jobs:
        if other.id != job.id:
            for a in choice[other.id][1]:
                free[a] -= other.pool_slots
    return free
