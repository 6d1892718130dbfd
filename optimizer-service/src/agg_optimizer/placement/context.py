"""What every strategy sees: the validated instance, the compiled network, the routing trees,
and a ledger of aggregator slots."""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field
from functools import cached_property

import numpy as np

from agg_optimizer.model.arrays import unique_sorted
from agg_optimizer.model.documents import Instance, Job
from agg_optimizer.model.network import Network
from agg_optimizer.model.trees import JobTree, build_tree, build_trees, evaluate
from agg_optimizer.model.validation import JobNodes
from agg_optimizer.placement.forest import Forest, build_forest

# Instances with at most this many jobs route each job on its own load-aware tree.
SHARED_ROUTING_MAX_JOBS = 64


@dataclass
class Context:
    instance: Instance
    seed: int = 0
    # job id -> {(u, v): factor}: link u->v looks `factor` times slower to that job's routing
    route_penalty: dict[str, dict[tuple[str, str], float]] = field(default_factory=dict)
    compiled: InitVar[Network | None] = None  # the instance's network, when already built
    # the jobs' nodes as positions, when already worked out (`check_instance`'s `Checked.jobs`)
    nodes: InitVar[JobNodes | None] = None
    # AGG's local search on the predicted CCT after its family (`engine._best_of_family`)
    polish: bool = field(default=True, kw_only=True)
    net: Network = field(init=False)
    _nodes: JobNodes | None = field(init=False, default=None, repr=False)

    def __post_init__(self, compiled: Network | None, nodes: JobNodes | None) -> None:
        self.net = compiled if compiled is not None else Network.from_instance(self.instance)
        self._nodes = nodes

    @property
    def job_nodes(self) -> JobNodes:
        """Each job's PS and every job's workers as positions in `net.ids`."""
        if self._nodes is None:
            self._nodes = JobNodes.of(self.jobs, self.net.index)
        return self._nodes

    def rerouted(self, penalty: dict[str, dict[tuple[str, str], float]]) -> Context:
        """The same instance and compiled network, routed with `penalty` instead (the
        network's link data do not depend on routing; the trees are built anew)."""
        return Context(self.instance, self.seed, penalty, self.net, self._nodes, polish=self.polish)

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
        net, nodes = self.net, self.job_nodes
        n_sw = len(net.switch_ids)
        ps = net.host_switches(nodes.ps)
        w = net.host_switches(nodes.workers)
        # each root's workers' switches, as (root, switch) keys sorted by root: numpy instead
        # of a set per root (0.1 s at k=64 with 10,000 jobs)
        keys = unique_sorted(np.repeat(ps, nodes.counts) * n_sw + w)
        root_pos = unique_sorted(ps)
        bounds = np.searchsorted(keys // n_sw, root_pos, side="left")
        wanted = np.split(keys % n_sw, bounds[1:])
        names = [net.switch_ids[r] for r in root_pos.tolist()]
        order = sorted(range(len(names)), key=names.__getitem__)  # roots by name
        roots = [names[i] for i in order]
        # only the workers' paths: the rows' other switches may be -9999 (`next_hops`)
        pred = net.next_hop_rows(roots, int_aware=True, target_positions=[wanted[i] for i in order])
        row_of = np.empty(n_sw, dtype=np.int64)
        row_of[root_pos[order]] = np.arange(len(roots))
        return roots, pred, row_of[ps].tolist()

    @cached_property
    def int_trees(self) -> dict[str, JobTree]:
        """Reduction trees routed on INT weights (AGG, greedy, GRID, MILP)."""
        _, pred, rows = self.int_routes
        return {j.id: build_tree(self.net, j, pred[rows[i]]) for i, j in enumerate(self.jobs)}

    @cached_property
    def forest(self) -> Forest:
        """The INT trees of all jobs as flat arrays (what AGG solves on)."""
        roots, pred, rows = self.int_routes
        return build_forest(self.net, self.jobs, roots, pred, rows, self.job_nodes)

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
