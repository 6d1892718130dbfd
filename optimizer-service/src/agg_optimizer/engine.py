"""One entry point for every strategy: instance in, placement document out."""

from __future__ import annotations

import time
from collections.abc import Callable

from . import agg, baselines, exact
from .context import Context
from .documents import Aggregator, Instance, JobPlacement, Placement, SlotPool, SolverStats
from .network import JobTree, evaluate
from .validation import check_instance

Decision = dict[str, set[str]]


def _agg(ctx: Context) -> tuple[Decision, SolverStats, dict[str, JobTree]]:
    aggs, stats, _ = agg.place(ctx)
    return aggs, stats, ctx.int_trees


def _milp(ctx: Context) -> tuple[Decision, SolverStats, dict[str, JobTree]]:
    aggs, stats = exact.place_exact(ctx)
    return aggs, stats, ctx.int_trees


def _heuristic(fn: Callable[[Context], Decision], int_aware: bool):
    def run(ctx: Context) -> tuple[Decision, SolverStats, dict[str, JobTree]]:
        trees = ctx.int_trees if int_aware else ctx.ecmp_trees
        return fn(ctx), SolverStats(path="heuristic"), trees

    return run


STRATEGIES: dict[str, Callable[[Context], tuple[Decision, SolverStats, dict[str, JobTree]]]] = {
    "agg": _agg,
    "ps": _heuristic(baselines.ps_only, False),
    "switchml": _heuristic(baselines.switchml, False),
    "atp": _heuristic(baselines.atp, False),
    "sharp": _heuristic(baselines.sharp, False),
    "soar": _heuristic(baselines.soar, False),
    "grid": _heuristic(baselines.grid, True),
    "random": _heuristic(baselines.random_k, False),
    "greedy": _heuristic(baselines.int_greedy, True),
    "milp": _milp,
}


def build_placement(
    ctx: Context, name: str, trees: dict[str, JobTree], aggs: Decision, stats: SolverStats
) -> Placement:
    """The placement document: who sums what, where it goes next, and the predicted CCT."""
    next_base: dict[str, int] = {}
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
        for a in chosen:
            nexts[a] = absorber(tree.parent[a])
            children.setdefault(nexts[a], []).append(a)
        placed = []
        for a in [v for v in tree.order if v in chosen]:
            base = next_base.get(a, 0)
            next_base[a] = base + job.pool_slots
            placed.append(
                Aggregator(
                    switch=a,
                    children=children.get(a, []),
                    fan_in=len(children.get(a, [])),
                    next_hop=nexts[a],
                    pool=SlotPool(base=base, size=job.pool_slots),
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
    return Placement(
        strategy=name,
        jobs=jobs,
        objective_s=ctx.weighted_cost(trees, aggs) if ctx.instance.switching_penalty_s else total,
        mean_predicted_cct_s=sum(ccts) / len(ccts) if ccts else 0.0,
        stats=stats,
    )


def solve(instance: Instance, strategy: str = "agg", *, seed: int = 0) -> Placement:
    """Validate, place with `strategy`, and describe the result."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy: unknown {strategy!r}; one of {', '.join(STRATEGIES)}")
    check_instance(instance)
    t0 = time.perf_counter()
    ctx = Context(instance, seed=seed)
    aggs, stats, trees = STRATEGIES[strategy](ctx)
    stats.total_s = time.perf_counter() - t0
    return build_placement(ctx, strategy, trees, aggs, stats)
