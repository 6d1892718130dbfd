"""Where a strategy loses to the network bound: which link holds each job stream back.

    uv run python optimizer-service/benchmarks/bottleneck_bench.py --scenario paper \\
        --strategies agg,greedy,floor --seeds 3 [--set replace_every=1] [--route-power 6]

For every moment of every run, each job stream (a coupled component) is bound at the links
where its max-min share is set: links that are full and where no other flow moves faster.
The time each stream spends bound is split by the kind of binding link: a worker's uplink or
the PS's downlink ("access"); a switch-to-switch link that another job's streams cross too
("fabric, other job"), else one that background crosses ("fabric, background"), else one
where only the job's own unsummed streams meet ("fabric, own streams"). Prints mean CCT per
strategy over the seeds and those shares, as a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter

import numpy as np

from agg_optimizer.evaluation.scenario import SCENARIOS, run
from agg_optimizer.model import network
from agg_optimizer.sim.core import BACKGROUND, Simulator

KINDS = ("access", "fabric, other job", "fabric, background", "fabric, own streams", "not full")


class Binding:
    """Accumulates stream-seconds per kind of binding link (Simulator.probe)."""

    def __init__(self) -> None:
        self.time: Counter[str] = Counter()
        self._solve = -1
        self._kinds: Counter[str] = Counter()
        self._access: np.ndarray | None = None

    def __call__(self, sim: Simulator, dt: float) -> None:
        if sim.rate_solves != self._solve:  # rates changed: classify again
            self._solve = sim.rate_solves
            self._kinds = self._classify(sim)
        for kind, n in self._kinds.items():
            self.time[kind] += n * dt

    def _classify(self, sim: Simulator) -> Counter[str]:
        if self._access is None:
            hosts = set(sim.fabric.hosts)
            self._access = np.array([u in hosts or v in hosts for u, v in sim.fabric.links])
        flows = sim.alive()
        full = sim.link_rate.sum(axis=0) >= sim.capacity * (1 - 1e-6)
        fastest = np.zeros(sim.capacity.size)
        for _cls, rate, links, _mult in flows:
            np.maximum.at(fastest, links, rate)
        out: Counter[str] = Counter()
        for cls, rate, links, _mult in flows:
            if cls == BACKGROUND:
                continue
            bound = links[full[links] & (rate >= fastest[links] * (1 - 1e-6))]
            if bound.size == 0:
                out["not full"] += 1
            elif self._access[bound].any():
                out["access"] += 1
            elif ((sim.link_rate[1:, bound].sum(axis=0) - sim.link_rate[cls, bound]) > 1.0).any():
                out["fabric, other job"] += 1
            elif (sim.link_rate[BACKGROUND, bound] > 1.0).any():
                out["fabric, background"] += 1
            else:  # several of the job's own unsummed streams share the link
                out["fabric, own streams"] += 1
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="paper", choices=sorted(SCENARIOS))
    ap.add_argument("--strategies", default="agg,greedy,floor")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=JSON",
        help="override a scenario field, e.g. replace_every=1",
    )
    ap.add_argument(
        "--route-power",
        type=float,
        default=None,
        help=f"network.ROUTE_POWER (now {network.ROUTE_POWER})",
    )
    args = ap.parse_args()
    sc = SCENARIOS[args.scenario]
    for item in args.set:
        field, _, value = item.partition("=")
        sc = sc.model_validate(sc.model_dump() | {field: json.loads(value)})
    if args.route_power is not None:
        network.ROUTE_POWER = args.route_power
    print(
        f"scenario {sc.name}, seeds 0..{args.seeds - 1}, overrides {args.set or 'none'}, "
        f"ROUTE_POWER {network.ROUTE_POWER}"
    )
    print("| strategy | mean CCT (s) | " + " | ".join(KINDS) + " |")
    print("|---|---|" + "---|" * len(KINDS))
    for strategy in args.strategies.split(","):
        binding = Binding()
        means = [
            statistics.mean(r.cct_s for r in run(sc, strategy, seed, probe=binding).records)
            for seed in range(args.seeds)
        ]
        total = sum(binding.time.values()) or 1.0
        shares = " | ".join(f"{binding.time[k] / total:.0%}" for k in KINDS)
        print(f"| {strategy} | {statistics.mean(means):.3f} | {shares} |", flush=True)


if __name__ == "__main__":
    main()
