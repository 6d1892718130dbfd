"""Placement commands: solve, compare, optimum, peers, schema, example."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

# Everything else is imported by the command that needs it: a command pays only for its own
# libraries (numpy, scipy, networkx, highspy and pydantic's models take about 1.7 s together
# on a small machine; `--help` needs none of them). docs/benchmarks/cli.md.
if TYPE_CHECKING:
    from rich.table import Table

    from agg_optimizer.model.documents import Instance, Placement

from agg_optimizer.cli.common import (
    STRATEGY_NAMES,
    UserError,
    app,
    load,
    make_console,
    out_dir,
    write,
)


@app.command("solve")
def solve_cmd(
    instance: Path,
    strategy: Annotated[str, typer.Option(help=f"One of: {', '.join(STRATEGY_NAMES)}")] = "agg",
    output: Annotated[Path | None, typer.Option("-o", "--output")] = None,
    seed: int = 0,
) -> None:
    """Place aggregation for every job of INSTANCE.json and print the placement document."""
    from agg_optimizer.placement.engine import solve

    placement = solve(load(instance), strategy, seed=seed)
    write(placement.model_dump_json(indent=2), output)


@app.command()
def peers(
    instance: Path,
    job: Annotated[str, typer.Option(help="The job whose workers pick peers")],
    policy: Annotated[str, typer.Option(help="netmax, adpsgd, allreduce, ps or prague")] = "netmax",
    compute_s: Annotated[float, typer.Option(min=0.0, help="Compute per iteration (s)")] = 0.0,
    kappa: Annotated[float, typer.Option(min=0.0, help="Consensus weight (docs/peers.md)")] = 1.0,
    model_bytes: Annotated[int | None, typer.Option(min=1, help="Default: update_bytes")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output")] = None,
) -> None:
    """Decentralized training: each worker's peer-selection probabilities for JOB of
    INSTANCE.json (NetMax or a baseline), from its topology and telemetry."""
    import json

    from agg_optimizer.peers.selection import PeerError, pair_times, plan

    inst = load(instance)
    spec = next((j for j in inst.jobs if j.id == job), None)
    if spec is None:
        raise UserError(f"--job: no job {job!r} in {instance}")
    try:
        t = pair_times(inst, spec.workers, model_bytes or spec.update_bytes)
        p = plan(policy, spec.workers, t, compute_s, kappa)
    except PeerError as e:
        raise UserError(str(e)) from None
    write(json.dumps({"job_id": job, **p.as_json()}, indent=2), output)


def solve_all(instance: Instance, seed: int = 0) -> dict[str, Placement]:
    """Every strategy of `engine.STRATEGIES` on `instance`, in one process."""
    from agg_optimizer.placement.engine import STRATEGIES, solve

    return {name: solve(instance, name, seed=seed) for name in STRATEGIES}


def comparison_table(results: dict[str, Placement], n_jobs: int) -> Table:
    from rich.table import Table

    ps = results["ps"].mean_predicted_cct_s if "ps" in results else 0.0
    table = Table(title=f"{n_jobs} jobs: predicted CCT by strategy")
    floor = next((p.mean_floor_cct_s for p in results.values() if p.mean_floor_cct_s), None)
    if floor:
        table.caption = (f"floor (no placement's mean is lower, network.floor_cct): "
                         f"{floor:.3f} s")  # fmt: skip
    cols = ("strategy", "mean CCT (s)", "vs PS", "vs floor", "objective (s)", "aggregators",
            "time (ms)")  # fmt: skip
    for col in cols:
        table.add_column(col, justify="left" if col == "strategy" else "right")
    for name, p in sorted(results.items(), key=lambda kv: kv[1].mean_predicted_cct_s):
        n_aggs = sum(len(j.aggregators) for j in p.jobs)
        table.add_row(
            name,
            f"{p.mean_predicted_cct_s:.3f}",
            f"{(p.mean_predicted_cct_s / ps - 1) * 100:+.1f}%" if ps else "n/a",
            f"{(p.mean_predicted_cct_s / floor - 1) * 100:+.1f}%" if floor else "n/a",
            f"{p.objective_s:.3f}",
            str(n_aggs),
            f"{p.stats.total_s * 1000:.1f}",
        )
    return table


@app.command()
def compare(
    instance: Path,
    output: Annotated[
        Path | None,
        typer.Option("-o", "--output", help="Directory for one placement per strategy."),
    ] = None,
    seed: int = 0,
) -> None:
    """Solve INSTANCE.json with every strategy in one process and print a table of their
    predicted CCT, objective and solve time; with -o DIR, write DIR/<strategy>.json."""
    inst = load(instance)
    out = out_dir(output) if output is not None else None
    results = solve_all(inst, seed)
    if out is not None:
        for name, placement in results.items():
            write(placement.model_dump_json(indent=2), out / f"{name}.json")
    console = make_console()
    console.print(comparison_table(results, len(inst.jobs)))
    if out is not None:
        console.print(f"wrote {len(results)} placements to {out}/", highlight=False)


@app.command()
def optimum(
    instance: Path,
    max_evals: Annotated[
        int, typer.Option(min=1, help="Evaluations of the shared model the search may spend.")
    ] = 200_000,
    output: Annotated[Path | None, typer.Option("-o", "--output")] = None,
) -> None:
    """The true optimum of the jobs' weighted predicted CCT for a small INSTANCE.json (every
    shortest route, aggregator set and pool; docs/evaluation.md): print its placement
    document, and AGG's figure beside it on stderr."""
    from agg_optimizer.placement.engine import solve_optimum

    inst = load(instance)
    best, agg = solve_optimum(inst, max_evals=max_evals)  # AGG's figure: the search's start
    write(best.model_dump_json(indent=2), output)
    weight = {j.id: j.weight for j in inst.jobs}
    score = sum(weight[jp.job_id] * jp.predicted_cct_s for jp in best.jobs)
    gap = f"{(agg / score - 1) * 100:+.2f}%" if score > 0 else "n/a"
    print(
        f"optimum: {best.stats.status}; weighted predicted CCT {score:.6g} s "
        f"({best.stats.iterations} evaluations); AGG {agg:.6g} s ({gap})",
        file=sys.stderr,
    )


@app.command()
def schema(
    document: Annotated[str, typer.Argument(help="instance, placement or scenario")],
) -> None:
    """Print the JSON Schema of a document (a scenario is what `evaluate --scenario` reads)."""
    from agg_optimizer.evaluation.scenario import Scenario
    from agg_optimizer.model.documents import Instance, Placement

    models = {"instance": Instance, "placement": Placement, "scenario": Scenario}
    if document not in models:
        raise UserError(f"DOCUMENT: unknown {document!r}; one of {', '.join(models)}")
    print(json.dumps(models[document].model_json_schema(), indent=2))


def _leaf_spine(spec: str) -> tuple[int, int, int]:
    parts = spec.split(",")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        dims = ()
    if len(dims) != 3 or min(dims) < 1:
        raise UserError(
            "--leaf-spine: expected SPINES,LEAVES,HOSTS_PER_LEAF (three integers >= 1), "
            f"got {spec!r}"
        )
    return dims  # type: ignore[return-value]


@app.command()
def example(
    fat_tree: Annotated[
        int | None, typer.Option("--fat-tree", help="Fat-tree arity k (even). [default: 4]")
    ] = None,
    leaf_spine: Annotated[
        str | None,
        typer.Option(
            "--leaf-spine",
            metavar="SPINES,LEAVES,HOSTS_PER_LEAF",
            help="A leaf-spine fabric instead of the fat-tree.",
        ),
    ] = None,
    jobs: Annotated[int, typer.Option(help="Number of jobs.")] = 4,
    seed: int = 0,
    min_workers: int = 4,
    max_workers: int = 12,
    slots: Annotated[int, typer.Option(help="Aggregator slots per switch.")] = 512,
    background: Annotated[
        float | None,
        typer.Option(
            metavar="LEVEL",
            help="Mean link utilisation of the telemetry, 0..1 (each directed link drawn in "
            "[LEVEL/2, 3 LEVEL/2]). Default: mostly light links and 15% hot ones.",
        ),
    ] = None,
    cap: Annotated[
        int | None, typer.Option(metavar="N", help="max_aggregators of every job.")
    ] = None,
    pool_slots: Annotated[
        int | None, typer.Option(metavar="N", help="pool_slots of every job. [default: 128]")
    ] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output")] = None,
) -> None:
    """Write a random instance: fat-tree (or leaf-spine), uneven INT telemetry, jobs spread
    over racks."""
    if jobs < 1:
        raise UserError("--jobs: must be >= 1")
    if not 1 <= min_workers <= max_workers:
        raise UserError("--min-workers: must be >= 1 and <= --max-workers")
    if slots < 0:
        raise UserError("--slots: must be >= 0")
    if fat_tree is not None and leaf_spine is not None:
        raise UserError("--leaf-spine: give either --fat-tree or --leaf-spine, not both")
    if background is not None and not 0.0 <= background <= 1.0:
        raise UserError(f"--background: must be in [0, 1], got {background}")
    if cap is not None and cap < 1:
        raise UserError("--cap: must be >= 1")
    if pool_slots is not None and pool_slots < 1:
        raise UserError("--pool-slots: must be >= 1")
    from agg_optimizer.model.examples import example_instance
    from agg_optimizer.model.topology import leaf_spine as build_leaf_spine

    topo = None
    if leaf_spine is not None:
        topo = build_leaf_spine(*_leaf_spine(leaf_spine), slots=slots)
    inst = example_instance(
        4 if fat_tree is None else fat_tree,
        jobs,
        seed,
        slots=slots,
        workers=(min_workers, max_workers),
        topology=topo,
        background=background,
        max_aggregators=cap,
        pool_slots=pool_slots,
    )
    write(inst.model_dump_json(indent=1, exclude_defaults=False), output)
