"""Simulation commands: demo (the closed loop) and evaluate (strategies on seeds)."""

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

    from agg_optimizer.evaluation.scenario import Scenario

from agg_optimizer.cli.common import UserError, app, make_console


@app.command()
def demo(
    duration: Annotated[
        float, typer.Option(help="Seconds the loop runs once the jobs are placed.")
    ] = 45.0,
    hotspot_every: Annotated[float, typer.Option(help="Seconds between congestions.")] = 9.0,
    period: Annotated[float, typer.Option(help="The service's control-loop period (s).")] = 0.2,
    out: Annotated[Path, typer.Option(help="Where the timeline and the plot go.")] = Path(
        "demo-out"
    ),
    influxd: Annotated[
        Path | None, typer.Option(help="influxd binary (default: the `make influxdb` cache)")
    ] = None,
) -> None:
    """The closed loop on the simulated fabric: INT over UDP to the collector, InfluxDB, the
    service's control loop, placements applied through the fabric's ONOS API (docs/e2e.md)."""
    from agg_optimizer.demo.closedloop import LoopConfig, plot, run

    console = make_console()
    if duration < 10:
        raise UserError("--duration: at least 10 s (the first congestion starts after 4 s)")
    if not 0 < period <= 10:
        raise UserError("--period: must be in (0, 10] seconds")
    from int_collector.children import NotReady, on_signals

    on_signals()  # SIGTERM and SIGHUP stop every process of the run, as Ctrl-C does
    cfg = LoopConfig(duration_s=duration, hotspot_every_s=hotspot_every, period_s=period, out=out)
    try:
        result = run(cfg, say=lambda line: console.print(line, highlight=False), influxd=influxd)
    except FileNotFoundError as e:
        raise UserError(str(e)) from None
    except NotReady as e:
        print(f"agg-optimizer demo: {e}", file=sys.stderr)
        raise typer.Exit(1) from None
    out.mkdir(parents=True, exist_ok=True)
    (out / "timeline.json").write_text(json.dumps(result.__dict__, indent=1))
    plot(result, out / "loop.png")
    console.print(loop_summary(result))
    console.print(f"timeline: {out / 'timeline.json'}, plot: {out / 'loop.png'}")


def loop_summary(result: object) -> Table:
    """Reaction times and job a's iteration time before, during and after each congestion."""
    import numpy as np
    from rich.table import Table

    from agg_optimizer.demo.closedloop import LoopResult

    assert isinstance(result, LoopResult)
    table = Table(title="The closed loop: job a under congestion of its tree")
    for col in ("congested link", "telemetry -> applied", "CCT before", "CCT congested",
                "CCT after move", "moved to"):  # fmt: skip
        table.add_column(col, justify="right")
    its = [x for x in result.iterations if x["job"] == "a"]

    def mean_ms(lo: float, hi: float, *, within: bool) -> str:
        """Job a's mean CCT over the iterations wholly inside [lo, hi) (`within`), or
        those on the wire at some time in it."""
        v = [
            x["cct_s"] for x in its
            if (lo <= x["start_s"] and x["start_s"] + x["cct_s"] <= hi if within
                else x["start_s"] < hi and x["start_s"] + x["cct_s"] > lo)
        ]  # fmt: skip
        return f"{np.mean(v) * 1e3:.0f} ms" if v else "-"

    for r, h in zip(result.reactions, result.hotspots, strict=True):
        moved = r["applied_s"]
        onset = r["onset_s"]
        table.add_row(
            r["link"],
            "-" if r["reaction_s"] is None else f"{r['reaction_s'] * 1e3:.0f} ms",
            # before: iterations that ended before the congestion began
            mean_ms(onset - 3, onset, within=True),
            mean_ms(onset, moved if moved else (h["end_s"] or onset), within=False),
            mean_ms(moved + 0.3, h["end_s"], within=True) if moved and h["end_s"] else "-",
            ", ".join(r["new"]) or "-",
        )
    rt = result.reaction_times()
    if rt:
        table.caption = (
            f"reaction (telemetry over the threshold -> placement applied): "
            f"p50 {np.percentile(rt, 50) * 1e3:.0f} ms, p95 {np.percentile(rt, 95) * 1e3:.0f} "
            f"ms, max {max(rt) * 1e3:.0f} ms over {len(rt)} congestions; "
            f"{result.reports_sent} INT reports sent"
        )
    return table


def _scenarios(name: str) -> list[Scenario]:
    from pydantic import ValidationError

    from agg_optimizer.evaluation.scenario import SCENARIOS, SUITE, Scenario
    from agg_optimizer.model.validation import describe_validation_error

    if name == "suite":
        return [SCENARIOS[n] for n in SUITE]
    if name in SCENARIOS:
        return [SCENARIOS[name]]
    path = Path(name)
    if path.suffix != ".json":
        raise UserError(
            f"--scenario: unknown {name!r}; one of {', '.join(SCENARIOS)}, suite, or a .json file"
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
    keep_placements: Annotated[
        bool,
        typer.Option(
            help="Also write every placement's instance and placement document to "
            "OUTPUT/placements/SCENARIO/STRATEGY/seedN/ (to re-check them outside the simulator)"
        ),
    ] = False,
) -> None:
    """Simulate every strategy on a scenario's jobs and background; write the table
    (summary.md), all iterations (results.json) and plots to OUTPUT."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from agg_optimizer.evaluation.evaluate import (
        default_processes,
        load_results,
        run_all,
        write_results,
    )
    from agg_optimizer.evaluation.scenario import REFERENCES
    from agg_optimizer.evaluation.scenario import is_known_strategy as known_strategy
    from agg_optimizer.placement.engine import STRATEGIES
    from agg_optimizer.scheduling.policies import POLICIES

    if replot:
        src = output / "results.json"
        if not src.is_file():
            raise UserError(f"--replot: no {src}")
        scs, res = load_results(src)
        text, plots = write_results(output, scs, res)
        sys.stdout.write(text + "\n")
        return

    if seeds is not None and seeds < 1:
        raise UserError("--seeds: must be >= 1")
    if processes is not None and processes < 1:
        raise UserError("--processes: must be >= 1")
    chosen = _scenarios(scenario)
    if strategies:
        names = [s.strip() for s in strategies.split(",") if s.strip()]
        known = [*STRATEGIES, *REFERENCES]
        bad = [n for n in names if not known_strategy(n)]
        if bad:
            raise UserError(
                f"--strategies: unknown {', '.join(bad)}; one of {', '.join(known)}, or "
                f"STRATEGY+POLICY with a policy of {', '.join(POLICIES)}"
            )
        chosen = [sc.model_copy(update={"strategies": names}) for sc in chosen]
    default_seeds = 3 if scenario == "suite" else None
    results = {}
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=make_console(stderr=True),
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
                sc,
                n,
                processes=processes or default_processes(),
                on_done=tick,
                keep=output / "placements" if keep_placements else None,
            )
            progress.update(task, description=sc.name)
            # after every scenario, so a long suite that is stopped keeps what it finished
            text, plots = write_results(
                output, {s.name: s for s in chosen if s.name in results}, results
            )
    console = make_console()
    console.print(text)
    console.print(
        f"wrote {output / 'summary.md'}, {output / 'results.json'}, "
        + ", ".join(str(p) for p in plots)
    )
