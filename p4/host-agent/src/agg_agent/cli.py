"""`agg-agent`: run a worker or a parameter server; one JSON line per iteration on stdout."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from agg_agent import congestion
from agg_agent.endpoints import Address, IterationResult, ParameterServer, Worker
from agg_agent.fixedpoint import FixedPoint
from agg_agent.protocol import LANES, UDP_PORT

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
FirstSeq = Annotated[
    int,
    typer.Option(
        min=0, max=0xFFFFFFFF, help="The job's first sequence number (all its ends the same)."
    ),
]
Lanes = Annotated[
    int,
    typer.Option(
        help="Values a packet (all the job's ends the same): 32, what switches sum; a larger "
        "multiple of 32 (up to 8192) only where the PS makes every sum: switches forward "
        "such packets unsummed (docs/protocols.md, 'Chunk size').",
    ),
]


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
    cc: Annotated[
        str,
        typer.Option(help="Congestion control: fixed, aimd, dctcp, explicit (docs/congestion.md)."),
    ] = "fixed",
    bdp: Annotated[
        float, typer.Option(min=0.01, help="explicit: the path's bandwidth-delay product, packets.")
    ] = 4.0,
    target_queue: Annotated[
        float, typer.Option(min=0.0, help="explicit: the queue to keep, packets.")
    ] = 1.0,
    cc_step: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="explicit: additive increase per round trip, packets; the queue settles near "
            "--target-queue + senders x this.",
        ),
    ] = 1.0,
    cc_min_window: Annotated[
        float,
        typer.Option(
            min=0.001,
            max=1.0,
            help="explicit: the smallest window, chunks; below 1 the worker paces, one chunk "
            "per round trip / window.",
        ),
    ] = 0.125,
    ecn: Annotated[
        bool, typer.Option(help="Send ECN-capable packets (on by default with --cc dctcp).")
    ] = False,
    first_seq: FirstSeq = 0,
    lanes: Lanes = LANES,
) -> None:
    """Send random tensors in [-bound, bound] (seeded) for `iterations` iterations."""
    if cc not in congestion.SCHEMES:
        raise typer.BadParameter(f"--cc: {cc!r} is not one of {', '.join(congestion.SCHEMES)}")
    try:
        fixed = FixedPoint.for_bound(bound, workers)
        extra = (
            {"bdp": bdp, "target": target_queue, "step": cc_step, "min_window": cc_min_window}
            if cc == "explicit"
            else {}
        )
        w = Worker(
            job,
            worker_id,
            fixed,
            _address(ps, "--ps"),
            window,
            timeout_ms / 1000,
            bind=_address(bind, "--bind"),
            controller=congestion.make(cc, window, **extra),
            ecn=ecn or cc == "dctcp",
            first_seq=first_seq,
            lanes=lanes,
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
    size: Annotated[
        int,
        typer.Option(
            min=0,
            help="Tensor elements per iteration; 0: a training job's PS (buckets of any "
            "size, one line per step, until SIGTERM or SIGINT).",
        ),
    ] = 1024,
    iterations: Annotated[
        int, typer.Option(min=0, help="Iterations to complete; 0: until SIGTERM or SIGINT.")
    ] = 10,
    bind: Annotated[str, typer.Option(help="Local host:port.")] = f"0.0.0.0:{UDP_PORT}",
    linger_s: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="After the last iteration, keep acknowledging retransmissions this long: a "
            "worker whose last acknowledgement was lost retransmits after its timer "
            "(--timeout-ms), so make this a few of the workers' timers.",
        ),
    ] = 0.3,
    run: Annotated[
        int,
        typer.Option(
            min=0,
            max=0xFFFFFFFF,
            help="This server's run number, which the workers learn when they join; 0 draws "
            "one at random (a restarted job then never meets its killed run's chunks).",
        ),
    ] = 0,
    first_seq: FirstSeq = 0,
    lanes: Lanes = LANES,
) -> None:
    """Complete `iterations` iterations from aggregated and raw packets; print their stats."""
    addrs = [_address(a, f"--worker-addr[{i}]") for i, a in enumerate(worker_addr)]
    try:
        fixed = FixedPoint.for_bound(bound, len(addrs))
        ps = ParameterServer(
            job, fixed, size or None, addrs, bind=_address(bind, "--bind"), run_id=run or None,
            first_seq=first_seq, lanes=lanes,
        )  # fmt: skip
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    # --iterations 0: until SIGTERM or SIGINT (a training job's PS: one iteration a bucket)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _s, _f: ps.stop())
    try:
        deadline = 600.0 if not iterations else 60.0

        def say(r: IterationResult) -> None:  # as each completes: the run's progress
            row = {
                "role": "ps", "iteration": r.iteration, "seconds": r.seconds,
                "aggregated_packets": r.aggregated_packets, "raw_packets": r.raw_packets,
                "duplicates": r.duplicates, "sum_head": [float(v) for v in r.total[:4]],
                "run": ps.run_id, "other_runs": ps.other_runs,
            }  # fmt: skip
            print(json.dumps(row), flush=True)

        if size:
            ps.run(iterations or None, linger=linger_s, deadline=deadline, each=say)
        else:
            ps.serve(each=say)
    finally:
        ps.close()


def _asdict(s: object) -> dict[str, object]:
    """A WorkerStats as JSON-able fields; its sum as `sum_head` (the first 4 values, as the
    PS prints them), not the whole array."""
    out = {k: getattr(s, k) for k in s.__slots__ if k != "total"}  # type: ignore[attr-defined]
    total = getattr(s, "total", None)
    if total is not None:
        out["sum_head"] = [float(v) for v in total[:4]]
    return out


@app.command()
def gossip(
    me: Annotated[int, typer.Option(min=0, help="This worker's index in --peers.")],
    peers: Annotated[str, typer.Option(help="host:port of every worker, in order, commas.")],
    probabilities: Annotated[
        str, typer.Option(help="Peer plan: file or URL (GET /api/v1/jobs/{id}/peers).")
    ] = "",
    mode: Annotated[
        str,
        typer.Option(
            help="gossip (peers from the plan), allreduce (synchronous ring), ps (synchronous"
            " parameter server on --ps-index) or prague (random groups of --group, partial"
            " all-reduce)."
        ),
    ] = "gossip",
    group: Annotated[
        int | None, typer.Option(help="prague: workers per group, at least 2 (4 if not given).")
    ] = None,
    ps_index: Annotated[
        int | None, typer.Option(help="ps: the worker that hosts the server (0 if not given).")
    ] = None,
    refresh_s: Annotated[
        float | None,
        typer.Option(
            help="gossip: re-read this worker's row from --probabilities every this many s."
        ),
    ] = None,
    duration_s: Annotated[float, typer.Option(min=0.1)] = 30.0,
    features: Annotated[int, typer.Option(min=1)] = 200,
    data_seed: Annotated[int, typer.Option(min=0)] = 0,
    lr: Annotated[float, typer.Option(min=0.0)] = 5.0,
    compute_s: Annotated[float, typer.Option(min=0.0, help="Floor of a local step.")] = 0.0,
    log: Annotated[Path | None, typer.Option(help="JSON lines: time, loss on all shards.")] = None,
) -> None:
    """Decentralized training: asynchronous gossip SGD with one peer per iteration drawn
    from the plan's probabilities, or one of its synchronous baselines (docs/peers.md).
    Prints one JSON line of counts at the end."""
    from agg_agent.gossip import (
        AllReduceWorker,
        GossipWorker,
        PragueWorker,
        Problem,
        PSWorker,
        load_probabilities,
    )

    modes = ("gossip", "allreduce", "ps", "prague")
    if mode not in modes:
        raise typer.BadParameter(f"mode: {mode!r} is not one of {', '.join(modes)}")
    addrs = [_address(a, "peers") for a in peers.split(",")]
    if me >= len(addrs):
        raise typer.BadParameter(f"me: {me} is not an index of the {len(addrs)} peers")
    # An option the mode ignores is refused: the run would not be the one asked for.
    for name, value, its_mode in (
        ("--group", group, "prague"),
        ("--ps-index", ps_index, "ps"),
        ("--refresh-s", refresh_s, "gossip"),
    ):
        if value is not None and mode != its_mode:
            raise typer.BadParameter(f"{name}: only --mode {its_mode} uses it, not {mode}")
    if group is not None and group < 2:
        raise typer.BadParameter(f"--group: {group} is below 2 (a group of one averages nothing)")
    if ps_index is not None and not 0 <= ps_index < len(addrs):
        raise typer.BadParameter(
            f"--ps-index: {ps_index} is not an index of the {len(addrs)} peers"
        )
    if refresh_s is not None and not 0 < refresh_s < float("inf"):
        raise typer.BadParameter(f"--refresh-s: {refresh_s:g} is not a positive number of seconds")
    problem = Problem(len(addrs), features, seed=data_seed)
    counts: dict[str, object] = {"role": "gossip", "mode": mode, "me": me}
    if mode != "gossip":
        sync: AllReduceWorker | PSWorker | PragueWorker
        if mode == "allreduce":
            sync = AllReduceWorker(me, addrs, problem, lr, compute_s)
        elif mode == "ps":
            sync = PSWorker(me, addrs, problem, ps_index or 0, lr, compute_s)
        else:  # the partitions come from --data-seed too, so one seed fixes a run
            sync = PragueWorker(me, addrs, problem, group or 4, lr, compute_s, seed=data_seed)
        try:
            sync.connect()
            sync.run(duration_s, log)
        finally:
            sync.close()
        kept = {
            "allreduce": ("rounds",),
            "ps": ("rounds", "ps_index"),
            "prague": ("rounds", "averaged_rounds", "alone_rounds", "failed_rounds"),
        }[mode]
        counts |= {k: getattr(sync, k) for k in kept}
        print(json.dumps(counts), flush=True)
        return
    if refresh_s is not None and not probabilities:
        raise typer.BadParameter("--refresh-s: needs --probabilities, the plan to re-read")
    try:
        p = load_probabilities(probabilities, me, [f"{h}:{pt}" for h, pt in addrs])
    except (OSError, ValueError, KeyError) as e:
        raise typer.BadParameter(f"probabilities: {e}") from None
    w = GossipWorker(me, addrs, problem, p, lr, compute_s, source=probabilities,
                     refresh_s=refresh_s or 0.0)  # fmt: skip
    try:
        w.wait_for_peers()
        w.run(duration_s, log)
        time.sleep(1.0)  # serve the peers still running
    finally:
        w.close()
    kept = ("iterations", "exchanges_served", "failed_exchanges", "plan_changes",
            "refresh_failures", "ended_by")  # fmt: skip
    counts |= {k: getattr(w, k) for k in kept}
    print(json.dumps(counts), flush=True)


@app.command()
def train(
    rank: Annotated[int, typer.Option(min=0, help="This worker's rank, 0..world-1.")],
    world: Annotated[int, typer.Option(min=1, max=32, help="Number of workers.")],
    master: Annotated[str, typer.Option(help="host:port of rank 0's torch.distributed store.")],
    allreduce: Annotated[str, typer.Option(help="agg (through the fabric) or gloo.")] = "agg",
    ps: Annotated[str, typer.Option(help="agg: host:port of the parameter server.")] = "",
    job: Job = 1,
    bind: Annotated[str, typer.Option(help="agg: this worker's host:port.")] = (
        f"0.0.0.0:{UDP_PORT}"
    ),
    window: Annotated[int, typer.Option(min=1, help="agg: chunks in flight (<= pool).")] = 16,
    deadline_s: Annotated[
        float, typer.Option(min=0.1, help="agg: a bucket unfinished this long fails, naming who.")
    ] = 10.0,
    loss_scale: Annotated[
        float, typer.Option(min=0, help="Multiply the loss (large gradients; lr / it).")
    ] = 1.0,
    grad_scaler: Annotated[
        float, typer.Option(min=0, help="Train with AMP's GradScaler at this initial scale.")
    ] = 0.0,
    inf_at: Annotated[
        int, typer.Option(help="Rank 1's loss infinite at this step; -1: never.")
    ] = -1,
    bucket_cap_mb: Annotated[float, typer.Option(min=0, help="DDP's bucket size; 0: its own.")] = 0,
    timeout_ms: Annotated[float, typer.Option(min=1, help="agg: retransmission timer.")] = 200,
    dtype: Annotated[
        str, typer.Option(help="The model's type: float32, bfloat16 or float16.")
    ] = "float32",
    check_gloo: Annotated[
        bool, typer.Option(help="agg: compare every bucket with gloo's all-reduce too.")
    ] = False,
    epochs: Annotated[int, typer.Option(min=1)] = 30,
    batch: Annotated[int, typer.Option(min=1, help="Examples per worker per step.")] = 32,
    lr: Annotated[float, typer.Option(min=0)] = 0.1,
    max_steps: Annotated[int, typer.Option(min=0, help="Stop after this many; 0: none.")] = 0,
    out: Annotated[str, typer.Option(help="Write the result (JSON) here (rank 0).")] = "",
) -> None:
    """Train an MLP on scikit-learn's digits with DDP, the gradients all-reduced through
    the aggregation protocol (agg) or by gloo; print accuracy per epoch as JSON lines.
    The parameter server for agg: `agg-agent ps --size 0` (buckets of any size)."""
    from pathlib import Path

    from agg_agent import train_digits as td

    if rank >= world:
        raise typer.BadParameter(f"--rank: {rank} is not below --world {world}")
    if allreduce not in ("agg", "gloo"):
        raise typer.BadParameter(f"--allreduce: 'agg' or 'gloo', got {allreduce!r}")
    hook_args = None
    if allreduce == "agg":
        if not ps:
            raise typer.BadParameter("--ps: needed with --allreduce agg")
        hook_args = {
            "job": job, "ps": _address(ps, "--ps"), "window": window,
            "bind": _address(bind, "--bind"), "timeout_s": timeout_ms / 1000,
            "deadline_s": deadline_s,
        }  # fmt: skip
    res = td.train(rank, world, _address(master, "--master", 29500), allreduce, epochs, batch,
                   lr, max_steps or None, hook_args, loss_scale, grad_scaler or None,
                   None if inf_at < 0 else inf_at, bucket_cap_mb or None,
                   check_gloo and allreduce == "agg", dtype)  # fmt: skip
    for e, t, acc in res.accuracy:
        print(json.dumps({"role": "train", "rank": rank, "epoch": e, "seconds": t,
                          "accuracy": acc}), flush=True)  # fmt: skip
    if out and rank == 0:
        td.save(res, Path(out))


def main() -> None:
    app()
