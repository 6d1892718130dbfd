"""DDP training through bmv2 running our pipeline: two workers and the parameter server in
network namespaces, the gradients summed in the switch (job 7) or only at the PS (job 9,
no entry), against gloo's all-reduce over the same switch; a few steps each
(`p4/host-agent/benchmarks/train_bmv2.py` trains to accuracy; docs/training.md).
Skipped where bmv2 or PyTorch is missing, with the reason."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import bmv2

REASON = bmv2.skip_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=str(REASON))
pytest.importorskip("torch", reason="PyTorch is installed by `make sync` (the dev group)")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "p4" / "host-agent" / "benchmarks"))

import train_bmv2 as tb  # noqa: E402

from agg_agent import blockfloat as bf  # noqa: E402
from agg_agent import train_digits as td  # noqa: E402
from agg_agent.fixedpoint import FixedPoint  # noqa: E402
from agg_agent.torch_hook import error_bound  # noqa: E402

WORKERS, STEPS, LR = 2, 12, 0.1


@pytest.fixture(scope="module")
def hosts() -> Iterator[tuple[bmv2.Hosts, int]]:
    sw, ps = tb.fabric(WORKERS, f"it{bmv2.os.getpid() % 10000}")
    try:
        with bmv2.Hosts(sw, list(range(1, WORKERS + 2))) as h:
            yield h, ps
    finally:
        sw.__exit__(None, None, None)


@pytest.fixture(scope="module")
def gloo(hosts: tuple[bmv2.Hosts, int], tmp_path_factory: pytest.TempPathFactory) -> td.Result:
    """The same steps with PyTorch's gloo all-reduce over the same switch: the reference."""
    h, ps = hosts
    out = tmp_path_factory.mktemp("gloo") / "gloo.json"
    return tb.run(h, WORKERS, ps, "gloo", out, 1, STEPS, LR)[0]


def within_the_bound(res: td.Result, gloo: td.Result) -> tuple[float, float]:
    """The largest parameter difference from gloo, and the bound it must stay within."""
    assert res.steps == gloo.steps == STEPS
    top = max(abs(x) for x in res.parameters)
    rounding = sum(error_bound(e, WORKERS) for e in res.tops) / WORKERS
    return td.compare(res, gloo), LR * rounding + STEPS * 2.0**-23 * top


def test_training_through_bmv2_matches_gloo_within_the_rounding_bound(
    hosts: tuple[bmv2.Hosts, int], gloo: td.Result, tmp_path: Path
) -> None:
    h, ps = hosts
    runs = {
        mode: tb.run(h, WORKERS, ps, mode, tmp_path / f"{mode}.json", 1, STEPS, LR)
        for mode in ("agg", "agg-off")
    }
    # a step: the bucket's agreement (12 lanes a block of 256 values), then the values of
    # the blocks not zero on every rank
    agreement = -(-bf.agreement_lanes(td.parameter_count()) // 32)
    chunks = {m: STEPS * agreement + runs[m][0].values_sent // 32 for m in runs}
    assert all(runs[m][0].values_sent > 0 for m in runs)
    agg_rows, off_rows = runs["agg"][1], runs["agg-off"][1]
    assert len(agg_rows) == len(off_rows) == STEPS  # one PS iteration a step (one bucket)
    # In the switch: a chunk is one aggregate, unless a worker's timer fired on a loaded
    # machine (a retransmission flushes a partial sum; the rest then completes at the PS)
    assert sum(r["aggregated_packets"] for r in agg_rows) >= 0.9 * chunks["agg"]
    assert sum(r["aggregated_packets"] for r in off_rows) == 0
    assert sum(r["raw_packets"] for r in off_rows) == chunks["agg-off"] * WORKERS
    for mode in ("agg", "agg-off"):
        diff, bound = within_the_bound(runs[mode][0], gloo)
        assert diff <= bound, (mode, diff, bound)


LEFT = 0.25  # what the killed run's worker 0 had sent for each of its last chunks


def test_a_job_restarted_on_its_number_trains_as_if_its_killed_run_left_nothing(
    hosts: tuple[bmv2.Hosts, int], gloo: td.Result, tmp_path: Path
) -> None:
    """A run of job 7 killed with chunks half summed: its worker 0's last packets, one to
    each of the 16 slots of the job's pool (seq 0-15, LEFT in every lane, in that run's
    number), are held by the switch when a new run of job 7 starts (a new PS, new ranks,
    seq from 0 again). The new run must train as gloo does: before runs
    (docs/protocols.md, "Runs") its first 16 chunks completed with the killed run's values
    added, and every parameter of the first step was off by up to LEFT * lr."""
    from agg_agent.protocol import LANES, UDP_PORT, AggPacket

    h, ps = hosts
    fixed = FixedPoint.for_bound(1.0, WORKERS)
    left = [
        AggPacket(7, s, 0, WORKERS, s, 1, 0, (int(fixed.to_fixed([LEFT])[0]),) * LANES, run=0xDEAD)
        for s in range(16)
    ]
    send = (
        "import socket, sys; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
        "[s.sendto(bytes.fromhex(x), (sys.argv[1], int(sys.argv[2]))) for x in sys.argv[3:]]"
    )
    killed = h.run(1, [sys.executable, "-c", send, f"10.0.0.{ps}", str(UDP_PORT),
                       *(p.encode().hex() for p in left)])  # fmt: skip
    assert killed.wait(120) == 0, killed.communicate()
    res, rows = tb.run(h, WORKERS, ps, "agg", tmp_path / "restarted.json", 1, STEPS, LR)
    diff, bound = within_the_bound(res, gloo)
    assert diff <= bound, (diff, bound)
    assert all(r["other_runs"] == 0 for r in rows)  # the leftovers stayed in the switch
