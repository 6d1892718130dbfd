"""Paired reductions between two strategies of an `evaluate` run, from its results.json:
per seed 1 - x/y of the run's figure (mean CCT, mean SCT or mean time to 90% accuracy),
then the mean over seeds with its 95% Student-t interval (as `evaluate` reports AGG's).

    uv run python optimizer-service/benchmarks/paired.py docs/evaluation/sched-hpsearch \\
        sct agg+grouper:agg agg+grouper:agg+fair
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from agg_optimizer.evaluation.evaluate import Interval
from agg_optimizer.evaluation.scenario import COMPUTE_S
from agg_optimizer.sim.training import IterationRecord, time_to_accuracy


def figures(run: dict) -> dict[str, float]:
    recs = [IterationRecord(**x) for x in run["records"]]
    out = {"cct": float(np.mean([x.cct_s for x in recs]))}
    iterations = max(x.iteration for x in recs) + 1
    times = time_to_accuracy(recs, iterations, 0.9, COMPUTE_S)
    if times:
        out["tta90"] = float(np.mean(times))
    if run.get("stages"):
        out["sct"] = float(np.mean([x["sct_s"] for x in run["stages"]]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="the directory `evaluate -o` wrote")
    ap.add_argument("figure", choices=("cct", "sct", "tta90"))
    ap.add_argument("pairs", nargs="+", help="X:Y, the reduction of X against Y")
    args = ap.parse_args()
    doc = json.loads((args.run / "results.json").read_text())
    per: dict[str, dict[int, dict[str, float]]] = {}
    for scenario in doc.values():
        for r in scenario["runs"]:
            per.setdefault(r["strategy"], {})[r["seed"]] = figures(r)
    for pair in args.pairs:
        x, _, y = pair.partition(":")
        seeds = sorted(per[x])
        iv = Interval.of([1 - per[x][s][args.figure] / per[y][s][args.figure] for s in seeds])
        print(f"{x} against {y} ({args.figure}): {iv.mean:.1%} [{iv.lo:.1%}, {iv.hi:.1%}]")


if __name__ == "__main__":
    main()
