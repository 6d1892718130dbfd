"""Build and solve time of AGG against the MILP oracle and networkx's min-cost flow.

For each fat-tree size and job count: AGG end to end (routing, forest, every LP iteration),
the same through `engine.solve` (validation, re-routing rounds up to 64 jobs, the document),
then the first flow problem AGG solves, solved three ways on the same arrays: HiGHS simplex
(AGG's LP), the HiGHS MILP of the same model, networkx network simplex. Prints a markdown
table, writes it and a log-log plot to --out.

    uv run python optimizer-service/benchmarks/solve_bench.py --out docs/benchmarks
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
from pathlib import Path

import numpy as np

from agg_optimizer.model.documents import Instance
from agg_optimizer.model.examples import random_jobs, random_telemetry
from agg_optimizer.model.topology import fat_tree
from agg_optimizer.placement import agg, engine
from agg_optimizer.placement.context import Context
from agg_optimizer.placement.flow_lp import FlowLP, solve_milp, solve_networkx


def instance(k: int, n_jobs: int, seed: int = 0) -> Instance:
    rng = np.random.default_rng(seed)
    topo = fat_tree(k, slots=1024)
    hosts = k**3 // 4
    workers = (min(8, hosts - 1), min(64, hosts - 1))
    return Instance(
        topology=topo,
        telemetry=random_telemetry(topo, rng),
        jobs=random_jobs(topo, n_jobs, rng, workers=workers),
    )


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def run(k: int, n_jobs: int, reps: int) -> dict:
    inst = instance(k, n_jobs)
    best = None
    for _ in range(reps):
        t0 = time.perf_counter()
        ctx = Context(inst)
        _, stats, _ = agg.place(ctx)
        total = time.perf_counter() - t0
        if best is None or total < best["agg_s"]:
            best = {"agg_s": total, "agg_solve_s": stats.solve_s, "iters": stats.iterations}
    solved = [engine.solve(inst, "agg") for _ in range(reps)]
    best["solve_s"] = min(x.stats.total_s for x in solved)
    best["reroutes"] = solved[0].stats.reroutes
    # memory in a separate run: tracemalloc slows Python down several times
    tracemalloc.start()
    agg.place(Context(inst))
    best["peak_mb"] = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    m = agg.build_model(ctx)
    m.problem.arc_cost = agg.arc_costs(ctx, m, np.zeros(len(m.forest.job), dtype=bool))
    p = m.problem
    lp_times = []
    for _ in range(reps):
        lp, t_build = timed(lambda: FlowLP(p))
        sol, t_solve = timed(lp.run)
        lp_times.append(t_build + t_solve)
    milp, t_milp = timed(lambda: solve_milp(p, time_limit=600))
    (nx_obj, _), t_nx = timed(lambda: solve_networkx(p))
    ok = abs(milp.objective - sol.objective) <= 1e-6 * max(1, abs(sol.objective)) and abs(
        nx_obj - sol.objective
    ) <= 1e-5 * max(1, abs(sol.objective))
    lp_s = min(lp_times)
    return {
        "k": k,
        "jobs": n_jobs,
        "columns": lp.columns,
        "rows": lp.rows,
        **best,
        "lp_s": lp_s,
        "milp_s": t_milp,
        "nx_s": t_nx,
        "milp_ratio": t_milp / lp_s,
        "nx_ratio": t_nx / lp_s,
        "same_optimum": ok,
    }


def table(rows: list[dict]) -> str:
    head = (
        "| k | jobs | LP cols x rows | AGG end to end (ms) | engine.solve, re-routing (ms) | "
        "rounds kept | AGG LP solves (ms) | iters | "
        "peak Python MB | one LP (ms) | MILP (ms) | networkx (ms) | MILP / LP | networkx / LP "
        "| same optimum |\n|" + "---|" * 15 + "\n"
    )
    body = "".join(
        f"| {r['k']} | {r['jobs']} | {r['columns']} x {r['rows']} | {r['agg_s'] * 1e3:.1f} | "
        f"{r['solve_s'] * 1e3:.1f} | {r['reroutes']} | "
        f"{r['agg_solve_s'] * 1e3:.1f} | {r['iters']} | {r['peak_mb']:.1f} | "
        f"{r['lp_s'] * 1e3:.1f} | {r['milp_s'] * 1e3:.1f} | {r['nx_s'] * 1e3:.0f} | "
        f"{r['milp_ratio']:.1f} | {r['nx_ratio']:.0f} | {'yes' if r['same_optimum'] else 'NO'} |\n"
        for r in rows
    )
    return head + body


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    cols = [r["columns"] for r in rows]
    order = np.argsort(cols)
    x = np.array(cols)[order]
    for key, label in (
        ("agg_s", "AGG end to end"),
        ("lp_s", "one LP (HiGHS simplex)"),
        ("milp_s", "MILP, same model (HiGHS)"),
        ("nx_s", "networkx network simplex"),
    ):
        ax.loglog(x, np.array([r[key] for r in rows])[order], marker="o", label=label)
    ax.set_xlabel("LP columns (arcs of the flow network)")
    ax.set_ylabel("seconds")
    ax.set_title("Placement solve time, fat-trees k=4..32, 10..1000 jobs")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, nargs="+", default=[4, 8, 16, 24, 32])
    ap.add_argument("--jobs", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--reps", type=int, default=3, help="best of N for the fast solves")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    rows = []
    total = len(args.k) * len(args.jobs)
    for i, (k, n) in enumerate(((k, n) for k in args.k for n in args.jobs), 1):
        print(f"[{i}/{total}] k={k} jobs={n} ...", flush=True)
        rows.append(run(k, n, args.reps))
    text = table(rows)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "solve.md").write_text(text)
        plot(rows, args.out / "solve.png")


if __name__ == "__main__":
    main()
