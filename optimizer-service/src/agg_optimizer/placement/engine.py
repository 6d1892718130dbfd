"""One entry point for every strategy: instance in, placement document out."""

from __future__ import annotations

import copy
import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from agg_optimizer.model.documents import Aggregator, Instance, JobPlacement, Placement, SolverStats
from agg_optimizer.model.network import Network
from agg_optimizer.model.pools import PoolAllocator
from agg_optimizer.model.trees import JobTree, evaluate, floor_ccts
from agg_optimizer.model.validation import check_instance
from agg_optimizer.placement import agg, baselines, bottleneck, exact
from agg_optimizer.placement.context import SHARED_ROUTING_MAX_JOBS, Context
from agg_optimizer.placement.forest_placement import job_placements

Decision = dict[str, set[str]]


# Rounds of re-routing around a job's own stream funnels (see `_rerouted`); 0 turns it off.
REROUTE_ROUNDS = 4
# Up to this many jobs the re-routing also follows INT-greedy's funnels (a second
# trajectory: one greedy per round; on a k=16 fat-tree with 32 jobs it made AGG's solve
# 6x slower, 0.8 -> 4.8 s, which the service's loop should not pay).
STEER_MAX_JOBS = 16
# Up to this many jobs AGG also computes its family (agg-own, agg-mm, greedy-rr: each
# cheap, each sometimes better: docs/benchmarks/family.md) and returns the member whose
# placement reports the lowest weighted predicted CCT. Above it, AGG alone (the family
# would multiply the service loop's solve time).
FAMILY_MAX_JOBS = 16
# Up to FAMILY_MAX_JOBS jobs AGG's chosen placement is then improved by a local search on
# the predicted CCT itself (`polish`); False turns it off (benchmarks measure before/after).
POLISH = True


def _judge(ctx: Context, aggs: Decision) -> tuple[float, dict[str, tuple[str, str, int]]]:
    """The jobs' weighted predicted CCT (each job moves at the pace of its slowest link, where
    the streams not summed before it share it: `trees.evaluate`'s `cct`), and per job the
    switch-to-switch link that sets it when several of its unsummed streams share it:
    (from, to, streams)."""
    score = 0.0
    funnels = {}
    for job in ctx.jobs:
        tree = ctx.int_trees[job.id]
        cost = evaluate(tree, aggs.get(job.id, set()))
        score += job.weight * cost.cct
        worst = max(tree.order, key=lambda v: cost.streams[v] * tree.tau[v])
        parent = tree.parent[worst]
        if parent is not None and cost.streams[worst] > 1:
            funnels[job.id] = (worst, parent, cost.streams[worst])
    return score, funnels


def _rerouted(
    place: Callable[[Context], tuple[Decision, SolverStats]],
    steer: Callable[[Context], Decision] | None = None,
) -> Callable[[Context], tuple[Decision, SolverStats, dict[str, JobTree]]]:
    """`place` (the LP, or the exact MILP) on INT trees, then re-routing. Placement sums
    where streams meet on the trees it is given, but a tree can funnel several of a job's
    streams over one link before any switch with a free pool could sum them, and a summed
    job moves at the pace of that link. Such a link is made to look slower to that job's
    routing (by its stream count) and `place` runs again on the new trees, for up to
    REROUTE_ROUNDS rounds (penalties accumulate). The round with the lowest predicted CCT
    (bottleneck) of the jobs wins, the first one included. The LP and its integrality are
    untouched: only the trees it is given change.

    With `steer` (up to STEER_MAX_JOBS jobs), a second trajectory re-routes around the
    funnels of `steer`'s placement instead, `place` still placing and being judged on every
    tree: the trees a placement rule funnels on depend on the rule, and on k8-load0 the LP's
    own funnels led it to worse trees than greedy's did in 7 of 20 seeds (docs/evaluation.md,
    "Does the LP earn its place?")."""

    def run(ctx: Context) -> tuple[Decision, SolverStats, dict[str, JobTree] | None]:
        aggs, stats = place(ctx)
        if len(ctx.jobs) > SHARED_ROUTING_MAX_JOBS:
            return aggs, stats, None  # ctx's own INT trees
        score, funnels0 = _judge(ctx, aggs)
        best = first = (score, ctx, aggs, stats)
        kept = 0
        # Each trajectory re-routes around the funnels of one placement rule on the current
        # trees: `place`'s own, and `steer`'s when given; `place` is judged on every tree.
        drivers = [None] if steer is None or len(ctx.jobs) > STEER_MAX_JOBS else [None, steer]
        for driver in drivers:
            funnels = funnels0 if driver is None else _judge(ctx, driver(ctx))[1]
            penalty: dict[str, dict[tuple[str, str], float]] = {}
            for _ in range(REROUTE_ROUNDS):
                if not funnels:
                    break
                for job_id, (u, v, streams) in funnels.items():
                    links = penalty.setdefault(job_id, {})
                    links[(u, v)] = links.get((u, v), 1.0) * (1.0 + streams)
                cur = ctx.rerouted(copy.deepcopy(penalty))
                aggs, stats = place(cur)
                score, funnels = _judge(cur, aggs)
                if driver is not None:
                    funnels = _judge(cur, driver(cur))[1]
                if score < best[0]:
                    kept += 1
                    best = (score, cur, aggs, stats)
        if best[1] is not ctx and _reported(best[1], best[2]) >= _reported(ctx, first[2]):
            # Rounds are judged on each job alone (`_judge`, cheap); the placement reports
            # the jobs sharing the fabric. A re-routing that looks better alone but worse
            # shared is not kept (it was on 9 of 96 k=4/k=6 instances, up to +3.8%).
            best, kept = first, 0
        _, ctx, aggs, stats = best
        stats.reroutes = kept
        return aggs, stats, ctx.int_trees

    return run


def _reported(ctx: Context, aggs: Decision, trees: dict[str, JobTree] | None = None) -> float:
    """The jobs' weighted predicted CCT as the placement document reports it (shared), on
    `trees` (default: ctx's INT trees)."""
    p = build_placement(ctx, "", ctx.int_trees if trees is None else trees, aggs, SolverStats())
    weight = {j.id: j.weight for j in ctx.jobs}
    return sum(weight[jp.job_id] * jp.predicted_cct_s for jp in p.jobs)


def _heuristic(fn: Callable[[Context], Decision], int_aware: bool):
    def run(ctx: Context) -> tuple[Decision, SolverStats, dict[str, JobTree]]:
        trees = ctx.int_trees if int_aware else ctx.ecmp_trees
        return fn(ctx), SolverStats(path="heuristic"), trees

    return run


# A strategy's trees are None where they are the context's own INT trees (`build_placement`
# then describes large instances from the forest, without building a JobTree per job).
Strategy = Callable[[Context], tuple[Decision, SolverStats, dict[str, JobTree] | None]]


def _best_of_family(lead: Strategy, family: dict[str, Callable[[], Strategy]]) -> Strategy:
    """`lead`, then (up to FAMILY_MAX_JOBS jobs) each member of `family` on the same
    context: the placement whose document reports the lowest weighted predicted CCT, `lead`
    on ties. Its stats say which member it is (`SolverStats.family_choice`)."""

    def run(ctx: Context) -> tuple[Decision, SolverStats, dict[str, JobTree] | None]:
        aggs, stats, trees = lead(ctx)
        if len(ctx.jobs) > FAMILY_MAX_JOBS:
            return aggs, stats, trees
        best = (_reported(ctx, aggs, trees), aggs, stats, trees)
        stats.family_choice = "agg"
        for name, member in family.items():
            a, s, t = member()(ctx)
            score = _reported(ctx, a, t)
            if score < best[0] * (1.0 - 1e-12):
                s.family_choice = name
                best = (score, a, s, t)
        _, aggs, stats, trees = best
        if POLISH and ctx.polish:  # up to FAMILY_MAX_JOBS jobs, within EXACT_MAX_JOBS
            from agg_optimizer.placement import polish  # the simulator's core: only when placing

            trees, aggs, stats.polish_moves = polish.polish(
                ctx, trees if trees is not None else ctx.int_trees, aggs
            )
        return aggs, stats, trees

    return run


STRATEGIES: dict[str, Strategy] = {
    # AGG: the LP with re-routing (around its own funnels and INT-greedy's), then the best
    # of its family on small instances (`_best_of_family`).
    "agg": _best_of_family(
        _rerouted(lambda ctx: agg.place(ctx)[:2], steer=baselines.int_greedy),
        {name: lambda name=name: STRATEGIES[name] for name in ("agg-own", "agg-mm", "greedy-rr")},
    ),
    # AGG with the min-max objective first (bottleneck.py), the surrogate within it.
    "agg-mm": _rerouted(bottleneck.place, steer=baselines.int_greedy),
    # Ablation: AGG re-routing around its own funnels only (AGG before issue 16's item 3).
    "agg-own": _rerouted(lambda ctx: agg.place(ctx)[:2]),
    "ps": _heuristic(baselines.ps_only, False),
    "switchml": _heuristic(baselines.switchml, False),
    "atp": _heuristic(baselines.atp, False),
    "sharp": _heuristic(baselines.sharp, False),
    "soar": _heuristic(baselines.soar, False),
    "grid": _heuristic(baselines.grid, True),
    "random": _heuristic(baselines.random_k, False),
    "greedy": _heuristic(baselines.int_greedy, True),
    "milp": _rerouted(exact.place_exact, steer=baselines.int_greedy),
    # Ablation, not a published strategy: INT-greedy with AGG's re-routing, to tell what the
    # LP adds over the re-routing (docs/evaluation.md). Not in the scenarios' default set.
    "greedy-rr": _rerouted(lambda ctx: (baselines.int_greedy(ctx), SolverStats(path="heuristic"))),
}
# Not in the scenarios' default strategy set (an ablation and a variant of AGG).
ABLATIONS = ("greedy-rr", "agg-mm", "agg-own")


def build_placement(
    ctx: Context,
    name: str,
    trees: dict[str, JobTree] | None,
    aggs: Decision,
    stats: SolverStats,
) -> Placement:
    """The placement document: who sums what, where it goes next, and the predicted CCT.
    `trees` None: ctx's INT trees."""
    inst = ctx.instance
    pools = PoolAllocator(
        {n.id: n.slots for n in inst.topology.nodes if n.kind == "switch"}, inst.reserved
    )
    from agg_optimizer.placement.shared import (  # the simulator's core: only when placing
        EXACT_MAX_JOBS,
        shared_ccts,
    )

    if trees is None and len(ctx.jobs) > EXACT_MAX_JOBS:
        return _placement_from_forest(ctx, name, aggs, stats, pools)
    if trees is None:
        trees = ctx.int_trees
    jobs: list[JobPlacement] = []
    total = 0.0
    ccts = []
    for job in ctx.jobs:
        tree = trees[job.id]
        chosen = aggs.get(job.id, set())
        cost = evaluate(tree, chosen)

        def absorber(
            start: str | None, chosen: set[str] = chosen, tree: JobTree = tree, ps: str = job.ps
        ) -> str:
            v = start
            while v is not None:
                if v in chosen:
                    return v
                v = tree.parent[v]
            return ps

        children: dict[str, list[str]] = {}
        for w in job.workers:
            children.setdefault(absorber(tree.tor(w)), []).append(w)
        nexts = {}
        for a in sorted(chosen):  # a set: sorted, so the document is the same on every run
            nexts[a] = absorber(tree.parent[a])
            children.setdefault(nexts[a], []).append(a)
        placed = []
        for a in [v for v in tree.order if v in chosen]:
            placed.append(
                Aggregator(
                    switch=a,
                    children=children.get(a, []),
                    fan_in=len(children.get(a, [])),
                    next_hop=nexts[a],
                    pool=pools.take(a, job.pool_slots),
                )
            )
        jobs.append(
            JobPlacement(
                job_id=job.id,
                aggregators=placed,
                worker_paths={w: tree.path(w) for w in job.workers},
                ps_fan_in=len(children.get(job.ps, [])),
                predicted_cct_s=cost.cct,
                surrogate_s=cost.surrogate,
            )
        )
        total += job.weight * cost.surrogate
        ccts.append(cost.cct)
    shared = shared_ccts(inst, jobs, ctx.net)
    for jp, job in zip(jobs, ctx.jobs, strict=True):
        jp.predicted_cct_isolated_s = jp.predicted_cct_s
        if shared is not None and job.id in shared:
            latency = max(trees[job.id].worker_delay.values())
            # Sharing never makes a job faster than alone (the guard absorbs float slack).
            jp.predicted_cct_s = max(shared[job.id] + latency, jp.predicted_cct_s)
    ccts = [jp.predicted_cct_s for jp in jobs]
    floors = _floors(ctx, jobs)
    return Placement(
        strategy=name,
        jobs=jobs,
        objective_s=ctx.weighted_cost(trees, aggs) if ctx.instance.switching_penalty_s else total,
        mean_predicted_cct_s=sum(ccts) / len(ccts) if ccts else 0.0,
        mean_floor_cct_s=sum(floors) / len(floors) if floors else None,
        cct_model="isolated" if shared is None else "shared",
        stats=stats,
    )


def _floors(ctx: Context, jobs: list[JobPlacement]) -> list[float]:
    """Each job's network bound (`trees.floor_cct`), into its placement too."""
    by_id = {job.id: job for job in ctx.jobs}
    out = floor_ccts(ctx.net, [by_id[jp.job_id] for jp in jobs])
    for jp, floor in zip(jobs, out, strict=True):
        jp.floor_cct_s = floor
    return out


def _placement_from_forest(
    ctx: Context, name: str, aggs: Decision, stats: SolverStats, pools: PoolAllocator
) -> Placement:
    """`build_placement` on ctx's INT trees above EXACT_MAX_JOBS jobs (no shared CCT),
    from the forest's arrays (`forest_placement`)."""
    jobs, surrogates = job_placements(ctx, aggs, pools)
    pen = ctx.instance.switching_penalty_s
    total = 0.0
    for job, cost in zip(ctx.jobs, surrogates, strict=True):
        if pen:  # Context.weighted_cost, term by term
            a = aggs.get(job.id, set())
            cost += pen * len(a - set(ctx.instance.current.get(job.id, [])))
        total += job.weight * cost
    for jp in jobs:
        jp.predicted_cct_isolated_s = jp.predicted_cct_s
    ccts = [jp.predicted_cct_s for jp in jobs]
    floors = _floors(ctx, jobs)
    return Placement(
        strategy=name,
        jobs=jobs,
        objective_s=total,
        mean_predicted_cct_s=sum(ccts) / len(ccts) if ccts else 0.0,
        mean_floor_cct_s=sum(floors) / len(floors) if floors else None,
        cct_model="isolated",
        stats=stats,
    )


@contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """Python's cycle collector off while solving. A large instance is millions of live
    objects (k=64 with 10,000 jobs: its 393,216 telemetry entries alone), every full
    collection walks all of them, and the solve's own allocations triggered enough of them
    to take 1 to 4 s of a 6-10 s solve at k=64 (docs/benchmarks/scale.md). What the solve
    allocates is freed by reference counting; cycles, if any, wait for the next collection
    after it."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def solve(
    instance: Instance, strategy: str = "agg", *, seed: int = 0, polish: bool = True
) -> Placement:
    """Validate, place with `strategy`, and describe the result. `polish=False`: AGG
    without its local search on the predicted CCT (the service's loop, which judges each
    job alone: docs/service.md)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy: unknown {strategy!r}; one of {', '.join(STRATEGIES)}")
    with _no_cycle_collection():
        return _solve(instance, strategy, seed, polish)


def _solve(instance: Instance, strategy: str, seed: int, polish: bool = True) -> Placement:
    checked = check_instance(instance)
    if not instance.jobs:  # nothing to place (HiGHS calls an empty model no solution)
        return Placement(
            strategy=strategy,
            jobs=[],
            objective_s=0.0,
            mean_predicted_cct_s=0.0,
            stats=SolverStats(status="no jobs"),
        )
    t0 = time.perf_counter()
    ctx = Context(
        instance,
        seed=seed,
        compiled=Network.from_instance(instance, checked),
        nodes=checked.jobs,
        polish=polish,
    )
    aggs, stats, trees = STRATEGIES[strategy](ctx)
    stats.total_s = time.perf_counter() - t0
    return build_placement(ctx, strategy, trees, aggs, stats)


def solve_optimum(instance: Instance, *, max_evals: int = 200_000) -> tuple[Placement, float]:
    """The true optimum of the jobs' weighted predicted CCT on a small instance
    (`optimum.optimum`, from AGG's placement): its placement document, strategy "optimum",
    path "search", and AGG's weighted predicted CCT, where the search started;
    `stats.status` says "optimal" when the search ended within `max_evals` evaluations,
    else the best found and the bound it is within. `optimum.TooLarge` (a ValueError
    naming the job) where a job has too many routes."""
    from agg_optimizer.placement.optimum import optimum

    with _no_cycle_collection():
        checked = check_instance(instance)
        if not instance.jobs:
            none = SolverStats(status="no jobs")
            return Placement(strategy="optimum", jobs=[], objective_s=0.0,
                             mean_predicted_cct_s=0.0, stats=none), 0.0  # fmt: skip
        t0 = time.perf_counter()
        ctx = Context(instance, compiled=Network.from_instance(instance, checked),
                      nodes=checked.jobs)  # fmt: skip
        aggs, _, trees = STRATEGIES["agg"](ctx)
        trees = trees if trees is not None else ctx.int_trees
        start = {j.id: (trees[j.id], frozenset(aggs.get(j.id, set()))) for j in ctx.jobs}
        agg_figure = _reported(ctx, aggs, trees)
        opt = optimum(ctx, start, max_evals=max_evals, max_seconds=float("inf"))
        status = (
            "optimal"
            if opt.proven
            else f"budget spent: the optimum is in [{opt.lower_bound:.6g}, {opt.score:.6g}]"
        )
        stats = SolverStats(path="search", status=status, iterations=opt.evaluations,
                            objective=opt.score, total_s=time.perf_counter() - t0)  # fmt: skip
        trees = {jid: c[0] for jid, c in opt.choice.items()}
        aggs = {jid: set(c[1]) for jid, c in opt.choice.items()}
        return build_placement(ctx, "optimum", trees, aggs, stats), agg_figure
