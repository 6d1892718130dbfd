"""Does AGG's re-routing ever make the CCT the placement reports worse than no re-routing?

For fat-trees k=4 and k=6 with 6-12 jobs, seeds 0-11 and 256 or 512 slots per switch
(`agg_optimizer.model.examples.example_instance`), solves `agg` with and without re-routing
(`engine.REROUTE_ROUNDS` 4 and 0) and prints every instance where the weighted reported
predicted CCT is worse with it. docs/placement-model.md cites the count.

    uv run python optimizer-service/benchmarks/reroute_check.py
"""

from __future__ import annotations

import argparse

from agg_optimizer.model.documents import Instance, Placement
from agg_optimizer.model.examples import example_instance
from agg_optimizer.placement import engine


def weighted(p: Placement, inst: Instance) -> float:
    w = {j.id: j.weight for j in inst.jobs}
    return sum(w[jp.job_id] * jp.predicted_cct_s for jp in p.jobs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=12)
    args = ap.parse_args()
    rounds = engine.REROUTE_ROUNDS
    worse = total = 0
    for k, n_jobs in ((4, 6), (4, 10), (6, 8), (6, 12)):
        for seed in range(args.seeds):
            for slots in (512, 256):
                inst = example_instance(k=k, n_jobs=n_jobs, seed=seed, slots=slots)
                engine.REROUTE_ROUNDS = rounds
                a = weighted(engine.solve(inst, "agg"), inst)
                engine.REROUTE_ROUNDS = 0
                b = weighted(engine.solve(inst, "agg"), inst)
                total += 1
                if a > b * (1 + 1e-9):
                    worse += 1
                    print(f"k={k} jobs={n_jobs} seed={seed} slots={slots}: {a / b - 1:+.2%}")
    print(f"worse with re-routing on {worse} of {total} instances")


if __name__ == "__main__":
    main()
