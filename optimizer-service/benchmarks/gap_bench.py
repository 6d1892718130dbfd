"""How far AGG's iterated LP is from the exact MILP of the same surrogate, and how every
strategy's surrogate and predicted CCT compare, on random fat-tree instances.

    uv run python optimizer-service/benchmarks/gap_bench.py
"""

from __future__ import annotations

import argparse

import numpy as np

from agg_optimizer.model.documents import Instance
from agg_optimizer.model.examples import random_jobs, random_telemetry
from agg_optimizer.model.topology import fat_tree
from agg_optimizer.placement.engine import STRATEGIES, solve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--cases",
        nargs="+",
        default=["4:10:256", "8:50:256", "8:50:128", "16:200:512"],
        help="k:jobs:slots",
    )
    ap.add_argument("--seeds", type=int, default=5)
    args = ap.parse_args()
    print(
        "| k | jobs | slots | strategy | objective / MILP (mean) | max | mean predicted CCT / AGG |"
    )
    print("|---|---|---|---|---|---|---|")
    for case in args.cases:
        k, n, slots = (int(x) for x in case.split(":"))
        ratio: dict[str, list[float]] = {s: [] for s in STRATEGIES}
        cct: dict[str, list[float]] = {s: [] for s in STRATEGIES}
        for seed in range(args.seeds):
            rng = np.random.default_rng(seed)
            topo = fat_tree(k, slots=slots)
            hosts = k**3 // 4
            inst = Instance(
                topology=topo,
                telemetry=random_telemetry(topo, rng),
                jobs=random_jobs(topo, n, rng, workers=(min(8, hosts - 1), min(64, hosts - 1))),
            )
            res = {s: solve(inst, s, seed=seed) for s in STRATEGIES}
            for s, p in res.items():
                ratio[s].append(p.objective_s / res["milp"].objective_s)
                cct[s].append(p.mean_predicted_cct_s / res["agg"].mean_predicted_cct_s)
        for s in sorted(STRATEGIES, key=lambda s: np.mean(ratio[s])):
            print(
                f"| {k} | {n} | {slots} | {s} | {np.mean(ratio[s]):.4f} | "
                f"{np.max(ratio[s]):.4f} | {np.mean(cct[s]):.3f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
