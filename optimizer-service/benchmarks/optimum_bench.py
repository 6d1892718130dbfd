"""AGG against the true optimum of the predicted CCT on small instances no test generates
(`agg_optimizer.placement.optimum`): leaf-spine, irregular fabrics and k=4 fat-trees with 3-4
jobs of 3-5 workers, and irregular fabrics with 4 jobs of 4-7 workers ("irregular-busy"); slots
scarce or ample, with and without background load.

    uv run python optimizer-service/benchmarks/optimum_bench.py [--instances 40] [--seed0 8000]
        [--max-evals 200000] [--out docs/benchmarks]   (make bench-optimum)

Per instance: the jobs' weighted predicted CCT (what the placement document reports) of AGG
without its local search (`engine.POLISH` off: AGG as it was before `polish`), AGG, the MILP, the
best of the baselines, the optimum (exact within the budget, else the best found and a lower
bound) and the floor. The search's budget is counted in evaluations of the shared model, not
seconds, so a busy machine changes how long it takes, not what it finds. Writes
`optimum.json` and prints the table of docs/benchmarks/optimum.md.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
from family_bench import irregular  # the script's folder is on sys.path

from agg_optimizer.model.documents import Instance
from agg_optimizer.model.examples import random_jobs, random_telemetry
from agg_optimizer.model.network import Network
from agg_optimizer.model.topology import fat_tree, leaf_spine
from agg_optimizer.model.validation import check_instance
from agg_optimizer.placement import engine
from agg_optimizer.placement.context import Context
from agg_optimizer.placement.optimum import TooLarge, optimum

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = ("leaf-spine", "irregular", "ft4", "irregular-busy")
BASELINES = ("ps", "switchml", "atp", "sharp", "soar", "greedy")


def instance(i: int, seed: int) -> tuple[str, Instance]:
    """The i-th instance of the suite: its family and the document."""
    rng = np.random.default_rng(seed)
    family = FAMILIES[i % len(FAMILIES)]
    scarce = bool(rng.random() < 0.5)
    pool = 128
    slots = pool * int(rng.integers(1, 3)) if scarce else 4096
    if family == "ft4":
        topo = fat_tree(4, slots=slots)
    elif family == "leaf-spine":
        topo = leaf_spine(2, int(rng.integers(3, 5)), 4, slots=slots,
                          uplink_gbps=float(rng.choice([10, 25, 40])))  # fmt: skip
    else:
        topo = irregular(rng, slots)
    background = [None, 0.0, 0.3, 0.6][int(rng.integers(4))]
    if family == "irregular-busy":  # 4 jobs of 4-7 workers: more of them meet
        jobs = random_jobs(topo, 4, rng, workers=(4, 7), pool_slots=pool)
    else:
        jobs = random_jobs(topo, int(rng.integers(3, 5)), rng, workers=(3, 5), pool_slots=pool)
    tele = random_telemetry(topo, rng, level=background)
    name = f"{family}-{'scarce' if scarce else 'ample'}-bg{background}"
    return name, Instance(topology=topo, telemetry=tele, jobs=jobs)


def weighted(inst: Instance, placement) -> float:
    weight = {j.id: j.weight for j in inst.jobs}
    return sum(weight[jp.job_id] * jp.predicted_cct_s for jp in placement.jobs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=40)
    ap.add_argument("--seed0", type=int, default=8000, help="seeds seed0.. (no test uses them)")
    ap.add_argument("--max-evals", type=int, default=200_000, help="evaluations an instance")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks")
    ap.add_argument("--table", type=Path, help="print the table of an optimum.json and stop")
    args = ap.parse_args()
    if args.table is not None:
        print(table(json.loads(args.table.read_text())["rows"]))
        return
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {load}", flush=True)
    rows = []
    for i in range(args.instances):
        name, inst = instance(i, args.seed0 + i)
        row: dict = {"instance": name, "seed": args.seed0 + i, "jobs": len(inst.jobs)}
        saved = engine.POLISH
        engine.POLISH = False
        row["agg_before"] = weighted(inst, engine.solve(inst, "agg"))
        engine.POLISH = saved
        t0 = time.process_time()
        p = engine.solve(inst, "agg")
        row["agg_cpu_s"] = time.process_time() - t0
        row["agg"] = weighted(inst, p)
        pairs = zip(inst.jobs, p.jobs, strict=True)
        row["floor"] = sum(j.weight * jp.floor_cct_s for j, jp in pairs)
        row["milp"] = weighted(inst, engine.solve(inst, "milp"))
        row["best_baseline"] = min(weighted(inst, engine.solve(inst, s)) for s in BASELINES)
        ctx = Context(inst, compiled=Network.from_instance(inst, check_instance(inst)))
        aggs, _, trees = engine.STRATEGIES["agg"](ctx)
        trees = trees or ctx.int_trees
        start = {j.id: (trees[j.id], frozenset(aggs.get(j.id, set()))) for j in inst.jobs}
        try:
            opt = optimum(ctx, start, max_evals=args.max_evals, max_seconds=np.inf)
        except TooLarge as e:
            row["optimum"] = None
            row["why"] = str(e)
        else:
            row.update(optimum=opt.score, proven=opt.proven, lower_bound=opt.lower_bound,
                       evaluations=opt.evaluations, options=opt.options,
                       search_s=round(opt.seconds, 1))  # fmt: skip
        rows.append(row)
        o = row["optimum"]
        gap = "—" if o is None else f"{row['agg_before'] / o:.4f} -> {row['agg'] / o:.4f}"
        print(f"[{i + 1}/{args.instances}] {name:<26} jobs {row['jobs']}  AGG / optimum {gap}"
              f"  proven {row.get('proven')}  {row.get('search_s')} s", flush=True)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "optimum.json").write_text(
        json.dumps({"when": time.time(), "rows": rows}, indent=1)
    )
    print(table(rows))


def family_of(row: dict) -> str:
    """The family of a row: its instance name up to the slots ("irregular-busy-scarce-bg0.3"
    is "irregular-busy")."""
    return row["instance"].rsplit("-", 2)[0]


def table(rows: list[dict]) -> str:
    """The table of docs/benchmarks/optimum.md: per family, over the proven instances."""
    out = ["| family | instances (proven) | AGG before / optimum (mean, max) | AGG / optimum "
           "(mean, max) | MILP / optimum | best baseline / optimum | optimum / floor |",
           "|---|---|---|---|---|---|---|"]  # fmt: skip
    for fam in FAMILIES:
        every = [r for r in rows if family_of(r) == fam]
        rs = [r for r in every if r.get("proven")]
        if not rs:
            out.append(f"| {fam} | {len(every)} (0) | — | — | — | — | — |")
            continue

        def col(key: str, rs: list = rs) -> str:
            x = [r[key] / r["optimum"] for r in rs]
            return f"{np.mean(x):.4f}, {max(x):.4f}"

        of = np.mean([r["optimum"] / r["floor"] for r in rs])
        out.append(f"| {fam} | {len(every)} ({len(rs)}) | {col('agg_before')} | {col('agg')} | "
                   f"{col('milp')} | {col('best_baseline')} | {of:.3f} |")  # fmt: skip
    return "\n".join(out)


if __name__ == "__main__":
    main()
