"""PyTorch DDP through the aggregation protocol (the hook), on loopback: real processes
(`agg-agent train`, `agg-agent ps`), real UDP, no switch (every chunk reaches the PS raw;
the bmv2 version is tests/p4/test_bmv2_train.py). The same training with gloo's
all-reduce must give the same parameters within the rounding bound."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch", reason="PyTorch is installed by `make sync` (the dev group)")

from agg_agent import train_digits as td
from agg_agent.torch_hook import error_bound

AGENT = [sys.executable, "-c", "from agg_agent.cli import main; main()"]
WORLD = 2
STEPS = 30
LR = 0.1
DEADLINE_S = 600  # a cold start of torch in three processes on a loaded 2-core machine


def free_port(kind: int) -> int:
    import socket

    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_all(
    tmp: Path,
    allreduce: str,
    extra: list[str] | None = None,
    steps: int = STEPS,
    world: int = WORLD,
) -> td.Result:
    """Every rank of one run on loopback (`agg-agent train`); rank 0's result."""
    import socket

    master = free_port(socket.SOCK_STREAM)
    out = tmp / f"{allreduce}.json"
    argvs = [
        [*AGENT, "train", "--rank", str(r), "--world", str(world), "--master",
         f"127.0.0.1:{master}", "--allreduce", allreduce, "--max-steps", str(steps),
         "--lr", str(LR), "--out", str(out), *(extra[r] if extra else [])]
        for r in range(world)
    ]  # fmt: skip
    # faulthandler: should a rank die of a signal (one CI run saw rank 0 or 1 abort with
    # "terminate called without an active exception", not reproduced in 160 runs since),
    # its threads' Python stacks say where.
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    pipe = subprocess.PIPE
    procs = [
        subprocess.Popen(a, stdout=pipe, stderr=pipe, text=True, start_new_session=True, env=env)
        for a in argvs
    ]
    try:
        said = [p.communicate(timeout=DEADLINE_S) for p in procs]
        for rank, (p, (stdout, err)) in enumerate(zip(procs, said, strict=True)):
            assert p.returncode == 0, (
                f"rank {rank} exited {p.returncode}; stdout: {stdout[-1000:]}\n"
                f"stderr: {err[-3000:]}"
            )
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return td.load(out)


def rounding_bound(res: td.Result, lr: float = LR, world: int = WORLD) -> float:
    """Per step, the averaged gradient differs by at most the bucket's rounding bound / W
    (`torch_hook.error_bound` of the exponent the ranks agreed), and each run rounds its
    update to float32 (half an ulp of the largest parameter, each)."""
    top = float(np.max(np.abs(res.parameters)))
    sums = sum(error_bound(e, world) for e in res.tops) / world
    return lr * sums + res.steps * 2.0**-23 * top


def train_agg(
    tmp: Path, args: list[str] | None = None, steps: int = STEPS, world: int = WORLD
) -> td.Result:
    """The same training through the hook, with a parameter server for buckets of any
    size (`agg-agent ps --size 0`); its lines (one a step) checked."""
    import socket

    ports = [free_port(socket.SOCK_DGRAM) for _ in range(world + 1)]
    ps = subprocess.Popen(
        [*AGENT, "ps", "--size", "0", "--job", "5", "--bind", f"127.0.0.1:{ports[0]}"]
        + [a for w in range(world) for a in ("--worker-addr", f"127.0.0.1:{ports[w + 1]}")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        extra = [
            ["--ps", f"127.0.0.1:{ports[0]}", "--job", "5", "--bind", f"127.0.0.1:{ports[r + 1]}",
             "--timeout-ms", "200", *(args or [])]
            for r in range(world)
        ]  # fmt: skip
        res = train_all(tmp, "agg", extra, steps, world)
    finally:
        ps.terminate()
        out, err = ps.communicate(timeout=60)
    assert ps.returncode == 0, err[-3000:]
    rows = [ln for ln in out.splitlines() if ln.startswith("{")]
    assert len(rows) == len(res.tops), (len(rows), len(res.tops))  # a line a bucket
    return res


def buckets_per_step(res: td.Result) -> float:
    return len(res.tops) / max(1, res.steps)


def test_ddp_through_the_protocol_matches_gloo_within_the_rounding_bound(tmp_path: Path) -> None:
    agg = train_agg(tmp_path)
    gloo = train_all(tmp_path, "gloo")
    assert agg.steps == gloo.steps == STEPS
    assert buckets_per_step(agg) == 1  # the model is one DDP bucket
    diff = td.compare(agg, gloo)
    bound = rounding_bound(agg)
    assert diff <= bound, (diff, bound)
    assert agg.accuracy[-1][2] == pytest.approx(gloo.accuracy[-1][2], abs=1 / 360)
    assert agg.accuracy[-1][2] > 0.5  # it learned (10 classes: chance is 0.1)


def test_large_gradients_are_not_clipped(tmp_path: Path) -> None:
    """Loss x 1000 with lr / 1000: the same SGD updates. Before, every gradient over 1.0
    was clipped per worker, silently; now the bucket's scale follows its magnitude."""
    args = ["--loss-scale", "1000", "--lr", str(LR / 1000)]
    agg = train_agg(tmp_path, [*args, "--check-gloo"])
    gloo = train_all(tmp_path, "gloo", [args] * WORLD)
    assert max(agg.grad_max) > 10, max(agg.grad_max)  # far past the old bound of 1.0
    # every step's all-reduced gradient is gloo's within the tolerance, element by element
    assert len(agg.check_ratio) == agg.steps and agg.check_over == 0, agg.check_ratio
    assert max(agg.check_ratio) <= 1.0
    diff = td.compare(agg, gloo)
    bound = rounding_bound(agg, LR / 1000)
    assert diff <= bound, (diff, bound)
    assert agg.accuracy[-1][2] == pytest.approx(gloo.accuracy[-1][2], abs=1 / 360)


def test_grad_scaler_skips_the_same_steps_as_with_gloo(tmp_path: Path) -> None:
    """AMP's GradScaler at 65,536, and rank 1's loss infinite at step 5: the hook delivers
    inf/NaN to every rank as gloo does, so the scaler skips that step and halves its scale
    on both; before, inf became +-1.0 and the scaler never saw the overflow. Several
    buckets of unequal sizes (DDP's bucket_cap_mb), no size given to anything."""
    args = ["--grad-scaler", "65536", "--inf-at", "5", "--bucket-cap-mb", "0.0005"]
    agg = train_agg(tmp_path, [*args, "--check-gloo"])
    gloo = train_all(tmp_path, "gloo", [args] * WORLD)
    assert buckets_per_step(agg) > 1
    assert agg.nonfinite >= 1
    assert agg.scales == gloo.scales, (agg.scales, gloo.scales)
    assert agg.scales[5] == agg.scales[4] / 2  # the step skipped
    # per bucket, gloo's numbers (inf and NaN where gloo has them) within the tolerance
    assert len(agg.check_ratio) == len(agg.tops) and agg.check_over == 0, agg.check_ratio
    diff = td.compare(agg, gloo)
    assert diff <= rounding_bound(agg), diff


def test_four_ranks_with_large_gradients_match_gloo_step_by_step(tmp_path: Path) -> None:
    """Four ranks, loss x 1000: each step's all-reduce equals gloo's of the same gradients
    within the tolerance, and the run's parameters and accuracy are gloo's."""
    args = ["--loss-scale", "1000", "--lr", str(LR / 1000)]
    steps = 12
    agg = train_agg(tmp_path, [*args, "--check-gloo"], steps, world=4)
    gloo = train_all(tmp_path, "gloo", [args] * 4, steps, world=4)
    assert agg.steps == gloo.steps == steps
    assert len(agg.check_ratio) == steps and agg.check_over == 0, agg.check_ratio
    diff = td.compare(agg, gloo)
    assert diff <= rounding_bound(agg, LR / 1000, world=4), diff
    assert agg.accuracy[-1][2] == pytest.approx(gloo.accuracy[-1][2], abs=1 / 360)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_gradients_match_gloo_step_by_step(tmp_path: Path, dtype: str) -> None:
    """A model in bfloat16 or float16 (its gradients, so DDP's buckets, of that type), rank
    1's loss infinite at the last step: every bucket equals gloo's all-reduce within the
    type's own rounding, inf and NaN where gloo has them (no scaler: the parameters go NaN
    on both runs alike at that step)."""
    steps = 8
    args = ["--dtype", dtype, "--inf-at", str(steps - 1), "--lr", "0.05"]
    agg = train_agg(tmp_path, [*args, "--check-gloo"], steps)
    gloo = train_all(tmp_path, "gloo", [args] * WORLD, steps)
    assert agg.nonfinite >= 1
    assert len(agg.check_ratio) == steps and agg.check_over == 0, agg.check_ratio
    a, g = np.array(agg.parameters), np.array(gloo.parameters)
    assert np.array_equal(np.isnan(a), np.isnan(g)) and np.isnan(a).any()
