"""`agg-optimizer`: solve, compare, optimum, schema, example.

Errors in the input end the program with status 2 and one line naming the field.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

# Everything else is imported by the command that needs it: a command pays only for its own
# libraries (numpy, scipy, networkx, highspy and pydantic's models take about 1.7 s together
# on a small machine; `--help` needs none of them). docs/benchmarks/cli.md.
if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from .documents import Instance, Placement
    from .sim.scenario import Scenario

# `engine.STRATEGIES`, spelled out so that `--help` does not import the solvers
# (tests/optimizer/test_cli_compare.py checks the two agree).
STRATEGY_NAMES = (
    "agg", "agg-mm", "agg-own", "ps", "switchml", "atp", "sharp", "soar", "grid", "random",
    "greedy", "milp", "greedy-rr",
)  # fmt: skip

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Place in-network aggregation for training jobs from INT telemetry.",
)


def _console(stderr: bool = False) -> Console:
    from rich.console import Console

    return Console(stderr=stderr)


class UserError(Exception):
    """A problem with what the user gave us; printed as one line."""


def _load(path: Path) -> Instance:
    from pydantic import ValidationError

    from .documents import Instance
    from .validation import describe_validation_error

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
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")


@app.command("solve")
def solve_cmd(
    instance: Path,
    strategy: Annotated[str, typer.Option(help=f"One of: {', '.join(STRATEGY_NAMES)}")] = "agg",
    output: Annotated[Path | None, typer.Option("-o", "--output")] = None,
    seed: int = 0,
) -> None:
    """Place aggregation for every job of INSTANCE.json and print the placement document."""
    from .engine import solve

    placement = solve(_load(instance), strategy, seed=seed)
    _write(placement.model_dump_json(indent=2), output)


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

    from .peers import PeerError, pair_times, plan

    inst = _load(instance)
    spec = next((j for j in inst.jobs if j.id == job), None)
    if spec is None:
        raise UserError(f"--job: no job {job!r} in {instance}")
    try:
        t = pair_times(inst, spec.workers, model_bytes or spec.update_bytes)
        p = plan(policy, spec.workers, t, compute_s, kappa)
    except PeerError as e:
        raise UserError(str(e)) from None
    _write(json.dumps({"job_id": job, **p.as_json()}, indent=2), output)


def solve_all(instance: Instance, seed: int = 0) -> dict[str, Placement]:
    """Every strategy of `engine.STRATEGIES` on `instance`, in one process."""
    from .engine import STRATEGIES, solve

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


def _out_dir(path: Path) -> Path:
    if path.exists() and not path.is_dir():
        raise UserError(f"--output: {path} exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--output: cannot create {path} ({e.strerror})") from None
    return path


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
    inst = _load(instance)
    out = _out_dir(output) if output is not None else None
    results = solve_all(inst, seed)
    if out is not None:
        for name, placement in results.items():
            _write(placement.model_dump_json(indent=2), out / f"{name}.json")
    console = _console()
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
    from .engine import solve_optimum

    inst = _load(instance)
    best, agg = solve_optimum(inst, max_evals=max_evals)  # AGG's figure: the search's start
    _write(best.model_dump_json(indent=2), output)
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
    from .documents import Instance, Placement
    from .sim.scenario import Scenario

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
    from .examples import example_instance
    from .topology import leaf_spine as build_leaf_spine

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
    _write(inst.model_dump_json(indent=1, exclude_defaults=False), output)


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
    from .closedloop import LoopConfig, plot, run

    console = _console()
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

    from .closedloop import LoopResult

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

    from .sim.scenario import SCENARIOS, SUITE, Scenario
    from .validation import describe_validation_error

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

    from .engine import STRATEGIES
    from .scheduling import POLICIES
    from .sim.evaluate import default_processes, load_results, run_all, write_results
    from .sim.scenario import REFERENCES
    from .sim.scenario import is_known_strategy as known_strategy

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
        console=_console(stderr=True),
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
    console = _console()
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
    import gc

    import uvicorn
    from pydantic import ValidationError

    from .service.app import create_app
    from .service.settings import Settings, resolve_token
    from .validation import describe_validation_error

    try:
        settings = Settings()
    except ValidationError as e:
        raise UserError(f"settings: {describe_validation_error(e)}") from None
    try:
        token = resolve_token(settings)
    except (OSError, ValueError) as e:
        raise UserError(f"settings: api_token_file: {e}") from None
    if token is None and not _loopback(host):
        raise UserError(
            f"refusing to listen on {host} without an API token: anyone who reaches it could "
            "create and delete jobs and rewrite ONOS intents. Set AGG_OPTIMIZER_API_TOKEN "
            "(e.g. export AGG_OPTIMIZER_API_TOKEN=$(python3 -c 'import secrets; "
            "print(secrets.token_urlsafe(32))')) or AGG_OPTIMIZER_API_TOKEN_FILE (generated "
            "there if missing), or listen on 127.0.0.1"
        )
    if settings.api_token_file is not None and not settings.api_token:
        print(f"agg-optimizer: API token in {settings.api_token_file}", file=sys.stderr)
    import logging

    # The port first: a second instance stops here, before it reads or changes anything
    # (uvicorn alone runs the app's start-up, reconcile included, before it binds).
    sock = _bind(host, port)
    # The service's own decisions (why a job moved) at INFO, beside uvicorn's access log.
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("agg_optimizer").setLevel(logging.INFO)
    from .service.core import Service
    from .service.onos import OnosError, OnosUnavailable

    svc = Service(settings)
    # The owner claim in our ONOS app (service/ownership.py): taken by another database, this
    # instance stops here; ONOS not answering, it starts but writes nothing until it holds it.
    svc.ownership.check()
    taken = svc.invariants.health().get("writer")
    if taken:
        svc.close()
        sock.close()
        raise UserError(
            f"{taken}. Refusing to start. Share its database (replicas: one leads, the "
            "others stand by) or give this one another AGG_OPTIMIZER_ONOS_APP_ID"
        )
    try:
        foreign = [] if settings.withdraw_foreign_intents else svc.applier.foreign()
    except (OnosUnavailable, OnosError) as e:
        foreign = []
        print(
            f"agg-optimizer: ownership not checked, ONOS not answering ({e}): nothing is "
            "written to ONOS until this instance holds its owner claim",
            file=sys.stderr,
        )
    if foreign:
        svc.close()
        sock.close()
        raise UserError(
            f"ONOS holds {len(foreign)} intent(s) of app id {settings.onos_app_id} that this "
            f"instance's database ({settings.db_path}) does not own (e.g. {foreign[0]}): "
            "another optimizer instance with another database may be running against this "
            "ONOS. Refusing to start. Share its database (replicas: one leads, the others "
            "stand by), give this one another AGG_OPTIMIZER_ONOS_APP_ID, or, to take the "
            "fabric over after its database was lost, set "
            "AGG_OPTIMIZER_WITHDRAW_FOREIGN_INTENTS=true"
        )
    from .service.connections import protocol

    config = uvicorn.Config(
        create_app(settings, svc),
        log_level="info",
        http=protocol(settings.http_head_timeout_s),
        timeout_keep_alive=settings.http_idle_timeout_s,  # type: ignore[arg-type]
        limit_concurrency=settings.http_max_connections,
    )
    server = uvicorn.Server(config)
    # What is loaded by now (modules, the app, its schemas) lives as long as the process:
    # out of the collector's sight, a full collection scans only what requests made since.
    # Each full collection scanned ~120,000 objects for 60-90 ms, about once a second under
    # load, pausing every request in flight: it was the uncached dry runs' p95 and p99
    # (docs/benchmarks/service-load.md).
    gc.collect()
    gc.freeze()
    server.run(sockets=[sock])


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, or a one-line error naming them."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise UserError(f"--host {host}: {e.strerror}") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise UserError(
            f"cannot listen on {host}:{port}: {e.strerror} (another instance running?)"
        ) from None
    sock.set_inheritable(True)
    return sock


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve anywhere


def _usage_line(e: Exception) -> str:
    """Click's usage errors in our one form, `FIELD: problem`, instead of its framed box."""
    from typer._click.exceptions import BadParameter, MissingParameter, NoSuchOption

    param = getattr(e, "param", None)
    field = ""
    if param is not None:
        opts = [o for o in getattr(param, "opts", []) if o.startswith("--")]
        field = opts[0] if opts else (param.name or "").upper()
    msg = getattr(e, "message", str(e))
    if isinstance(e, MissingParameter):
        msg = "missing"
    elif isinstance(e, NoSuchOption):
        field, msg = e.option_name, "no such option"
        if e.possibilities:
            msg += f"; did you mean {', '.join(sorted(e.possibilities))}?"
    elif isinstance(e, BadParameter) and field:
        msg = e.message
    elif msg.startswith("No such command"):
        field, msg = "COMMAND", "n" + msg[1:].rstrip(".")
    ctx = getattr(e, "ctx", None)
    where = ctx.command_path if ctx is not None else "agg-optimizer"
    return f"{field + ': ' if field else ''}{msg} (try '{where} --help')"


def main() -> None:
    """Every error a user can cause is one line, `agg-optimizer: error: FIELD: problem`,
    with exit status 2."""
    # Typer (pinned in uv.lock) vendors click; its usage errors are not re-exported.
    from typer import Abort
    from typer._click.exceptions import UsageError

    try:
        code = app(prog_name="agg-optimizer", standalone_mode=False)
    except UsageError as e:
        print(f"agg-optimizer: error: {_usage_line(e)}", file=sys.stderr)
        sys.exit(2)
    except (UserError, ValueError) as e:  # validation.InstanceError is a ValueError
        print(f"agg-optimizer: error: {e}", file=sys.stderr)
        sys.exit(2)
    except RuntimeError as e:  # flow_lp.SolveError: the solver failed, not the input
        print(f"agg-optimizer: error: solver: {e}", file=sys.stderr)
        sys.exit(1)
    except (Abort, KeyboardInterrupt):
        print("agg-optimizer: interrupted", file=sys.stderr)
        sys.exit(130)
    if isinstance(code, int) and code:
        sys.exit(code)
