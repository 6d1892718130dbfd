"""How much better than a strategy could any aggregation placement on the same routes be?

For each seed of a scenario whose jobs are placed once, together (`replace_every: 0`), the
placement every strategy makes at arrival is judged with every job's round sharing the
fabric (`shared.shared_ccts`, the simulator's fluid core on the INT snapshot the strategy
saw). Beside it, on the same routes (the strategy's own `worker_paths`), every
programmable switch of every job's tree sums that job, as if pools were unlimited: each
job then sends one stream per link, the fewest any placement on those routes can, and
the mean CCT of that is the bound. `headroom` = 1 - bound / strategy: no aggregation
choice on those routes can be more than that below the strategy (up to max-min sharing
not being monotone in theory: the check column counts seeds where a real placement beat
the bound, which would show it; none did when written).

    uv run python optimizer-service/benchmarks/placement_headroom.py \
        --scenario docs/evaluation/replacement/k8-load0-static.json --seeds 10 \
        --strategies agg,greedy-rr
"""

from __future__ import annotations

import argparse
import json
import statistics
from types import SimpleNamespace

from agg_optimizer.evaluation.scenario import Scenario, run
from agg_optimizer.model.documents import Instance, Placement
from agg_optimizer.placement.shared import shared_ccts


def everywhere(inst: Instance, p: Placement) -> list[SimpleNamespace]:
    """Every job summed at every programmable switch on its paths (pools ignored)."""
    prog = {n.id for n in inst.topology.nodes if n.kind == "switch" and n.programmable}
    out = []
    for jp in p.jobs:
        on_paths = {v for path in jp.worker_paths.values() for v in path[1:-1]} & prog
        aggs = [SimpleNamespace(switch=s) for s in sorted(on_paths)]
        paths = jp.worker_paths
        out.append(SimpleNamespace(job_id=jp.job_id, aggregators=aggs, worker_paths=paths))
    return out


def mean_cct(inst: Instance, placed: list) -> float:
    got = shared_ccts(inst, placed)
    assert got is not None
    return statistics.mean(got.values())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--strategies", default="agg,greedy-rr")
    args = ap.parse_args()
    with open(args.scenario) as fh:
        sc = Scenario.model_validate(json.load(fh))
    if sc.replace_every:
        raise SystemExit("scenario: replace_every must be 0 (jobs placed once, together)")
    names = args.strategies.split(",")
    print(f"{sc.name}: mean CCT of one round with every job sharing the fabric (s)\n")
    print("| seed | " + " | ".join(f"{s} | bound on its routes | headroom" for s in names) + " |")
    print("|---" * (1 + 3 * len(names)) + "|")
    rows: dict[str, list[tuple[float, float]]] = {s: [] for s in names}
    beaten = 0
    for seed in range(args.seeds):
        cells = [str(seed)]
        for s in names:
            got: list = []
            run(sc, s, seed, on_placement=lambda _t, inst, p, got=got: got.append((inst, p)))
            inst, p = got[0]
            mine = mean_cct(inst, p.jobs)
            bound = mean_cct(inst, everywhere(inst, p))
            beaten += mine < bound * (1 - 1e-9)
            rows[s].append((mine, bound))
            cells += [f"{mine:.3f}", f"{bound:.3f}", f"{1 - bound / mine:.1%}"]
        print("| " + " | ".join(cells) + " |", flush=True)
    print()
    print("| strategy | mean CCT (s) | bound on its routes (s) | mean headroom | max headroom |")
    print("|---|---|---|---|---|")
    for s in names:
        h = [1 - b / m for m, b in rows[s]]
        print(
            f"| {s} | {statistics.mean(m for m, _ in rows[s]):.3f} | "
            f"{statistics.mean(b for _, b in rows[s]):.3f} | {statistics.mean(h):.1%} | "
            f"{max(h):.1%} |"
        )
    best_bound = [min(rows[s][i][1] for s in names) for i in range(args.seeds)]
    for s in names:
        gap = [1 - best_bound[i] / rows[s][i][0] for i in range(args.seeds)]
        print(f"\n{s}: at most {statistics.mean(gap):.1%} (mean over seeds) above the lowest bound")
    print(f"\nplacements below their bound (should be 0): {beaten}")


if __name__ == "__main__":
    main()
