"""Float tensors to int32 fixed point with a scale every worker shares.

The switch adds int32 values with wrap-around (bmv2 registers are bit<32>), so the hosts
make overflow impossible instead: with `workers` contributions, each value must satisfy
|round(x * scale)| <= (2^31 - 1) // workers, and `to_fixed` raises when one does not.
The sum of `workers` rounded values differs from the float sum by at most
workers / (2 * scale) per element (`error_bound`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

INT32_MAX = 2**31 - 1


class FixedPointOverflow(ValueError):
    """A value too large for the shared scale; the message names the element."""


@dataclass(frozen=True, slots=True)
class FixedPoint:
    scale: float
    workers: int

    def __post_init__(self) -> None:
        if not self.scale > 0 or not np.isfinite(self.scale):
            raise ValueError(f"scale: {self.scale} must be a positive finite number")
        if not 1 <= self.workers <= 32:
            raise ValueError(f"workers: {self.workers} outside 1..32")

    @classmethod
    def for_bound(cls, bound: float, workers: int) -> FixedPoint:
        """The largest scale at which `workers` values of magnitude `bound` cannot overflow."""
        if not bound > 0 or not np.isfinite(bound):
            raise ValueError(f"bound: {bound} must be a positive finite number")
        if not 1 <= workers <= 32:
            raise ValueError(f"workers: {workers} outside 1..32")
        return cls((INT32_MAX // workers) / bound, workers)

    @property
    def limit(self) -> int:
        """Largest |value| one worker may send."""
        return INT32_MAX // self.workers

    @property
    def error_bound(self) -> float:
        """Largest |decoded sum - float sum| per element, from rounding alone."""
        return self.workers / (2 * self.scale)

    def to_fixed(self, x: npt.ArrayLike) -> npt.NDArray[np.int32]:
        a = np.asarray(x, dtype=np.float64)
        bad = ~np.isfinite(a)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise FixedPointOverflow(f"tensor[{i}]: {a.flat[i]} is not finite")
        q = np.rint(a * self.scale)
        over = np.abs(q) > self.limit
        if over.any():
            i = int(np.flatnonzero(over)[0])
            raise FixedPointOverflow(
                f"tensor[{i}]: {a.flat[i]} exceeds {self.limit / self.scale:.6g}, the bound "
                f"for {self.workers} workers at scale {self.scale:.6g}"
            )
        return q.astype(np.int32)

    def from_fixed(self, q: npt.ArrayLike) -> npt.NDArray[np.float64]:
        return np.asarray(q, dtype=np.float64) / self.scale

    def check_sum(self, total: npt.ArrayLike) -> None:
        """Raise if a sum of contributions left the int32 range (it would have wrapped)."""
        t = np.asarray(total, dtype=np.int64)
        over = np.abs(t) > INT32_MAX
        if over.any():
            i = int(np.flatnonzero(over)[0])
            raise FixedPointOverflow(f"sum[{i}]: {int(t.flat[i])} outside int32")
