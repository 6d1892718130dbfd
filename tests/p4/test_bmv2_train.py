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

from agg_agent import train_digits as td  # noqa: E402
from agg_agent.fixedpoint import FixedPoint  # noqa: E402

WORKERS, STEPS, LR = 2, 12, 0.1


@pytest.fixture(scope="module")
def hosts() -> Iterator[tuple[bmv2.Hosts, int]]:
    sw, ps = tb.fabric(WORKERS, f"it{bmv2.os.getpid() % 10000}")
    try:
        with bmv2.Hosts(sw, list(range(1, WORKERS + 2))) as h:
            yield h, ps
    finally:
        sw.__exit__(None, None, None)


def test_training_through_bmv2_matches_gloo_within_the_rounding_bound(
    hosts: tuple[bmv2.Hosts, int], tmp_path: Path
) -> None:
    h, ps = hosts
    runs = {
        mode: tb.run(h, WORKERS, ps, mode, tmp_path / f"{mode}.json", 1, STEPS, LR)
        for mode in ("agg", "agg-off", "gloo")
    }
    chunks = -(-td.parameter_count() // 32)
    agg_rows, off_rows = runs["agg"][1], runs["agg-off"][1]
    assert len(agg_rows) == len(off_rows) == STEPS  # one PS iteration a step (one bucket)
    # In the switch: a chunk is one aggregate, unless a worker's timer fired on a loaded
    # machine (a retransmission flushes a partial sum; the rest then completes at the PS)
    assert sum(r["aggregated_packets"] for r in agg_rows) >= 0.9 * STEPS * chunks
    assert sum(r["aggregated_packets"] for r in off_rows) == 0
    assert sum(r["raw_packets"] for r in off_rows) == STEPS * chunks * WORKERS
    gloo = runs["gloo"][0]
    fixed = FixedPoint.for_bound(1.0, WORKERS)
    for mode in ("agg", "agg-off"):
        res = runs[mode][0]
        assert res.steps == gloo.steps == STEPS
        top = max(abs(x) for x in res.parameters)
        bound = STEPS * (LR * fixed.error_bound / WORKERS + 2.0**-23 * top)
        assert td.compare(res, gloo) <= bound, (mode, td.compare(res, gloo), bound)
