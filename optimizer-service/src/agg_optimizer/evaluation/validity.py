"""Does the LP's objective rank placements the way simulated CCT does?

One job on a fabric with background traffic: run the background to a point in time, take the
INT snapshot there, draw random feasible placements on the job's INT-routed tree, and for
each one simulate the job's iteration from that moment on the same background (same seed).
The Spearman rank correlation between the surrogate (what AGG minimises) and the simulated
CCT says how far the LP can be trusted; the bottleneck estimate is reported beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from agg_optimizer.evaluation.scenario import Scenario, world
from agg_optimizer.model.documents import Instance, Job, SolverStats
from agg_optimizer.model.network import Network
from agg_optimizer.model.trees import build_tree, evaluate
from agg_optimizer.placement.context import Context
from agg_optimizer.placement.engine import build_placement
from agg_optimizer.sim.core import Flow, Simulator
from agg_optimizer.sim.fabric import Fabric
from agg_optimizer.sim.observe import IntObserver
from agg_optimizer.sim.training import components


@dataclass
class Validity:
    surrogate: np.ndarray  # INT with per-link flow counts (the default)
    bottleneck: np.ndarray
    simulated: np.ndarray
    surrogate_util_only: np.ndarray  # INT utilisation, queue and latency only

    @property
    def spearman_util_only(self) -> float:
        return _spearman(self.surrogate_util_only, self.simulated)

    @property
    def spearman_surrogate(self) -> float:
        return _spearman(self.surrogate, self.simulated)

    @property
    def spearman_bottleneck(self) -> float:
        return _spearman(self.bottleneck, self.simulated)

    @property
    def spearman_better_half(self) -> float:
        """Surrogate vs simulated among the half of placements the surrogate likes best: the
        ones an optimiser chooses between."""
        keep = self.surrogate <= np.median(self.surrogate)
        return _spearman(self.surrogate[keep], self.simulated[keep])


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Rank correlation; nan when either side does not vary (nothing to rank)."""
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(stats.spearmanr(a, b).statistic)


def _world(
    scenario: Scenario, fabric: Fabric, seed: int, t0: float
) -> tuple[Simulator, IntObserver]:
    """The scenario's background on `fabric`, run to `t0`: the same every time for a seed."""
    sim, obs, bg = world(scenario, fabric, np.random.default_rng([seed, 7]))
    obs.start()
    bg.start()
    sim.run(until=t0)
    return sim, obs


def surrogate_validity(
    scenario: Scenario, *, placements: int = 60, seed: int = 0, t0: float = 1.0
) -> Validity:
    """Random placements of the scenario's first job (alone, on the scenario's fabric and
    background), scored by the surrogate, the bottleneck estimate and the simulator."""
    fabric = scenario.fabric()
    spec = scenario.job_specs(fabric, np.random.default_rng([seed, 3]))[0]
    sim, obs = _world(scenario, fabric, seed, t0)
    job = Job(id=spec.id, workers=spec.workers, ps=spec.ps, update_bytes=spec.update_bytes)
    inst = Instance(topology=fabric.topology, telemetry=obs.telemetry(), jobs=[job])
    ctx = Context(inst)
    tree = ctx.int_trees[job.id]
    # The same tree costed from INT without flow counts: the surrogate before that field.
    plain = Network.from_instance(
        inst.model_copy(update={"telemetry": obs.telemetry(flow_counts=False)})
    )
    _, pred, rows = ctx.int_routes
    tree_plain = build_tree(plain, job, pred[rows[0]])
    rng = np.random.default_rng([seed, 11])
    candidates = list(tree.order)
    sur, bot, simulated, plain_sur = [], [], [], []
    for _ in range(placements):
        k = int(rng.integers(0, len(candidates) + 1))
        aggs = {candidates[i] for i in rng.choice(len(candidates), size=k, replace=False)}
        cost = evaluate(tree, aggs)
        jp = build_placement(ctx, "sample", {job.id: tree}, {job.id: aggs}, SolverStats()).jobs[0]
        sim, _ = _world(scenario, fabric, seed, t0)
        flows = []
        for segs in components(jp, aggs, job.ps):
            idx = np.concatenate([fabric.path_links(p) for p in segs])
            links, mult = np.unique(idx, return_counts=True)
            flows.append(sim.add(Flow(links, mult.astype(float), float(job.update_bytes), 1)))
        sim.run(stop=lambda flows=flows: all(f.end is not None for f in flows))
        sur.append(cost.surrogate)
        plain_sur.append(evaluate(tree_plain, aggs).surrogate)
        bot.append(cost.cct)
        simulated.append(sim.t - t0)
    return Validity(np.array(sur), np.array(bot), np.array(simulated), np.array(plain_sur))
