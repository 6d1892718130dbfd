"""The network bound (`trees.floor_cct`) beside every placement: no strategy's predicted
CCT is below it, and a job that a switch sums at its PS's own switch reaches it up to its
path latency."""

from __future__ import annotations

import pytest

from agg_optimizer.model.documents import Instance, Job, Link, Node, Telemetry, Topology
from agg_optimizer.model.examples import example_instance
from agg_optimizer.model.network import Network
from agg_optimizer.model.topology import leaf_spine
from agg_optimizer.model.trees import floor_cct
from agg_optimizer.placement.engine import STRATEGIES, solve
from agg_optimizer.placement.shared import EXACT_MAX_JOBS


@pytest.mark.parametrize(
    "inst",
    [
        example_instance(4, 5, 31, slots=128, background=0.6),
        example_instance(4, 6, 32, slots=4096),
        example_instance(4, 5, 33, topology=leaf_spine(2, 4, 4, uplink_gbps=25.0, slots=256)),
    ],
    ids=["k4-scarce-busy", "k4-ample", "leaf-spine"],
)
def test_no_strategy_is_predicted_below_the_floor(inst: Instance) -> None:
    for name in STRATEGIES:
        p = solve(inst, name)
        for jp in p.jobs:
            assert jp.floor_cct_s is not None and jp.floor_cct_s > 0
            assert jp.floor_cct_s <= jp.predicted_cct_isolated_s * (1 + 1e-12), (name, jp.job_id)
            assert jp.predicted_cct_isolated_s <= jp.predicted_cct_s * (1 + 1e-12)
        assert p.mean_floor_cct_s == pytest.approx(sum(j.floor_cct_s for j in p.jobs) / len(p.jobs))
        assert p.mean_floor_cct_s <= p.mean_predicted_cct_s


def star(workers: int) -> Instance:
    """One switch, `workers` workers and a PS on it, 10 Gb/s each, nothing else."""
    hosts = [f"h{i}" for i in range(workers + 1)]
    topo = Topology(
        nodes=[Node(id="s", kind="switch"), *(Node(id=h, kind="host") for h in hosts)],
        links=[Link(src=h, dst="s", capacity_gbps=10.0) for h in hosts],
    )
    job = Job(id="j", workers=hosts[1:], ps=hosts[0], update_bytes=125_000_000)
    return Instance(topology=topo, telemetry=Telemetry(links=[], switches=[]), jobs=[job])


def test_summing_at_the_ps_switch_reaches_the_floor_and_the_ps_alone_does_not() -> None:
    inst = star(3)
    floor = floor_cct(Network.from_instance(inst), inst.jobs[0])
    assert floor == pytest.approx(0.1)  # 1 Gbit over 10 Gb/s: one stream on each host link
    agg = solve(inst, "agg").jobs[0]
    assert [a.switch for a in agg.aggregators] == ["s"]
    assert agg.floor_cct_s == pytest.approx(floor)
    assert 0 <= agg.predicted_cct_s - floor < 1e-3  # the path latency, microseconds
    ps = solve(inst, "ps").jobs[0]  # three streams into the PS's link
    assert ps.predicted_cct_s == pytest.approx(3 * floor, rel=1e-3)


def test_large_instances_report_the_floor_too() -> None:
    inst = example_instance(8, EXACT_MAX_JOBS + 6, 34, workers=(2, 6))
    p = solve(inst, "agg")
    assert p.cct_model == "isolated"  # described from the forest, above EXACT_MAX_JOBS
    assert all(jp.floor_cct_s is not None for jp in p.jobs)
    assert all(jp.floor_cct_s <= jp.predicted_cct_s * (1 + 1e-12) for jp in p.jobs)
