"""Block floating point over int32 sums (agg_agent.blockfloat), as the switch would sum it:
every partial sum of every lane checked to stay within int32 (a bmv2 register would wrap),
the decoded sum compared with the exact one (math.fsum per element) against each block's
bound, and that bound against the contract: relative to the block's largest magnitude."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agg_agent import blockfloat as bf

I32 = (-(2**31), 2**31 - 1)


def switch_sum(parts: list[np.ndarray]) -> np.ndarray:
    """Lane-wise sums in the order a chain of switches adds them, none leaving int32."""
    acc = np.zeros(parts[0].size, np.int64)
    for p in parts:
        acc += p.astype(np.int64)
        assert acc.min() >= I32[0] and acc.max() <= I32[1], "a lane would wrap in the switch"
    return acc


def allreduce(xs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    w, n = len(xs), xs[0].size
    tops, nonfinite = bf.agreed(switch_sum([bf.agreement(x) for x in xs]), n)
    assert nonfinite == sum(int(np.count_nonzero(~np.isfinite(x))) for x in xs)
    total = np.zeros(n)
    if bf.sent(tops).any():
        total = bf.decode(switch_sum([bf.encode(x, tops, w) for x in xs]), tops, n, w)
    if nonfinite:
        bf.apply_codes(total, switch_sum([bf.codes(x) for x in xs]))
    return total, tops


@st.composite
def buckets(draw: st.DrawFn) -> list[np.ndarray]:
    """W ranks' buckets whose blocks span float32's range (subnormals to near 2^128), some
    blocks zero on every rank, some on a few."""
    w = draw(st.integers(1, 32))
    n = draw(st.integers(1, 3 * bf.BLOCK + 7))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    nb = bf.blocks(n)
    exps = rng.integers(-149, 120, nb)  # a magnitude per block
    zero = rng.random(nb) < 0.2
    xs = []
    for _ in range(w):
        per_block = np.repeat(2.0 ** exps.astype(float), bf.BLOCK)[:n]
        x = rng.standard_normal(n) * per_block * rng.choice([1.0, 2.0**-30, 0.0], n)
        x[np.repeat(zero, bf.BLOCK)[:n]] = 0.0
        xs.append(x.astype(np.float32).astype(np.float64))  # float32 gradients
    return xs


@settings(max_examples=300, deadline=None)
@given(xs=buckets())
def test_every_block_is_summed_within_its_bound_relative_to_its_largest_magnitude(
    xs: list[np.ndarray],
) -> None:
    w, n = len(xs), xs[0].size
    got, tops = allreduce(xs)
    exact = np.array([math.fsum(col) for col in np.array(xs).T])
    bounds = bf.element_bounds(tops, n, w)
    assert np.all(np.abs(got - exact) <= bounds), np.max(np.abs(got - exact) - bounds)
    # the bound against the contract, block by block
    biggest = np.zeros(bf.blocks(n) * bf.BLOCK)
    biggest[:n] = np.max(np.abs(np.array(xs)), axis=0)
    biggest = np.repeat(biggest.reshape(-1, bf.BLOCK).max(axis=1), bf.BLOCK)[:n]
    assert np.all(bounds <= bf.relative_bound(w) * biggest)
    # a block zero everywhere is exact and not sent
    assert np.all(got[biggest == 0] == 0.0) and np.all(bounds[biggest == 0] == 0.0)


def test_the_contracts_numbers() -> None:
    assert bf.relative_bound(2) == pytest.approx(7.45e-9, rel=1e-3)
    assert bf.relative_bound(4) == pytest.approx(5.96e-8, rel=1e-3)
    assert bf.relative_bound(32) == pytest.approx(3.05e-5, rel=1e-3)
    # twelve lanes a block of 256 values: the agreement costs 4.7% of the values' lanes
    assert bf.agreement_lanes(256 * 1000) == bf.HEAD + 12_000


def test_a_small_block_beside_a_large_one_keeps_its_own_precision() -> None:
    rng = np.random.default_rng(1)
    big = rng.standard_normal(bf.BLOCK) * 1e3
    tiny = rng.standard_normal(bf.BLOCK) * 1e-9
    xs = [np.concatenate([big, tiny]) * s for s in (1.0, -0.5)]
    got, _ = allreduce(xs)
    exact = xs[0] + xs[1]
    rel = np.abs(got[bf.BLOCK :] - exact[bf.BLOCK :]) / np.abs(tiny).max()
    # one scale for the bucket would have left the 1e-9 block an error of ~1e-6 of itself
    assert rel.max() <= bf.relative_bound(2)


def test_inf_nan_and_refusal() -> None:
    a = np.array([np.inf, np.inf, -np.inf, 1.0, np.nan, 2.0])
    b = np.array([1.0, -np.inf, -np.inf, np.nan, 3.0, np.inf])
    got, _ = allreduce([a, b])
    want = a + b
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(got[~np.isnan(want)], want[~np.isnan(want)])
    with pytest.raises(bf.ValueRefused, match="1 rank"):
        allreduce([np.array([2.0**130]), np.array([1.0])])
    with pytest.raises(ValueError, match="workers: 33"):
        bf.scale_for(0, 33)


native = pytest.importorskip("agg_agent.native")


@pytest.mark.skipif(native.reason() is not None, reason=f"no C path: {native.reason()}")
@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4), st.integers(1, 32), st.integers(0, 2**32 - 1), st.data())
def test_the_c_conversions_equal_the_reference_bit_for_bit(
    w: int, blocks: int, seed: int, data: st.DataObject
) -> None:
    """agg_agent.native's agreement, encode and decode (the hook's, on the C path) against
    this module's: every lane and every float the same, for buckets of any length with
    blocks spanning the exponent range, zeros, ties to even, inf, NaN and refusals."""
    rng = np.random.default_rng(seed)
    n = data.draw(st.integers(max(1, (blocks - 1) * bf.BLOCK + 1), blocks * bf.BLOCK))
    exps = rng.integers(-200, 140 if data.draw(st.booleans()) else 120, blocks)
    x = rng.standard_normal(n) * np.repeat(2.0 ** exps.astype(float), bf.BLOCK)[:n]
    x[rng.random(n) < 0.1] = 0.0
    x[np.repeat(rng.random(blocks) < 0.2, bf.BLOCK)[:n]] = 0.0  # blocks zero everywhere
    ties = rng.random(n) < 0.05  # halves at the scale: rounding ties
    x[ties] = (rng.integers(-1000, 1000, int(ties.sum())) + 0.5) * 2.0**-20
    for bad in (np.inf, -np.inf, np.nan):
        x[rng.random(n) < 0.01] = bad
    a = native.bf_agreement(x)
    assert np.array_equal(a, bf.agreement(x)), "agreement"
    try:
        tops, _ = bf.agreed(a.astype(np.int64) * w, n)  # as if every rank had x
    except bf.ValueRefused:
        return
    q = native.bf_encode(x, tops, w)
    assert np.array_equal(q, bf.encode(x, tops, w)), "encode"
    sums = q.astype(np.int64) * w
    got, ref = native.bf_decode(sums, tops, n, w), bf.decode(sums, tops, n, w)
    assert np.array_equal(got.view(np.int64), ref.view(np.int64)), "decode"
