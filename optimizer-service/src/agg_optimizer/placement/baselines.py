"""The strategies AGG is compared with, each reduced to the same decision: which switches of a
job's tree sum its streams. All respect slot capacity and the job's cap; jobs are served in
the order the instance lists them (arrival order) unless the strategy is joint by nature.

Routing: strategies that do not use INT (PS, SwitchML, ATP, SHARP, random) run on hop-count
trees with one ECMP choice per job; SOAR, INT-greedy, GRID and the MILP see INT.
"""

from __future__ import annotations

import math
import random as _random

import numpy as np

from agg_optimizer.model.trees import JobTree, evaluate
from agg_optimizer.placement.context import Context, SlotLedger
from agg_optimizer.placement.exact import solve_exact


def ps_only(ctx: Context) -> dict[str, set[str]]:
    return {j.id: set() for j in ctx.jobs}


def _capped(ctx: Context, ledger: SlotLedger, tree: JobTree, order: list[str], job) -> set[str]:
    """Take switches from `order` while the job's cap and the slots allow."""
    out: set[str] = set()
    cap = ctx.cap(job, tree)
    for s in order:
        if len(out) >= cap:
            break
        if s not in out and ledger.take(s, job.pool_slots):
            out.add(s)
    return out


def switchml(ctx: Context) -> dict[str, set[str]]:
    """SwitchML: every worker's top-of-rack switch sums what it sees."""
    ledger = ctx.ledger()
    out = {}
    for job in ctx.jobs:
        tree = ctx.ecmp_trees[job.id]
        tors = list(dict.fromkeys(tree.tor(w) for w in job.workers))
        out[job.id] = _capped(ctx, ledger, tree, tors, job)
    return out


def atp(ctx: Context) -> dict[str, set[str]]:
    """ATP: worker ToRs first; the PS's ToR as second level and as the fallback for racks
    whose ToR had no slot; otherwise the PS sums."""
    ledger = ctx.ledger()
    out = {}
    for job in ctx.jobs:
        tree = ctx.ecmp_trees[job.id]
        tors = list(dict.fromkeys(tree.tor(w) for w in job.workers))
        order = [t for t in tors if t != tree.root] + [tree.root]
        out[job.id] = _capped(ctx, ledger, tree, order, job)
    return out


def sharp(ctx: Context) -> dict[str, set[str]]:
    """SHARP: a full reduction tree, every switch where streams meet, allocated from the
    root down while slots last."""
    ledger = ctx.ledger()
    out = {}
    for job in ctx.jobs:
        tree = ctx.ecmp_trees[job.id]
        merge = [v for v in reversed(tree.order) if tree.inputs(v) >= 2]
        out[job.id] = _capped(ctx, ledger, tree, merge, job)
    return out


def random_k(ctx: Context) -> dict[str, set[str]]:
    """As many switches as SHARP would use, drawn at random on the job's tree."""
    rng = _random.Random(ctx.seed)
    ledger = ctx.ledger()
    out = {}
    for job in ctx.jobs:
        tree = ctx.ecmp_trees[job.id]
        k = sum(1 for v in tree.order if tree.inputs(v) >= 2)
        nodes = list(tree.order)
        rng.shuffle(nodes)
        chosen: set[str] = set()
        for s in nodes:
            if len(chosen) >= min(k, ctx.cap(job, tree)):
                break
            if ledger.take(s, job.pool_slots):
                chosen.add(s)
        out[job.id] = chosen
    return out


def int_greedy(ctx: Context) -> dict[str, set[str]]:
    """INT-greedy-k: on the INT-routed tree, add the switch with the largest drop in the
    surrogate until the cap, or until nothing helps."""
    ledger = ctx.ledger()
    out = {}
    for job in ctx.jobs:
        tree = ctx.int_trees[job.id]
        chosen: set[str] = set()
        cur = evaluate(tree, chosen).surrogate
        while len(chosen) < ctx.cap(job, tree):
            best, best_v = None, cur
            for v in tree.order:
                if v in chosen or not ledger.can_host(v, job.pool_slots):
                    continue
                c = evaluate(tree, chosen | {v}).surrogate
                if c < best_v - 1e-15:
                    best, best_v = v, c
            if best is None:
                break
            ledger.take(best, job.pool_slots)
            chosen.add(best)
            cur = best_v
        out[job.id] = chosen
    return out


# -- SOAR -------------------------------------------------------------------------------------


def soar_tree(tree: JobTree, k: int, eligible: set[str]) -> tuple[float, set[str]]:
    """SOAR's dynamic program: the at most k switches of `eligible` minimising the tree
    surrogate. Each stream pays dist(emitter) - dist(absorber); a state is (switch, its
    nearest aggregator above), over which children's budgets are combined by min-plus
    convolution. Returns (surrogate without the constant worker-edge terms, choice)."""
    inf = math.inf
    ancestors: dict[str, list[str | None]] = {}
    for v in reversed(tree.order):  # parents first
        p = tree.parent[v]
        ancestors[v] = [None] if p is None else [p, *ancestors[p]]

    def dist(a: str | None) -> float:
        return tree.dist[a] if a is not None else 0.0

    # table[(v, a)] = (costs[0..k], back) ; back[kk] = (agg?, [child budgets])
    table: dict[tuple[str, str | None], tuple[list[float], list]] = {}

    def combine(child_tables: list[list[float]]) -> tuple[list[float], list[list[int]]]:
        acc = [0.0] + [inf] * k
        split: list[list[int]] = [[] for _ in range(k + 1)]
        for ct in child_tables:
            new = [inf] * (k + 1)
            nsplit: list[list[int]] = [[] for _ in range(k + 1)]
            for a_k in range(k + 1):
                if acc[a_k] == inf:
                    continue
                for c_k in range(k + 1 - a_k):
                    val = acc[a_k] + ct[c_k]
                    if val < new[a_k + c_k]:
                        new[a_k + c_k] = val
                        nsplit[a_k + c_k] = [*split[a_k], c_k]
            acc, split = new, nsplit
        return acc, split

    for v in tree.order:  # children first
        kids = tree.children[v]
        dv = tree.dist[v]
        wsum = len(tree.direct[v])
        for a in ancestors[v]:
            da = dist(a)
            # v does not sum: its workers and children's emitters stream to a
            no, no_split = combine([table[(c, a)][0] for c in kids])
            no = [x + wsum * (dv - da) if x < inf else inf for x in no]
            best = list(no)
            back: list = [(False, no_split[kk]) for kk in range(k + 1)]
            if v in eligible and k >= 1:
                yes, yes_split = combine([table[(c, v)][0] for c in kids])
                for kk in range(1, k + 1):
                    if yes[kk - 1] == inf:
                        continue
                    val = yes[kk - 1] + (dv - da) + tree.hop[v]
                    if val < best[kk]:
                        best[kk] = val
                        back[kk] = (True, yes_split[kk - 1])
            # "at most kk": carry the better smaller budget forward
            for kk in range(1, k + 1):
                if best[kk - 1] <= best[kk]:
                    best[kk] = best[kk - 1]
                    back[kk] = ("same", kk - 1)
            table[(v, a)] = (best, back)

    chosen: set[str] = set()

    def walk(v: str, a: str | None, kk: int) -> None:
        _, back = table[(v, a)]
        b = back[kk]
        while b[0] == "same":
            kk = b[1]
            b = back[kk]
        is_agg, split = b
        if is_agg:
            chosen.add(v)
        nxt = v if is_agg else a
        for c, ck in zip(tree.children[v], split, strict=True):
            walk(c, nxt, ck)

    walk(tree.root, None, k)
    return table[(tree.root, None)][0][k], chosen


def soar(ctx: Context) -> dict[str, set[str]]:
    """SOAR: per job in arrival order, the optimal k switches on the job's (ECMP) tree with
    INT link weights, among switches that still have a free pool."""
    ledger = ctx.ledger()
    out = {}
    for job in ctx.jobs:
        tree = ctx.ecmp_trees[job.id]
        eligible = {v for v in tree.order if ledger.can_host(v, job.pool_slots)}
        k = min(ctx.cap(job, tree), len(eligible))
        _, chosen = soar_tree(tree, k, eligible)
        for v in chosen:
            ledger.take(v, job.pool_slots)
        out[job.id] = chosen
    return out


def grid(ctx: Context) -> dict[str, set[str]]:
    """GRID-like: the LP relaxation of the exact model, then seeded randomized rounding
    (y=1 with probability y*), repaired against slots and caps in random order."""
    y, _ = solve_exact(ctx, ctx.int_trees, relax=True)
    rng = np.random.default_rng(ctx.seed)
    keys = list(y)
    draws = rng.random(len(keys))
    order = rng.permutation(len(keys))
    ledger = ctx.ledger()
    jobs = {j.id: j for j in ctx.jobs}
    out: dict[str, set[str]] = {j.id: set() for j in ctx.jobs}
    for i in order:
        jid, v = keys[i]
        job = jobs[jid]
        room = len(out[jid]) < ctx.cap(job, ctx.int_trees[jid])
        if draws[i] < y[keys[i]] and room and ledger.take(v, job.pool_slots):
            out[jid].add(v)
    return out
