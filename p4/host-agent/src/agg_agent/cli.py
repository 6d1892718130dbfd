"""`agg-agent`: run a worker or a parameter server; one JSON line per iteration on stdout."""

from __future__ import annotations

import json
from typing import Annotated

import numpy as np
import typer

from agg_agent.endpoints import Address, ParameterServer, Worker
from agg_agent.fixedpoint import FixedPoint
from agg_agent.protocol import UDP_PORT

app = typer.Typer(add_completion=False, help=__doc__)


def _address(text: str, name: str, default_port: int = UDP_PORT) -> Address:
    host, _, port = text.rpartition(":") if ":" in text else (text, "", str(default_port))
    try:
        return host, int(port)
    except ValueError:
        raise typer.BadParameter(f"{name}: '{text}' is not host:port") from None


Job = Annotated[int, typer.Option(min=0, max=0xFFFF, help="Job ID (16 bits).")]
Workers = Annotated[int, typer.Option(min=1, max=32, help="Workers in the job.")]
Bound = Annotated[
    float, typer.Option(min=0, help="Largest |value| a worker sends: sets the shared scale.")
]
Size = Annotated[int, typer.Option(min=1, help="Tensor elements per iteration.")]
Iterations = Annotated[int, typer.Option(min=1)]


@app.command()
def worker(
    worker_id: Annotated[int, typer.Option("--worker-id", min=0, max=31)],
    ps: Annotated[str, typer.Option(help="Parameter server host:port (switches on the path).")],
    job: Job = 1,
    workers: Workers = 2,
    bound: Bound = 1.0,
    size: Size = 1024,
    iterations: Iterations = 10,
    window: Annotated[int, typer.Option(min=1, max=1024, help="Slots of the job's pool.")] = 16,
    timeout_ms: Annotated[float, typer.Option(min=0.1)] = 50.0,
    bind: Annotated[str, typer.Option(help="Local host:port.")] = f"0.0.0.0:{UDP_PORT}",
    seed: int = 0,
) -> None:
    """Send random tensors in [-bound, bound] (seeded) for `iterations` iterations."""
    try:
        fixed = FixedPoint.for_bound(bound, workers)
        w = Worker(
            job,
            worker_id,
            fixed,
            _address(ps, "--ps"),
            window,
            timeout_ms / 1000,
            bind=_address(bind, "--bind"),
        )
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    rng = np.random.default_rng(seed + worker_id)
    try:
        for _ in range(iterations):
            s = w.run_iteration(rng.uniform(-bound, bound, size))
            print(json.dumps({"role": "worker", "worker_id": worker_id, **_asdict(s)}), flush=True)
    finally:
        w.close()


@app.command("ps")
def parameter_server(
    worker_addr: Annotated[
        list[str], typer.Option("--worker-addr", help="host:port of worker 0, 1, ... in order.")
    ],
    job: Job = 1,
    bound: Bound = 1.0,
    size: Size = 1024,
    iterations: Iterations = 10,
    bind: Annotated[str, typer.Option(help="Local host:port.")] = f"0.0.0.0:{UDP_PORT}",
) -> None:
    """Complete `iterations` iterations from aggregated and raw packets; print their stats."""
    addrs = [_address(a, f"--worker-addr[{i}]") for i, a in enumerate(worker_addr)]
    try:
        fixed = FixedPoint.for_bound(bound, len(addrs))
        ps = ParameterServer(job, fixed, size, addrs, bind=_address(bind, "--bind"))
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    try:
        for r in ps.run(iterations):
            print(
                json.dumps(
                    {
                        "role": "ps",
                        "iteration": r.iteration,
                        "seconds": r.seconds,
                        "aggregated_packets": r.aggregated_packets,
                        "raw_packets": r.raw_packets,
                        "duplicates": r.duplicates,
                        "sum_head": [float(v) for v in r.total[:4]],
                    }
                ),
                flush=True,
            )
    finally:
        ps.close()


def _asdict(s: object) -> dict[str, object]:
    return {k: getattr(s, k) for k in s.__slots__}  # type: ignore[attr-defined]


def main() -> None:
    app()
