"""Where a first solve's time goes at k=64 with 10,000 jobs, round after round.

Reads the rounds' `scale_bench.py` results (docs/benchmarks/scale-r3.json ... -rN.json)
and draws one stacked bar per round: the medians of each part of the first solve in a fresh
process (validation, the network, routing, the forest, the rest of the model, HiGHS, the
document), the code before round 3 first. The parts inside `stats.total_s`, the issue's
engine time, are the ones from the network to HiGHS. Each round ran on its own day at its
own load (given in scale.md), so a bar compares best with its own round's "before".

    uv run python optimizer-service/benchmarks/scale_rounds.py --out docs/benchmarks
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
DOCS = HERE.parents[2] / "docs" / "benchmarks"
PARTS = ("network", "routing", "forest", "build_other", "highs", "validate", "document")
LABELS = {
    "network": "network",
    "routing": "routing",
    "forest": "forest",
    "build_other": "model, costs",
    "highs": "HiGHS",
    "validate": "validation*",
    "document": "document*",
}


def medians(path: Path, version: str) -> dict[str, float] | None:
    """Median of each part over the runs of k=64, 10,000 jobs, `version` ("this", "before")."""
    rows = json.loads(path.read_text())["rows"]
    for row in rows:
        if row["k"] == 64 and row["jobs"] == 10000 and row["version"] == version:
            return {p: float(np.median([r["parts"][p] for r in row["runs"]])) for p in PARTS}
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=Path, default=DOCS, help="where scale-rN.json are")
    ap.add_argument("--out", type=Path, default=DOCS)
    args = ap.parse_args()
    files = sorted(
        args.docs.glob("scale-r*.json"), key=lambda p: int(re.findall(r"\d+", p.name)[0])
    )
    bars: list[tuple[str, dict[str, float]]] = []
    for f in files:
        n = re.findall(r"\d+", f.name)[0]
        if not bars and (before := medians(f, "before")) is not None:
            bars.append((f"before r{n}", before))
        if (this := medians(f, "this")) is not None:
            bars.append((f"round {n}", this))
    for name, m in bars:
        inside = sum(m[p] for p in PARTS[:5])
        print(
            f"{name:10s} " + " ".join(f"{p} {m[p]:.2f}" for p in PARTS) + f"  inside {inside:.2f}"
        )

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8))
    x = np.arange(len(bars))
    bottom = np.zeros(len(bars))
    for i, p in enumerate(PARTS):
        h = np.array([m[p] for _, m in bars])
        ax.bar(x, h, bottom=bottom, color=f"C{i}", label=LABELS[p], hatch="//" if i >= 5 else "")
        bottom += h
    ax.axhline(2.0, color="grey", lw=0.8, ls=":", label="target (engine time)")
    ax.set_xticks(x, [name for name, _ in bars])
    ax.set_ylabel("seconds (median of 3 fresh processes)")
    ax.set_title("AGG at k=64, 10,000 jobs: a first solve's parts by round\n"
                 "(* outside the engine time, stats.total_s)")  # fmt: skip
    ax.legend(fontsize=8, ncols=2)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    args.out.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out / "scale-rounds.png", dpi=110)


if __name__ == "__main__":
    main()
