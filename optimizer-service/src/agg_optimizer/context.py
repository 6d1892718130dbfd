"""What every strategy sees: the validated instance, the compiled network, the routing trees,
and a ledger of aggregator slots."""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field
from functools import cached_property

import numpy as np

from .documents import Instance, Job
from .forest import Forest, build_forest
from .network import JobTree, Network, build_tree, build_trees, evaluate

# Instances with at most this many jobs route each job on its own load-aware tree.
SHARED_ROUTING_MAX_JOBS = 64


@dataclass
class Context:
    instance: Instance
    seed: int = 0
    # job id -> {(u, v): factor}: link u->v looks `factor` times slower to that job's routing
    route_penalty: dict[str, dict[tuple[str, str], float]] = field(default_factory=dict)
    compiled: InitVar[Network | None] = None  # the instance's network, when already built
    net: Network = field(init=False)

    def __post_init__(self, compiled: Network | None) -> None:
        self.net = compiled if compiled is not None else Network.from_instance(self.instance)

    def rerouted(self, penalty: dict[str, dict[tuple[str, str], float]]) -> Context:
        """The same instance and compiled network, routed with `penalty` instead (the
        network's link data do not depend on routing; the trees are built anew)."""
        return Context(self.instance, self.seed, penalty, self.net)

    @property
    def jobs(self) -> list[Job]:
        return self.instance.jobs

    @cached_property
    def int_routes(self) -> tuple[list[str], np.ndarray, list[int]]:
        """Routing roots, next-hop rows on INT weights, and each job's row.

        Up to SHARED_ROUTING_MAX_JOBS jobs, each job has its own row and sees the links the
        jobs before it use (`Network.next_hops_shared`); above that, jobs whose PS sits on
        the same switch share one shortest-path tree, which keeps large instances fast.
        """
        if not self.jobs:
            return [], np.zeros((0, len(self.net.switch_ids)), dtype=np.int64), []
        if len(self.jobs) <= SHARED_ROUTING_MAX_JOBS:
            pred = self.net.next_hops_shared(self.jobs, self.route_penalty)
            return [self.net.attach[j.ps] for j in self.jobs], pred, list(range(len(self.jobs)))
        attach = self.net.attach
        targets: dict[str, set[str]] = {}
        for j in self.jobs:
            targets.setdefault(attach[j.ps], set()).update(attach[w] for w in j.workers)
        roots = sorted(targets)
        # only the workers' paths: the rows' other switches may be -9999 (`next_hops`)
        by_root = self.net.next_hops(roots, int_aware=True, targets=targets)
        row = {r: i for i, r in enumerate(roots)}
        rows = [row[self.net.attach[j.ps]] for j in self.jobs]
        return roots, np.array([by_root[r] for r in roots]), rows

    @cached_property
    def int_trees(self) -> dict[str, JobTree]:
        """Reduction trees routed on INT weights (AGG, greedy, GRID, MILP)."""
        _, pred, rows = self.int_routes
        return {j.id: build_tree(self.net, j, pred[rows[i]]) for i, j in enumerate(self.jobs)}

    @cached_property
    def forest(self) -> Forest:
        """The INT trees of all jobs as flat arrays (what AGG solves on)."""
        roots, pred, rows = self.int_routes
        return build_forest(self.net, self.jobs, roots, pred, rows)

    @cached_property
    def job_weights(self) -> np.ndarray:
        return np.array([j.weight for j in self.jobs])

    @cached_property
    def ecmp_trees(self) -> dict[str, JobTree]:
        """Hop-count trees with one ECMP choice per job: what a fabric routes without INT."""
        return build_trees(self.net, self.jobs)

    def cap(self, job: Job, tree: JobTree) -> int:
        return job.max_aggregators if job.max_aggregators is not None else len(tree.order)

    def ledger(self) -> SlotLedger:
        return SlotLedger(self.net.slots.copy(), self.net.index, self.net.programmable)

    def weighted_cost(self, trees: dict[str, JobTree], aggs: dict[str, set[str]]) -> float:
        """The objective every strategy is judged on: weighted surrogate plus switching
        penalties against `instance.current`."""
        total = 0.0
        pen = self.instance.switching_penalty_s
        for job in self.jobs:
            a = aggs.get(job.id, set())
            cost = evaluate(trees[job.id], a).surrogate
            if pen:
                cost += pen * len(a - set(self.instance.current.get(job.id, [])))
            total += job.weight * cost
        return total


@dataclass
class SlotLedger:
    free: np.ndarray
    index: dict[str, int]
    programmable: np.ndarray

    def can_host(self, switch: str, pool: int) -> bool:
        i = self.index[switch]
        return bool(self.programmable[i]) and self.free[i] >= pool

    def take(self, switch: str, pool: int) -> bool:
        if not self.can_host(switch, pool):
            return False
        self.free[self.index[switch]] -= pool
        return True
