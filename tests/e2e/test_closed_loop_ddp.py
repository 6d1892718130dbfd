"""The closed loop with a PyTorch job (issue 30): the real parts of test_closed_loop.py
(bmv2 under ONOS 2.7, INT to the collector and InfluxDB, the service's control loop), the
job a DDP job (`agg-agent train`, `AggregationHook`) from the start; congestion moves it
while it trains, and its parameters must equal gloo's within the rounding bound.

Its own fabric, where the synthetic job trains first and is then killed (SIGTERM, mid-
iteration) and the DDP job takes its job number: a restart as a user's, with the killed
run's partial sums left in the switches' slots. Before runs (docs/protocols.md, "Runs")
the new run's chunks completed with them (0.0498 off gloo, docs/training.md). Skipped, with
the reason, without ONOS, bmv2, InfluxDB or PyTorch.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agg_optimizer.service import onosd
from int_collector.influxd import InfluxServer

from . import closed_loop
from .closed_loop import ClosedLoop, Params

pytest.importorskip("torch", reason="PyTorch is installed by `make sync` (the dev group)")


@pytest.fixture(scope="module")
def loop(
    onos_real: onosd.OnosServer, influx: InfluxServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ClosedLoop]:
    workdir = tmp_path_factory.mktemp("ddp")
    yield from closed_loop.running(onos_real, influx, workdir, Params(synthetic=True), "ddp")


DDP_STEPS = 40


def test_a_pytorch_job_trains_on_through_a_move_without_a_wrong_step(
    loop: ClosedLoop, tmp_path: Path
) -> None:
    """The job, placed by the service, trains as a PyTorch DDP job (the digits MLP,
    `AggregationHook`); congestion moves it while it trains; its parameters
    after `DDP_STEPS` steps equal those of the same steps with gloo's all-reduce (loopback,
    same seed) within the fixed point's rounding bound: no step applied a partial, stale
    or doubled sum across the move."""
    from agent.test_torch_hook import rounding_bound, train_all

    from agg_agent import train_digits as td

    # The background's path first: its intent can take longer than the job's 40 steps.
    spine = loop.spine_of(loop.placement())
    loop.pin_background(spine)
    run = loop.train_ddp(DDP_STEPS, tmp_path / "agg.json")
    onosd.wait_for(lambda: len(run.rows) >= 10, 600, "10 steps of the PyTorch job")
    ep = loop.episode(pinned=spine)
    res, rows = run.finish(1800)
    gloo = train_all(tmp_path, "gloo", steps=DDP_STEPS)

    assert ep.t_onos is not None, "the service did not move the job"
    moved_to = loop.spine_of(loop.placement())
    assert moved_to != ep.spine, (ep.spine, moved_to)
    # The move came while the job trained: steps completed on both sides of it, and the
    # switches summed chunks after it (the new spine aggregates).
    before = [r for r in rows if r["t"] < ep.t_start]
    after = [r for r in rows if r["t"] > ep.t_onos]
    assert before and after, (len(before), len(after), len(rows))
    assert sum(r["aggregated_packets"] for r in after) > 0, after
    assert len(rows) == DDP_STEPS  # one PS iteration a step: the model is one DDP bucket
    assert res.steps == gloo.steps == DDP_STEPS
    diff, bound = td.compare(res, gloo), rounding_bound(res)
    print(
        f"\nPyTorch job through the move: {len(before)} steps before the congestion, "
        f"{len(after)} after the move to {moved_to}; parameters within {diff:.2e} of gloo "
        f"(bound {bound:.2e}); {sum(r['aggregated_packets'] for r in rows)} chunks summed in "
        f"the switches, {sum(r['raw_packets'] for r in rows)} raw"
    )
    assert diff <= bound, (diff, bound)
