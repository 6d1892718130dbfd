"""`agg-optimizer`: solve, compare, schema, example.

Errors in the input end the program with status 2 and one line naming the field.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from .documents import Instance, Placement
from .engine import STRATEGIES, solve
from .examples import example_instance
from .validation import InstanceError, describe_validation_error

if TYPE_CHECKING:  # the simulator pulls in numba: imported only by `evaluate`
    from .sim.scenario import Scenario

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Place in-network aggregation for training jobs from INT telemetry.",
)
console = Console()


class UserError(Exception):
    """A problem with what the user gave us; printed as one line."""


def _load(path: Path) -> Instance:
    try:
        text = path.read_text()
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None
    try:
        return Instance.model_validate_json(text)
    except ValidationError as e:
        raise UserError(f"{path}: {describe_validation_error(e)}") from None


def _write(text: str, out: Path | None) -> None:
    if out is None:
        sys.stdout.write(text + "\n")
    else:
        out.write_text(text + "\n")


@app.command("solve")
def solve_cmd(
    instance: Path,
    strategy: Annotated[str, typer.Option(help=f"One of: {', '.join(STRATEGIES)}")] = "agg",
    output: Annotated[Path | None, typer.Option("-o", "--output")] = None,
    seed: int = 0,
) -> None:
    """Place aggregation for every job of INSTANCE.json and print the placement document."""
    placement = solve(_load(instance), strategy, seed=seed)
    _write(placement.model_dump_json(indent=2), output)


def comparison_table(instance: Instance, seed: int = 0) -> Table:
    results = {name: solve(instance, name, seed=seed) for name in STRATEGIES}
    ps = results["ps"].mean_predicted_cct_s
    table = Table(title=f"{len(instance.jobs)} jobs: predicted CCT by strategy")
    for col in ("strategy", "mean CCT (s)", "vs PS", "objective (s)", "aggregators", "time (ms)"):
        table.add_column(col, justify="left" if col == "strategy" else "right")
    for name, p in sorted(results.items(), key=lambda kv: kv[1].mean_predicted_cct_s):
        n_aggs = sum(len(j.aggregators) for j in p.jobs)
        table.add_row(
            name,
            f"{p.mean_predicted_cct_s:.3f}",
            f"{(p.mean_predicted_cct_s / ps - 1) * 100:+.1f}%" if ps else "n/a",
            f"{p.objective_s:.3f}",
            str(n_aggs),
            f"{p.stats.total_s * 1000:.1f}",
        )
    return table


@app.command()
def compare(instance: Path, seed: int = 0) -> None:
    """Table of every strategy's predicted CCT on INSTANCE.json."""
    console.print(comparison_table(_load(instance), seed))


@app.command()
def schema(document: Annotated[str, typer.Argument(help="instance or placement")]) -> None:
    """Print the JSON Schema of a document."""
    models = {"instance": Instance, "placement": Placement}
    if document not in models:
        raise UserError(f"document: unknown {document!r}; one of instance, placement")
    print(json.dumps(models[document].model_json_schema(), indent=2))


@app.command()
def example(
    fat_tree: Annotated[int, typer.Option("--fat-tree", help="Fat-tree arity k (even).")] = 4,
    jobs: Annotated[int, typer.Option(help="Number of jobs.")] = 4,
    seed: int = 0,
    min_workers: int = 4,
    max_workers: int = 12,
    slots: Annotated[int, typer.Option(help="Aggregator slots per switch.")] = 512,
    output: Annotated[Path | None, typer.Option("-o", "--output")] = None,
) -> None:
    """Write a random instance: fat-tree, uneven INT telemetry, jobs spread over racks."""
    if jobs < 1:
        raise UserError("jobs: must be >= 1")
    if not 1 <= min_workers <= max_workers:
        raise UserError("min_workers: must be >= 1 and <= max_workers")
    inst = example_instance(fat_tree, jobs, seed, slots=slots, workers=(min_workers, max_workers))
    _write(inst.model_dump_json(indent=1, exclude_defaults=False), output)


@app.command()
def demo(seed: int = 0) -> None:
    """Make an example instance (k=4 fat-tree, 6 jobs), solve it with every strategy."""
    inst = example_instance(4, 6, seed, slots=256)
    console.print(comparison_table(inst, seed))
    p = solve(inst, "agg")
    s = p.stats
    console.print(
        f"AGG: {s.iterations} LP solve(s), {s.columns} columns x {s.rows} rows, "
        f"build {s.build_s * 1e3:.1f} ms, solve {s.solve_s * 1e3:.1f} ms, "
        f"largest distance from an integer {s.max_integrality_gap:.1e}"
    )


def _scenarios(name: str) -> list[Scenario]:
    from .sim.scenario import SCENARIOS, SUITE, Scenario

    if name == "suite":
        return [SCENARIOS[n] for n in SUITE]
    if name in SCENARIOS:
        return [SCENARIOS[name]]
    path = Path(name)
    if path.suffix != ".json":
        raise UserError(
            f"scenario: unknown {name!r}; one of {', '.join(SCENARIOS)}, suite, or a .json file"
        )
    try:
        text = path.read_text()
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None
    try:
        return [Scenario.model_validate_json(text)]
    except ValidationError as e:
        raise UserError(f"{path}: {describe_validation_error(e)}") from None


@app.command()
def evaluate(
    scenario: Annotated[
        str, typer.Option(help="A named scenario, `suite` (all of them), or a scenario .json")
    ] = "paper",
    seeds: Annotated[
        int | None, typer.Option(help="Seeds per strategy (default: the scenario's)")
    ] = None,
    output: Annotated[Path, typer.Option("-o", "--output", help="Directory for results")] = Path(
        "evaluation"
    ),
    processes: Annotated[
        int | None, typer.Option(help="Simulations run side by side (default: CPU count)")
    ] = None,
    strategies: Annotated[
        str | None, typer.Option(help="Comma-separated subset of strategies")
    ] = None,
    replot: Annotated[
        bool, typer.Option(help="Only rewrite the table and plots from OUTPUT/results.json")
    ] = False,
) -> None:
    """Simulate every strategy on a scenario's jobs and background; write the table
    (summary.md), all iterations (results.json) and plots to OUTPUT."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from .sim.evaluate import default_processes, load_results, run_all, write_results
    from .sim.scenario import REFERENCES

    if replot:
        src = output / "results.json"
        if not src.is_file():
            raise UserError(f"replot: no {src}")
        scs, res = load_results(src)
        text, plots = write_results(output, scs, res)
        sys.stdout.write(text + "\n")
        return

    if seeds is not None and seeds < 1:
        raise UserError("seeds: must be >= 1")
    if processes is not None and processes < 1:
        raise UserError("processes: must be >= 1")
    chosen = _scenarios(scenario)
    if strategies:
        names = [s.strip() for s in strategies.split(",") if s.strip()]
        known = [*STRATEGIES, *REFERENCES]
        bad = [n for n in names if n not in known]
        if bad:
            raise UserError(f"strategies: unknown {', '.join(bad)}; one of {', '.join(known)}")
        chosen = [sc.model_copy(update={"strategies": names}) for sc in chosen]
    default_seeds = 3 if scenario == "suite" else None
    results = {}
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    ) as progress:
        for sc in chosen:
            n = seeds or default_seeds or sc.seeds
            task = progress.add_task(sc.name, total=n * len(sc.strategies))

            def tick(r, task=task, sc=sc) -> None:
                progress.update(task, advance=1, description=f"{r.strategy} seed {r.seed}")
                if not progress.console.is_terminal:  # a log, not a redrawn bar
                    done = int(progress.tasks[task].completed)
                    total = int(progress.tasks[task].total or 0)
                    progress.console.print(
                        f"{sc.name}: {done}/{total} done ({r.strategy}, seed {r.seed}, "
                        f"{r.wall_s:.1f} s)"
                    )

            results[sc.name] = run_all(
                sc, n, processes=processes or default_processes(), on_done=tick
            )
            progress.update(task, description=sc.name)
            # after every scenario, so a long suite that is stopped keeps what it finished
            text, plots = write_results(
                output, {s.name: s for s in chosen if s.name in results}, results
            )
    console.print(text)
    console.print(
        f"wrote {output / 'summary.md'}, {output / 'results.json'}, "
        + ", ".join(str(p) for p in plots)
    )


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Listen address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Listen port.")] = 8080,
) -> None:
    """Run the REST service (settings from AGG_OPTIMIZER_* variables, docs/service.md)."""
    import uvicorn

    from .service.app import create_app
    from .service.settings import Settings

    try:
        settings = Settings()
    except ValidationError as e:
        raise UserError(f"settings: {describe_validation_error(e)}") from None
    uvicorn.run(create_app(settings), host=host, port=port, log_level="info")


def main() -> None:
    try:
        app()
    except (UserError, InstanceError, ValueError) as e:
        print(f"agg-optimizer: error: {e}", file=sys.stderr)
        sys.exit(2)
