"""Small instances and brute-force oracles shared by the optimizer tests."""

from __future__ import annotations

import itertools

import numpy as np

from agg_optimizer.placement.flow_lp import FlowProblem, _segments, switch_pools


def random_problem(seed: int, *, uniform_pool: bool = True, facility: bool = False) -> FlowProblem:
    """A tiny flow problem: <= 4 jobs, <= 5 groups, <= 3 switches, <= 3 candidates each."""
    rng = np.random.default_rng(seed)
    n_jobs = int(rng.integers(1, 4))
    n_sw = int(rng.integers(1, 4))
    n_groups = int(rng.integers(1, 6))
    group_job = rng.integers(0, n_jobs, n_groups)
    arc_group, arc_switch = [], []
    used: set[tuple[int, int]] = set()
    for g in range(n_groups):
        for s in rng.choice(n_sw, size=int(rng.integers(1, n_sw + 1)), replace=False):
            key = (int(group_job[g]), int(s))
            if key in used and not facility:
                continue
            used.add(key)
            arc_group.append(g)
            arc_switch.append(int(s))
    # ties are common on purpose: costs on a coarse grid
    cost = -rng.integers(0, 6, len(arc_group)).astype(float)
    pool = np.ones(n_jobs, dtype=np.int64) if uniform_pool else rng.integers(1, 3, n_jobs)
    return FlowProblem(
        job_cap=rng.integers(1, 4, n_jobs),
        job_pool=pool,
        group_job=group_job,
        arc_group=np.array(arc_group, dtype=np.int64),
        arc_switch=np.array(arc_switch, dtype=np.int64),
        arc_cost=cost,
        switch_slots=rng.integers(0, 4, n_sw),
        # load costs only where the LP's segment widths are well defined (uniform pools)
        switch_unit_cost=rng.choice([0.0, 0.25], n_sw) if uniform_pool else np.zeros(n_sw),
    )


def switch_load_cost(p: FlowProblem, s: int, pools_used: int, capacity: int) -> float:
    total, left = 0.0, pools_used
    for w, c in _segments(capacity, float(p.switch_unit_cost[s])):
        take = min(w, left)
        total += take * c
        left -= take
    return total


def brute_force(p: FlowProblem) -> float:
    """Enumerate every choice (none or one candidate per group); facility and knapsack
    semantics: a job uses a switch once, and holds pool_j slots there."""
    options = []
    for g in range(p.n_groups):
        arcs = [a for a in range(len(p.arc_cost)) if p.arc_group[a] == g]
        options.append([None, *arcs])
    pools_at = switch_pools(p) if len({int(x) for x in p.job_pool}) == 1 else None
    best = 0.0
    for choice in itertools.product(*options):
        arcs = [a for a in choice if a is not None]
        uses = {(int(p.group_job[p.arc_group[a]]), int(p.arc_switch[a])) for a in arcs}
        per_job = np.bincount([j for j, _ in uses], minlength=p.n_jobs)
        if np.any(per_job > p.job_cap):
            continue
        slots = np.zeros(p.n_switches, dtype=np.int64)
        n_pools = np.zeros(p.n_switches, dtype=np.int64)
        for j, s in uses:
            slots[s] += p.job_pool[j]
            n_pools[s] += 1
        if np.any(slots > p.switch_slots):
            continue
        cost = float(sum(p.arc_cost[a] for a in arcs))
        for s in range(p.n_switches):
            if n_pools[s]:
                cap = int(pools_at[s]) if pools_at is not None else int(p.switch_slots[s])
                cost += switch_load_cost(p, s, int(n_pools[s]), cap)
        best = min(best, cost)
    return best
