"""The predicted CCT under sharing (issue 16, item 1): every job of a placement shares the
fabric, on the capacity the measured background leaves; the isolated figure stays under
`predicted_cct_isolated_s`."""

from __future__ import annotations

import pytest

from agg_optimizer.model.documents import Instance, Job, LinkTelemetry, Telemetry
from agg_optimizer.model.examples import example_instance
from agg_optimizer.model.topology import fat_tree
from agg_optimizer.placement.engine import solve
from agg_optimizer.placement.shared import EXACT_MAX_JOBS


def _two_jobs(same: bool) -> Instance:
    topo = fat_tree(4)
    hosts = [n.id for n in topo.nodes if n.kind == "host"]
    a = Job(id="a", workers=hosts[0:4], ps=hosts[15], update_bytes=50_000_000)
    other = hosts[0:4] if same else hosts[8:12]
    b = Job(id="b", workers=other, ps=hosts[15] if same else hosts[7], update_bytes=50_000_000)
    return Instance(topology=topo, jobs=[a, b])


def test_two_jobs_on_the_same_links_take_twice_as_long_as_one_alone() -> None:
    # PS-only: the PS's downlink carries every stream of both jobs (the bottleneck), so
    # sharing it doubles each job's transfer time; alone, each has it to itself.
    p = solve(_two_jobs(same=True), "ps")
    assert p.cct_model == "shared"
    alone = solve(_two_jobs(same=True).model_copy(update={"jobs": _two_jobs(True).jobs[:1]}), "ps")
    for jp in p.jobs:
        assert jp.predicted_cct_isolated_s == pytest.approx(alone.jobs[0].predicted_cct_s)
        latency = jp.predicted_cct_isolated_s - 4 * 8 * 50e6 / 10e9
        transfer = jp.predicted_cct_s - latency
        assert transfer == pytest.approx(2 * 4 * 8 * 50e6 / 10e9, rel=1e-6), jp
    assert p.mean_predicted_cct_s == pytest.approx(sum(j.predicted_cct_s for j in p.jobs) / 2)


def test_jobs_that_share_nothing_predict_what_they_would_alone() -> None:
    p = solve(_two_jobs(same=False), "ps")
    for jp in p.jobs:
        assert jp.predicted_cct_s == pytest.approx(jp.predicted_cct_isolated_s, rel=1e-6)


def test_background_on_a_shared_link_slows_every_job_that_crosses_it() -> None:
    inst = _two_jobs(same=True)
    ps_switch = next(ln.dst for ln in inst.topology.links if ln.src == inst.jobs[0].ps)
    busy = inst.model_copy(
        update={
            "telemetry": Telemetry(
                links=[LinkTelemetry(src=ps_switch, dst=inst.jobs[0].ps, utilization=0.5)]
            )
        }
    )
    quiet, loaded = solve(inst, "ps"), solve(busy, "ps")
    for q, b in zip(quiet.jobs, loaded.jobs, strict=True):
        assert b.predicted_cct_s > 1.9 * (q.predicted_cct_s - 0.01), (q, b)


def test_shared_is_never_below_isolated_and_large_placements_say_which_model() -> None:
    p = solve(example_instance(4, 6, 3), "agg")
    assert p.cct_model == "shared"
    assert all(j.predicted_cct_s >= j.predicted_cct_isolated_s for j in p.jobs)
    big = solve(example_instance(8, EXACT_MAX_JOBS + 1, 1, workers=(2, 4)), "ps")
    assert big.cct_model == "isolated"
    assert all(j.predicted_cct_s == j.predicted_cct_isolated_s for j in big.jobs)
