"""How close is a placement's predicted CCT to the CCT the simulator then gives (issue 16, 1)?

Every placement a strategy makes in a simulated run (`evaluation.scenario.run`: dynamic Poisson
background with heavy-tailed sizes, moving hotspots, INT with its window and staleness,
jobs whose compute phases differ, re-placement every 2 iterations) predicts each placed
job's CCT two ways: `predicted_cct_s`, all placed jobs sharing the fabric on the capacity
the INT snapshot leaves (`shared.py`), and `predicted_cct_isolated_s`, each job alone. The
job's next communication round in the simulator is the truth it is compared with.

Reported per scenario and over all: the ratio simulated / predicted (1 is exact; above 1
the prediction was optimistic), its median and 10th-90th percentiles, the mean absolute
percentage error, and the share of rounds predicted within 25%; also split by how many
jobs the placement placed together (the simulated cluster places all jobs that arrive
together at once, then re-places one job at a time). Writes `cct_prediction.md`, `.png`
and the rows as `.json` to `--out`.

    uv run --frozen python optimizer-service/benchmarks/cct_prediction.py --out docs/benchmarks
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np

from agg_optimizer.evaluation.scenario import SCENARIOS, run
from agg_optimizer.model.documents import Placement

DEFAULT_SCENARIOS = ["k4", "paper", "k8-ample", "k8-load0", "k8-load70", "leaf-spine"]
DEFAULT_STRATEGIES = ["agg", "greedy", "soar", "switchml", "ps"]


Row = tuple[str, str, float, float, float, int]


def one(scenario: str, strategy: str, seed: int) -> list[Row]:
    """(scenario, strategy, shared, isolated, simulated, jobs in the placement) for every
    placed job's next round."""
    made: list[tuple[float, Placement]] = []
    res = run(
        SCENARIOS[scenario], strategy, seed, on_placement=lambda t, _i, p: made.append((t, p))
    )
    rounds: dict[str, list[tuple[float, float]]] = {}
    for r in res.records:
        rounds.setdefault(r.job, []).append((r.start_s, r.cct_s))
    out = []
    for t, p in made:
        for jp in p.jobs:
            after = [c for start, c in rounds.get(jp.job_id, []) if start >= t]
            if after:  # the round this placement was made for
                out.append((scenario, strategy, jp.predicted_cct_s, jp.predicted_cct_isolated_s,
                            after[0], len(p.jobs)))  # fmt: skip
    return out


def stats(ratio: np.ndarray) -> dict[str, float]:
    err = np.abs(1.0 / ratio - 1.0)  # |predicted - simulated| / simulated
    return {
        "median": float(np.median(ratio)),
        "p10": float(np.percentile(ratio, 10)),
        "p90": float(np.percentile(ratio, 90)),
        "mape": float(100 * err.mean()),
        "within25": float(100 * (err <= 0.25).mean()),
    }


def table(rows: list[Row], scenarios: list[str]) -> str:
    head = (
        "| scenario | rounds | shared: sim/pred median (p10-p90) | shared MAPE | shared within 25% "
        "| isolated: sim/pred median (p10-p90) | isolated MAPE | isolated within 25% |\n"
        "|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    groups = [(n, [r for r in rows if r[0] == n]) for n in scenarios]
    groups += [
        ("all", rows),
        ("all, placements of 2+ jobs", [r for r in rows if r[5] >= 2]),
        ("all, placements of 1 job", [r for r in rows if r[5] == 1]),
    ]
    for name, sel in groups:
        if not sel:
            continue
        a = np.array([r[2:5] for r in sel])
        sh, iso = stats(a[:, 2] / a[:, 0]), stats(a[:, 2] / a[:, 1])
        lines.append(
            f"| {name} | {len(sel)} "
            f"| {sh['median']:.2f} ({sh['p10']:.2f}-{sh['p90']:.2f}) | {sh['mape']:.0f}% "
            f"| {sh['within25']:.0f}% "
            f"| {iso['median']:.2f} ({iso['p10']:.2f}-{iso['p90']:.2f}) | {iso['mape']:.0f}% "
            f"| {iso['within25']:.0f}% |"
        )
    return head + "\n".join(lines) + "\n"


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a = np.array([r[2:5] for r in rows])
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6), sharex=True, sharey=True)
    lo, hi = a.min() * 0.8, a.max() * 1.2
    for ax, col, title in ((axes[0], 0, "shared (predicted_cct_s)"),
                           (axes[1], 1, "isolated (predicted_cct_isolated_s)")):  # fmt: skip
        ax.scatter(a[:, col], a[:, 2], s=6, alpha=0.35)
        ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="exact")
        ax.fill_between([lo, hi], [lo * 0.75, hi * 0.75], [lo * 1.25, hi * 1.25],
                        color="grey", alpha=0.15, label="within 25%")  # fmt: skip
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_title(title)
        ax.set_xlabel("predicted CCT (s)")
        ax.legend(loc="upper left")
    axes[0].set_ylabel("simulated CCT of the next round (s)")
    fig.suptitle("Predicted vs simulated CCT, every placed job's next round")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", nargs="+", default=DEFAULT_SCENARIOS, choices=list(SCENARIOS))
    ap.add_argument("--strategies", nargs="+", default=DEFAULT_STRATEGIES)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--out", type=Path, help="write cct_prediction.md and .png here")
    args = ap.parse_args()

    tasks = [(sc, st, seed) for sc in args.scenarios for st in args.strategies
             for seed in range(args.seeds)]  # fmt: skip
    rows: list[Row] = []
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.processes) as pool:
        futs = {pool.submit(one, *t): t for t in tasks}
        for i, fut in enumerate(as_completed(futs), 1):
            rows += fut.result()
            sc, st, seed = futs[fut]
            print(f"[{i}/{len(tasks)}] {sc} {st} seed {seed} "
                  f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr)  # fmt: skip
    rows.sort()
    md = table(rows, args.scenarios)
    print(md)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        cmd = "uv run --frozen python optimizer-service/benchmarks/cct_prediction.py " + " ".join(
            sys.argv[1:]
        )
        (args.out / "cct_prediction.md").write_text(
            "# Predicted vs simulated CCT\n\n"
            f"`{cmd}`: scenarios {', '.join(args.scenarios)}; strategies "
            f"{', '.join(args.strategies)}; seeds 0-{args.seeds - 1}. Each row: every placed "
            "job's next communication round after the placement (sim/pred = simulated / "
            "predicted; MAPE = mean |predicted - simulated| / simulated).\n\n" + md
            + "\n![predicted vs simulated](cct_prediction.png)\n"
        )  # fmt: skip
        plot(rows, args.out / "cct_prediction.png")
        (args.out / "cct_prediction.json").write_text(json.dumps(rows))


if __name__ == "__main__":
    main()
