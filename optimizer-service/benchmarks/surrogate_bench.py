"""Surrogate validity: Spearman rank correlation between what AGG minimises (the surrogate)
and simulated CCT, over random feasible placements of one job on a loaded fabric.

    uv run python optimizer-service/benchmarks/surrogate_bench.py --out docs/benchmarks

prints a table, writes surrogate.md and surrogate.png (scatter) to --out.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from agg_optimizer.evaluation.scenario import SCENARIOS
from agg_optimizer.evaluation.validity import surrogate_validity

CASES = [
    ("k4", {}),
    ("k8, 12 workers", {"base": "paper", "jobs": 1}),
    ("k8, 24 workers, 4 hotspots", {"base": "paper", "jobs": 1, "workers": 24, "hotspots": 4}),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--placements", type=int, default=40)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    rows = []
    fig, axes = plt.subplots(1, len(CASES), figsize=(5 * len(CASES), 4))
    for ax, (label, upd) in zip(axes, CASES, strict=True):
        upd = dict(upd)
        base = SCENARIOS[upd.pop("base", "k4")]
        sc = base.model_validate(base.model_dump() | upd)
        for seed in range(args.seeds):
            v = surrogate_validity(sc, placements=args.placements, seed=seed)
            rows.append(
                (
                    label,
                    seed,
                    v.spearman_surrogate,
                    v.spearman_bottleneck,
                    v.spearman_better_half,
                    v.spearman_util_only,
                )
            )
            print(
                f"{label:28s} seed {seed}: surrogate rho {v.spearman_surrogate:.3f}, "
                f"bottleneck rho {v.spearman_bottleneck:.3f}, "
                f"better half {v.spearman_better_half:.3f}, "
                f"without flow counts {v.spearman_util_only:.3f}",
                flush=True,
            )
            ax.scatter(v.surrogate, v.simulated, s=10, label=f"seed {seed}")
        ax.set_title(label)
        ax.set_xlabel("surrogate (s)")
        ax.set_ylabel("simulated CCT (s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    lines = [
        "| case | seed | Spearman: surrogate vs simulated CCT | same, better half only "
        "| surrogate before flow counts (utilisation only) | bottleneck estimate |",
        "|---|---|---|---|---|---|",
    ]
    for label, seed, a, b, h, u in rows:
        fb = "constant (no ranking)" if np.isnan(b) else f"{b:.3f}"
        lines.append(f"| {label} | {seed} | {a:.3f} | {h:.3f} | {u:.3f} | {fb} |")
    sur = np.array([r[2] for r in rows])
    half = np.array([r[4] for r in rows])
    old = np.array([r[5] for r in rows])
    lines += [
        "",
        f"Surrogate: median {np.median(sur):.3f}, min {sur.min():.3f}; among the better half: "
        f"median {np.nanmedian(half):.3f}; before flow counts: median {np.median(old):.3f}, "
        f"min {old.min():.3f}; over {len(rows)} (case, seed) pairs of {args.placements} "
        "placements each.",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "surrogate.md").write_text(text + "\n")
        fig.savefig(args.out / "surrogate.png", dpi=100)


if __name__ == "__main__":
    main()
