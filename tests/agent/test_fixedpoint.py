import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agg_agent.fixedpoint import INT32_MAX, FixedPoint, FixedPointOverflow

workers = st.integers(1, 32)
bounds = st.floats(1e-3, 1e6)


@given(workers, bounds, st.data())
@settings(max_examples=200, deadline=None)
def test_sum_of_fixed_point_within_the_error_bound(n: int, bound: float, data) -> None:
    fp = FixedPoint.for_bound(bound, n)
    xs = np.array(
        data.draw(
            st.lists(
                st.lists(st.floats(-bound, bound), min_size=5, max_size=5), min_size=n, max_size=n
            )
        )
    )
    q = np.stack([fp.to_fixed(x) for x in xs]).astype(np.int64)
    total = q.sum(axis=0)
    assert np.all(np.abs(total) <= INT32_MAX)  # the switch's int32 sum cannot wrap
    # Beside the rounding to integers, float64 rounds too: the products x * scale, the
    # decoding and the float sum each err by an ulp or so of the magnitudes summed (a case
    # at 0.001 exceeded the bare bound by 7.6e-20, 1.6e-7 of it).
    floats = (n + 2) * np.finfo(np.float64).eps * np.abs(xs).sum(axis=0)
    assert np.all(np.abs(fp.from_fixed(total) - xs.sum(axis=0)) <= fp.error_bound + floats)


@given(workers, bounds, st.floats(1.0001, 100))
def test_value_over_the_bound_is_reported_with_its_index(n: int, bound: float, f: float) -> None:
    fp = FixedPoint.for_bound(bound, n)
    x = np.zeros(4)
    x[2] = -bound * f
    with pytest.raises(FixedPointOverflow, match=r"tensor\[2\]"):
        fp.to_fixed(x)


def test_not_finite_and_bad_parameters_name_the_field() -> None:
    fp = FixedPoint.for_bound(1.0, 2)
    with pytest.raises(FixedPointOverflow, match=r"tensor\[1\]: nan"):
        fp.to_fixed([0.0, float("nan")])
    with pytest.raises(ValueError, match="workers"):
        FixedPoint.for_bound(1.0, 33)
    with pytest.raises(ValueError, match="bound"):
        FixedPoint.for_bound(0.0, 2)
    with pytest.raises(FixedPointOverflow, match=r"sum\[0\]"):
        fp.check_sum([INT32_MAX + 1])
