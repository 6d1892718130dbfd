"""The hook's numbers (agg_agent.torch_hook) without processes: per block of 256 values the
ranks agree on a scale, so any finite magnitude is summed without clipping within the
rounding bound relative to its block's largest value; inf and NaN come out as IEEE
addition gives them. Ranks are threads over real UDP with the parameter server's `serve`
(buckets of any size) behind the switch model."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agg_agent import blockfloat as bf
from agg_agent.endpoints import ParameterServer
from agg_agent.fixedpoint import FixedPoint
from agg_agent.switch_model import JobConfig, SwitchModel, UdpSwitch
from agg_agent.torch_hook import AggregationHook, error_bound


class Job:
    """W hooks and a serving PS behind a switch model that aggregates the job."""

    def __init__(self, workers: int, loss: float = 0.0) -> None:
        self.ps = ParameterServer(3, FixedPoint(1.0, workers), None, [("127.0.0.1", 9)] * workers)
        model = SwitchModel({3: JobConfig(pool_base=0, pool_size=8, fan_in=workers)})
        self.switch = UdpSwitch(model, self.ps.address, loss=loss, seed=1).__enter__()
        self.hooks = [
            AggregationHook.create(
                w,
                workers,
                3,
                self.switch.address,
                window=8,
                bind=("127.0.0.1", 0),
                timeout_s=0.02,
                deadline_s=30,
            )
            for w in range(workers)
        ]
        self.ps.workers = [h.worker.address for h in self.hooks]
        self.thread = threading.Thread(target=self.ps.serve, daemon=True)
        self.thread.start()

    def allreduce(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        out: list[np.ndarray | BaseException] = [np.zeros(0)] * len(xs)

        def run(w: int) -> None:
            try:
                out[w] = self.hooks[w].allreduce(xs[w])
            except BaseException as e:  # reported below
                out[w] = e

        ts = [threading.Thread(target=run, args=(w,)) for w in range(len(xs))]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        for o in out:
            if isinstance(o, BaseException):
                raise o
        return out  # type: ignore[return-value]

    def close(self) -> None:
        self.ps.stop()
        self.thread.join(5)
        self.switch.__exit__(None, None, None)
        self.ps.close()
        for h in self.hooks:
            h.close()


@pytest.fixture(scope="module")
def job2() -> Iterator[Job]:
    j = Job(2, loss=0.01)
    yield j
    j.close()


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    n=st.integers(1, 700),
    exp=st.integers(-140, 100),
    seed=st.integers(0, 2**32 - 1),
)
def test_any_magnitude_is_summed_within_the_bound_relative_to_its_block(
    job2: Job, n: int, exp: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    # magnitudes 2^exp apart by up to 1e9 within a bucket, a block of 1e-6 beside one of 1e3
    span = np.repeat(rng.choice([1e-6, 1.0, 1e3], bf.blocks(n)), bf.BLOCK)[:n]
    xs = [rng.standard_normal(n) * 2.0**exp * span * rng.choice([1.0, 1e-3], n) for _ in range(2)]
    got = job2.allreduce(xs)
    exact = xs[0] + xs[1]  # two float64 summands: IEEE's sum is the nearest double
    tops = job2.hooks[0].last_tops
    assert all(np.array_equal(h.last_tops, tops) for h in job2.hooks)  # every rank agreed
    bounds = job2.hooks[0].last_bounds()
    for g in got:
        assert np.array_equal(g, got[0])  # every rank the same numbers
        assert np.all(np.abs(g - exact) <= bounds * (1 + 1e-12))
    # relative to each block's largest magnitude: blockfloat.relative_bound(2) at most
    largest = np.zeros(bf.blocks(n) * bf.BLOCK)
    largest[:n] = np.maximum(np.abs(xs[0]), np.abs(xs[1]))
    largest = np.repeat(largest.reshape(-1, bf.BLOCK).max(axis=1), bf.BLOCK)[:n]
    # a block under 2^(EXP_MIN - 1) (3.4e-49, far below float32's range) is scaled as if
    # its largest were that: relative to that floor (blockfloat's 3.)
    floor = 2.0 ** (bf.EXP_MIN - 1)
    assert np.all(bounds <= bf.relative_bound(2) * np.maximum(largest, floor))
    assert job2.hooks[0].tops[-1] == tops.max()  # the bucket's: a bound for all of it


def test_inf_and_nan_come_out_as_ieee_addition(job2: Job) -> None:
    inf, nan = np.inf, np.nan
    a = np.array([inf, inf, -inf, 1.0, nan, 2.0, 0.0, 1e30])
    b = np.array([1.0, -inf, -inf, nan, 3.0, inf, 0.0, -1e30])
    got = job2.allreduce([a, b])
    want = a + b
    for g in got:
        assert np.array_equal(np.isnan(g), np.isnan(want)), g
        fin = ~np.isnan(want)
        assert np.array_equal(g[fin], want[fin]), (g, want)
    # a bucket with no finite value other than zero, and an all-zero bucket
    assert np.array_equal(job2.allreduce([np.zeros(5), np.zeros(5)])[0], np.zeros(5))
    got = job2.allreduce([np.array([inf, 0.0]), np.array([0.0, 0.0])])[1]
    assert got[0] == inf and got[1] == 0.0


def test_buckets_of_unequal_sizes_one_after_another(job2: Job) -> None:
    rng = np.random.default_rng(7)
    for n in (1213, 3294, 3904, 1, 31, 33, 64):
        xs = [rng.standard_normal(n) for _ in range(2)]
        got = job2.allreduce(xs)[0]
        top = job2.hooks[0].tops[-1]
        assert got.shape == (n,)
        assert np.max(np.abs(got - (xs[0] + xs[1]))) <= error_bound(top, 2) * (1 + 1e-12)


def test_four_ranks() -> None:
    j = Job(4)
    try:
        rng = np.random.default_rng(3)
        xs = [rng.standard_normal(100) * 1e4 for _ in range(4)]
        got = j.allreduce(xs)
        top = j.hooks[0].tops[-1]
        exact = np.sum(np.array(xs, dtype=np.longdouble), axis=0).astype(np.float64)
        assert np.max(np.abs(got[2] - exact)) <= error_bound(top, 4) * (1 + 1e-9) + 1e-12
    finally:
        j.close()


def test_a_value_beyond_the_range_on_one_rank_fails_every_rank_alike() -> None:
    from agg_agent.torch_hook import ValueRefused

    j = Job(2)
    try:
        with pytest.raises(ValueRefused, match="1 rank"):
            j.allreduce([np.array([1.0, 2.0**130]), np.array([1.0, 2.0])])
        # and the job goes on with the next bucket
        assert np.array_equal(j.allreduce([np.ones(3), np.ones(3)])[0], np.full(3, 2.0))
    finally:
        j.close()
