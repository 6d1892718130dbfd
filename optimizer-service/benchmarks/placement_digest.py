"""Placements of a fixed set of instances, recorded once and checked after every change that
should not change them (issue 33's speed-ups of the engine at scale).

Per instance and strategy: the objective, a digest of the decision (each job's aggregator
switches) and a digest of the whole placement document (timings left out, floats to 10
significant digits). `--record` writes them, `--check` compares; a change is reported by
instance, strategy and what differs. The fixture committed in tests/fixtures was recorded at
79b2d17, before the engine was changed, but for the three cases with 10,000 jobs, recorded
again after 8a65280 (session 21): their LPs (65,000-70,000 columns) are priced with Devex since
8a65280, which ends AGG's descent at another vertex (objective +5.3e-5 at k=32, +2.0e-5 at
k=48, -3.9e-6 at k=64; docs/benchmarks/scale.md). The same three were recorded again in
session 26: their first LP starts from a spanning tree basis since (`flow_lp.tree_basis`),
which ends at the same optimal value but at another optimal vertex (k=48), or at the same
vertex with another basis (k=32, k=64) that the warm re-solves then start from, and the
descent ends elsewhere (objective -1.7e-5 at k=32, +6.2e-5 at k=48, -1.2e-5 at k=64).
AGG's entries of four small cases were recorded again in session 33, when AGG gained its
local search on the predicted CCT (`polish`, issue 50): it moves aggregators and routes where
the jobs sharing the fabric finish sooner, which can raise the surrogate `objective_s`
(k4-j4-s2 +1.8%, k6-j10-s7011-cap2 +3.6%, k8-j8-s2-bg05-pool512 +3.7%) while the
document's predicted CCT falls; on k6-j10-s4-current, whose switching penalty the search
pays, it keeps 13 aggregators outside `current` where the LP had 33 (weighted predicted CCT
8.73 -> 8.40 s, the surrogate objective with the penalties 65.1 -> 76.3).
`tests/optimizer/test_placement_digest.py` checks the cases up to `medium`, this script
every case:

    uv run python optimizer-service/benchmarks/placement_digest.py --check
    uv run python optimizer-service/benchmarks/placement_digest.py --record --size large
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from agg_optimizer.model.documents import Instance, Placement, Telemetry
from agg_optimizer.model.examples import example_instance, random_jobs, random_telemetry
from agg_optimizer.model.topology import fat_tree
from agg_optimizer.placement.engine import STRATEGIES, solve

FIXTURE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "placement_digest.json"
SIZES = ("small", "medium", "large")
# Everything but the exact oracle (seconds to minutes past a few jobs) on the small cases.
SMALL_STRATEGIES = tuple(s for s in STRATEGIES if s != "milp")
LARGE_STRATEGIES = ("agg", "greedy", "ps")


def bench_instance(k: int, n_jobs: int, seed: int = 0) -> Instance:
    """solve_bench.py's instances: 1024 slots, 8-64 workers spread over all hosts."""
    rng = np.random.default_rng(seed)
    topo = fat_tree(k, slots=1024)
    hosts = k**3 // 4
    workers = (min(8, hosts - 1), min(64, hosts - 1))
    return Instance(
        topology=topo,
        telemetry=random_telemetry(topo, rng),
        jobs=random_jobs(topo, n_jobs, rng, workers=workers),
    )


def with_current(inst: Instance, penalty: float) -> Instance:
    """Hysteresis: every job's current aggregators are its PS's switch and one more."""
    switches = [n.id for n in inst.topology.nodes if n.kind == "switch"]
    attach = {}
    for ln in inst.topology.links:
        attach[ln.src] = ln.dst
    current = {j.id: [attach[j.ps], switches[i % len(switches)]] for i, j in enumerate(inst.jobs)}
    return inst.model_copy(update={"current": current, "switching_penalty_s": penalty})


def no_telemetry(inst: Instance) -> Instance:
    """Every link and switch at the documented defaults: equal weights, ties everywhere."""
    return inst.model_copy(update={"telemetry": Telemetry()})


# name -> (size, builder, strategies)
CASES = {
    **{
        f"example-k4-j4-s{s}": ("small", lambda s=s: example_instance(4, 4, s), SMALL_STRATEGIES)
        for s in range(3)
    },
    "example-k6-j10-s7011-cap2": (
        "small",
        lambda: example_instance(6, 10, 7011, max_aggregators=2),
        SMALL_STRATEGIES,
    ),
    "example-k8-j20-s1": ("small", lambda: example_instance(8, 20, 1), SMALL_STRATEGIES),
    "example-k8-j8-s2-bg05-pool512": (
        "small",
        lambda: example_instance(8, 8, 2, background=0.5, pool_slots=512),
        SMALL_STRATEGIES,
    ),
    "example-k6-j10-s4-current": (
        "small",
        lambda: with_current(example_instance(6, 10, 4), 1e-3),
        SMALL_STRATEGIES,
    ),
    "example-k4-j6-s5-default-telemetry": (
        "small",
        lambda: no_telemetry(example_instance(4, 6, 5)),
        SMALL_STRATEGIES,
    ),
    "bench-k16-j200": ("medium", lambda: bench_instance(16, 200), LARGE_STRATEGIES),
    "example-k16-j200-s0-default-telemetry": (
        "medium",
        lambda: no_telemetry(example_instance(16, 200, 0)),
        LARGE_STRATEGIES,
    ),
    "example-k16-j100-s2-current": (
        "medium",
        lambda: with_current(example_instance(16, 100, 2), 1e-3),
        LARGE_STRATEGIES,
    ),
    "example-k24-j300-s1-cap2": (
        "medium",
        lambda: example_instance(24, 300, 1, max_aggregators=2),
        LARGE_STRATEGIES,
    ),
    "bench-k32-j1000": ("medium", lambda: bench_instance(32, 1000), ("agg",)),
    **{
        f"example-k{k}-j{n}-s3": ("large", lambda k=k, n=n: example_instance(k, n, 3), ("agg",))
        for k in (32, 48, 64)
        for n in (1000, 10000)
    },
    "example-k64-j3000-s3-default-telemetry": (
        "large",
        lambda: no_telemetry(example_instance(64, 3000, 3)),
        ("agg",),
    ),
}


def _rounded(x):
    if isinstance(x, float):
        return float(f"{x:.10g}") if math.isfinite(x) else x
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    return x


def _sha(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


# Fields added to the document since the fixture was recorded that report, not decide: the
# network bound beside each job (session 31). Left out so the digest still says whether
# the placement changed.
REPORTED_ONLY = ("floor_cct_s", "mean_floor_cct_s")


def digest(p: Placement) -> dict:
    doc = p.model_dump(mode="json")
    stats = doc.pop("stats")
    for key in REPORTED_ONLY:
        doc.pop(key, None)
        for jp in doc["jobs"]:
            jp.pop(key, None)
    decision = {jp["job_id"]: sorted(a["switch"] for a in jp["aggregators"]) for jp in doc["jobs"]}
    return {
        "objective_s": p.objective_s,
        "decision": _sha(decision),
        "document": _sha(_rounded(doc)),
        "path": stats["path"],
        "iterations": stats["iterations"],
        "reroutes": stats["reroutes"],
        "columns": stats["columns"],
        "rows": stats["rows"],
    }


def run_case(name: str) -> dict[str, dict]:
    _, build, strategies = CASES[name]
    inst = build()
    return {s: digest(solve(inst, s)) for s in strategies}


def compare(name: str, want: dict[str, dict], got: dict[str, dict]) -> list[str]:
    """What differs, one line each (empty: the same placements)."""
    out = []
    for strategy, w in want.items():
        g = got.get(strategy)
        if g is None:
            out.append(f"{name} {strategy}: not run")
            continue
        if not math.isclose(w["objective_s"], g["objective_s"], rel_tol=1e-9, abs_tol=1e-12):
            out.append(f"{name} {strategy}: objective {g['objective_s']!r} != {w['objective_s']!r}")
        for key in ("decision", "document", "path", "iterations", "reroutes", "columns", "rows"):
            if w[key] != g[key]:
                out.append(f"{name} {strategy}: {key} {g[key]!r} != {w[key]!r}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--record", action="store_true")
    mode.add_argument("--check", action="store_true")
    ap.add_argument("--size", choices=SIZES, default="large", help="the largest cases run")
    ap.add_argument("--fixture", type=Path, default=FIXTURE)
    ap.add_argument("--only", nargs="*", help="case names (default: every case up to --size)")
    args = ap.parse_args()
    top = SIZES.index(args.size)
    names = args.only or [n for n, c in CASES.items() if SIZES.index(c[0]) <= top]
    stored = json.loads(args.fixture.read_text()) if args.fixture.exists() else {}
    bad: list[str] = []
    for name in names:
        t = time.perf_counter()
        got = run_case(name)
        took = time.perf_counter() - t
        if args.record:
            stored[name] = got
            print(f"{name}: recorded ({took:.1f} s)", flush=True)
        else:
            diff = compare(name, stored[name], got) if name in stored else [f"{name}: no record"]
            bad += diff
            print(f"{name}: {'same' if not diff else 'DIFFERENT'} ({took:.1f} s)", flush=True)
    if args.record:
        args.fixture.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
    for line in bad:
        print(line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
