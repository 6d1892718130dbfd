"""Does the scheduling policy's ORDER matter, beyond priority over background? (issue 31)

Every policy is compared, paired by seed, with `fair` (every job in one class above the
background) and with Sincronia, on workloads where the training jobs contend among
themselves: a leaf-spine with 4:1 oversubscribed uplinks, workers spread one per rack so
every job crosses the spines, light background (10%), one aggregator pool per switch.

- `hp`: hyper-parameter search, 4 cojobs of 3 trials (4 workers each), 3 stages of 2
  iterations, the worse half killed after each stage; the figure is the mean stage
  completion time (SCT), Grouper's objective.
- `arrivals`: 10 jobs of 4 workers arriving over time (one every 0.5 s on average), 8
  iterations; the figure is the mean time from arrival to 90% of converged accuracy, the
  quantity JPAS's early-stage priority aims at.

For each (workload, strategy, seed) one simulation; per seed the gap (x - y) / y of a
policy x against y = `agg+fair` and y = `agg+sincronia`, then the mean gap over seeds with
its 95% Student-t interval. Listing and tie-breaking order is drawn per seed
(`scenario.scheduler_for`). `--classes 3,5,9` repeats the comparison with 2, 4 and 8
job classes (priority queues per port less the background's).

    uv run python optimizer-service/benchmarks/sched_order.py --seeds 10 --processes 2 \\
        --out docs/scheduling/order
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np

from agg_optimizer.evaluation.evaluate import Interval
from agg_optimizer.evaluation.scenario import COMPUTE_S, Scenario, run
from agg_optimizer.sim.training import time_to_accuracy

FABRIC = dict(
    topology="leaf-spine",
    spines=2,
    leaves=8,
    hosts_per_leaf=8,
    uplink_gbps=10.0,  # 8 x 10 Gb/s down, 2 x 10 Gb/s up: 4:1
    worker_placement="spread",
    workers=4,
    slots=128,  # one pool per switch
    background_load=0.1,
    bg_size_min_bytes=50e6,
)
WORKLOADS = {
    "hp": (
        dict(jobs=12, cojobs=4, stages=3, iterations=6),
        ["agg", "agg+fair", "agg+sincronia", "agg+varys", "agg+jpas", "agg+grouper"],
        "agg+grouper",
    ),
    "arrivals": (
        dict(jobs=10, iterations=8, arrival_interval_s=0.5),
        ["agg", "agg+fair", "agg+sincronia", "agg+varys", "agg+fifo", "agg+jpas"],
        "agg+jpas",
    ),
}


def scenario(workload: str, classes: int, strategies: list[str]) -> Scenario:
    extra = WORKLOADS[workload][0]
    return Scenario(
        name=f"{workload}-q{classes}",
        strategies=strategies,
        priority_classes=classes,
        **FABRIC | extra,  # type: ignore[arg-type]
    )


def figure(workload: str, sc: Scenario, strategy: str, seed: int) -> float:
    r = run(sc, strategy, seed)
    if workload == "hp":
        return float(np.mean([x["sct_s"] for x in r.stages]))
    times = time_to_accuracy(r.records, sc.iterations, 0.9, COMPUTE_S)
    return float(np.mean(times))


def _task(args: tuple[str, int, str, int]) -> tuple[str, int, str, int, float]:
    workload, classes, strategy, seed = args
    sc = scenario(workload, classes, [strategy])
    return workload, classes, strategy, seed, figure(workload, sc, strategy, seed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--classes", default="4", help="priority queues per port (incl. class 0)")
    ap.add_argument("--sweep", default="3,5,9", help="queues for the sweep of the own policy")
    ap.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--placement", default="agg", help="the placement under every policy (agg, ps, ...)"
    )
    args = ap.parse_args()
    place = args.placement

    def under(s: str) -> str:  # "agg+fair" -> "ps+fair" with --placement ps
        return place + s.removeprefix("agg")

    fair, sinc = under("agg+fair"), under("agg+sincronia")
    workloads = {
        w: ([under(s) for s in strategies], under(own))
        for w, (_, strategies, own) in WORKLOADS.items()
    }
    main_q = int(args.classes)
    sweep = [int(x) for x in args.sweep.split(",") if x]
    tasks = []
    for w, (strategies, own) in workloads.items():
        for seed in range(args.seeds):
            tasks += [(w, main_q, s, seed) for s in strategies]
            for q in sweep:
                if q != main_q:
                    tasks += [(w, q, s, seed) for s in (fair, sinc, own)]
    t0 = time.perf_counter()
    got: dict[tuple[str, int, str, int], float] = {}
    with ProcessPoolExecutor(max_workers=args.processes) as pool:
        futs = [pool.submit(_task, t) for t in tasks]
        for i, f in enumerate(as_completed(futs), 1):
            w, q, s, seed, v = f.result()
            got[(w, q, s, seed)] = v
            if i % 10 == 0 or i == len(tasks):
                print(f"{i}/{len(tasks)} runs, {time.perf_counter() - t0:.0f} s", file=sys.stderr)

    def gaps(w: str, q: int, x: str, y: str) -> Interval:
        return Interval.of([got[(w, q, x, s)] / got[(w, q, y, s)] - 1 for s in range(args.seeds)])

    def pct(iv: Interval) -> str:
        return f"{iv.mean:+.1%} [{iv.lo:+.1%}, {iv.hi:+.1%}]"

    lines = []
    rows: list[dict] = []
    for w, (strategies, own) in workloads.items():
        metric = "mean SCT" if w == "hp" else "mean time to 90% accuracy"
        lines += [
            f"### `{w}`, {main_q - 1} job classes ({metric}, {args.seeds} seeds)",
            "",
            f"| strategy | {metric} (s) | vs `{fair}` | vs `{sinc}` |",
            "|---|---|---|---|",
        ]
        for s in strategies:
            v = Interval.of([got[(w, main_q, s, seed)] for seed in range(args.seeds)])
            f, si = gaps(w, main_q, s, fair), gaps(w, main_q, s, sinc)
            lines.append(f"| `{s}` | {v.fmt()} | {pct(f)} | {pct(si)} |")
            rows.append({"workload": w, "queues": main_q, "strategy": s, "value": v.__dict__,
                         "vs_fair": f.__dict__, "vs_sincronia": si.__dict__})  # fmt: skip
        lines.append("")
        if sweep:
            lines += [
                f"`{own}` by job classes ({args.seeds} seeds):",
                "",
                f"| job classes | vs `{fair}` | vs `{sinc}` | `{sinc}` vs `{fair}` |",
                "|---|---|---|---|",
            ]
            for q in sweep:
                lines.append(
                    f"| {q - 1} | {pct(gaps(w, q, own, fair))} | {pct(gaps(w, q, own, sinc))} | "
                    f"{pct(gaps(w, q, sinc, fair))} |"
                )
                for s in (fair, sinc, own):
                    per_seed = [got[(w, q, s, x)] for x in range(args.seeds)]
                    rows.append({"workload": w, "queues": q, "strategy": s, "per_seed": per_seed})
            lines.append("")
    table = "\n".join(lines)
    print(table)
    wall = time.perf_counter() - t0
    print(f"{len(tasks)} runs in {wall:.0f} s on {args.processes} processes", file=sys.stderr)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "summary.md").write_text(table + "\n")
        raw = {f"{w}|{q}|{s}|{seed}": v for (w, q, s, seed), v in sorted(got.items())}
        (args.out / "results.json").write_text(json.dumps({"rows": rows, "runs": raw}, indent=1))


if __name__ == "__main__":
    main()
