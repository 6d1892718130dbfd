"""Block floating point over a switch that only sums int32: how a bucket of float values
crosses the fabric without clipping any of them (docs/training.md, "Numerical contract").

A bucket is cut into blocks of `BLOCK` values, and every block gets its own power-of-two
scale, agreed by all ranks before any value is sent, as SwitchML's block floating point does
(NSDI'21, 256 values a block). SwitchML keeps each slot's largest exponent in the switch; here
the ranks agree through the same summing slots that carry the values, so the switch needs
no stage, register or ALU beyond the sum it already does (docs/protocols.md says why).

1. **Agreement** (`agreement`): per block, `BANDS` lanes; a rank whose block's largest finite
   magnitude has exponent e (|x| < 2^e, `np.frexp`) puts 2^(e mod BAND) in the lane of e's
   band and 0 elsewhere. Summed over ranks, the block's highest non-zero lane names the band
   of the largest exponent e*, and its sum S (2^(e*-base) <= S <= W * 2^(e*-base)) gives a
   top T = base + floor(log2 S) with e* <= T <= e* + floor(log2 W). Two more lanes carry a
   bucket's count of non-finite values and of ranks refusing a value (beyond 2^EXP_MAX).
2. **Values** (`encode`): a block goes as int32 at scale 2^(30 - ceil(log2 W) - T): no value
   and no sum of W of them leaves int32; a power of two, so scaling and decoding are exact.
   A block that is zero on every rank is not sent: its sum is exactly zero.
3. **Bound** (`error_bound`): rounding only, W / (2 * scale) per element of the sum, which is
   at most W * 2^(ceil(log2 W) + floor(log2 W) - 30) of the block's largest magnitude:
   7.5e-9 at 2 ranks, 6.0e-8 at 4, 3.1e-5 at 32 (`relative_bound`). A block whose largest
   magnitude is under 2^(EXP_MIN - 1) (3.4e-49, far below float32's smallest subnormal) is
   scaled as if it were 2^(EXP_MIN - 1): the bound is relative to that floor.
4. **inf and NaN** (`codes`, `apply_codes`): per element a code of counts (+inf 1, -inf 2^8,
   NaN 2^16) summed across ranks; NaN where any rank has NaN or both infinities meet,
   else the infinity seen: what IEEE addition gives.

This is the readable reference; the same functions over numpy arrays are what the hook runs.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

INT32_MAX = 2**31 - 1
BLOCK = 256  # values a block: each block has its own scale (SwitchML's block size)
EXP_MIN, EXP_MAX = -160, 128  # exponents told apart (|x| < 2^e); below EXP_MIN: as EXP_MIN
BAND = 26  # exponents a band: W * 2^(BAND - 1) <= 2^30 for W <= 32, so lanes never wrap
BANDS = -(-(EXP_MAX - EXP_MIN + 1) // BAND)  # 12 lanes a block
HEAD = 2  # lanes before the blocks': non-finite values, ranks refusing
NONFINITE_LANE, REFUSED_LANE = 0, 1
MAX_WORKERS = 32
POS_INF, NEG_INF, NAN = 1, 1 << 8, 1 << 16
NONE = np.iinfo(np.int64).min  # an agreed top: the block is zero on every rank


class ValueRefused(ValueError):
    """A finite value of magnitude 2^EXP_MAX or more (float64 past float32's range) on some
    rank: every rank raises it for the same bucket."""


def blocks(n: int) -> int:
    """Blocks in a bucket of `n` values."""
    return -(-n // BLOCK)


def agreement_lanes(n: int) -> int:
    """Lanes of a bucket's agreement: `HEAD`, then `BANDS` a block."""
    return HEAD + BANDS * blocks(n)


def _padded(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """`x` with non-finite values as 0, padded with zeros to whole blocks, one row a block."""
    out = np.zeros(blocks(x.size) * BLOCK, np.float64)
    out[: x.size] = np.where(np.isfinite(x), x, 0.0)
    return out.reshape(-1, BLOCK)


def agreement(x: npt.NDArray[np.float64]) -> npt.NDArray[np.int32]:
    """This rank's lanes of the agreement on `x`'s block scales (see the module's 1.)."""
    out = np.zeros(agreement_lanes(x.size), np.int64)
    # at most 32 ranks add theirs: each count kept under int32's 32nd part
    out[NONFINITE_LANE] = min(int(x.size - np.count_nonzero(np.isfinite(x))), INT32_MAX // 32)
    tops = np.abs(_padded(x)).max(axis=1)
    exps = np.frexp(tops)[1].astype(np.int64)  # tops < 2^exps; frexp(0) gives 0
    if np.any(exps[tops > 0] > EXP_MAX):
        out[REFUSED_LANE] = 1
        return out.astype(np.int32)
    (nonzero,) = np.nonzero(tops > 0)
    k = np.maximum(exps[nonzero], EXP_MIN) - EXP_MIN
    band, offset = np.divmod(k, BAND)
    out[HEAD + nonzero * BANDS + band] = np.left_shift(1, offset)
    return out.astype(np.int32)


def agreed(total: npt.NDArray[np.integer], n: int) -> tuple[npt.NDArray[np.int64], int]:
    """From the summed agreement of a bucket of `n` values: per block its top T (every
    |x| < 2^T on every rank; `NONE` where the block is zero on every rank), and the number of
    values not finite on all ranks together. `ValueRefused` when some rank refused."""
    total = np.asarray(total, np.int64)
    if total[REFUSED_LANE]:
        raise ValueRefused(
            f"{int(total[REFUSED_LANE])} rank(s) have a finite gradient of magnitude 2^"
            f"{EXP_MAX} or more (beyond float32's range): not all-reduced"
        )
    lanes = total[HEAD : HEAD + BANDS * blocks(n)].reshape(-1, BANDS)
    if np.any(lanes < 0):
        raise ValueError("agreement: a negative lane (more than 32 ranks, or not an agreement)")
    live = lanes > 0
    band = BANDS - 1 - np.argmax(live[:, ::-1], axis=1)  # the highest non-zero lane
    s = lanes[np.arange(lanes.shape[0]), band]
    tops = np.full(lanes.shape[0], NONE, np.int64)
    any_ = live.any(axis=1)
    # floor(log2 s), exact for s < 2^53: frexp(s) = (m, e) with s < 2^e, 2^(e-1) <= s
    tops[any_] = EXP_MIN + band[any_] * BAND + (np.frexp(s[any_].astype(np.float64))[1] - 1)
    return tops, int(total[NONFINITE_LANE])


def headroom(workers: int) -> int:
    """Bits kept free for the sum of `workers` values: ceil(log2 workers)."""
    if not 1 <= workers <= MAX_WORKERS:
        raise ValueError(f"workers: {workers} outside 1..{MAX_WORKERS}")
    return (workers - 1).bit_length()


def scale_for(top: int, workers: int) -> float:
    """Every |x| < 2^top: at 2^(30 - ceil(log2 workers) - top) no value, nor a sum of
    `workers`, leaves int32 (each |q| <= 2^30 / workers). A power of two: scaling and
    decoding are exact, so a sum that fits the step (1.0 + 1.0, say) comes out exact."""
    return 2.0 ** (30 - headroom(workers) - top)


def error_bound(top: int | None, workers: int) -> float:
    """Largest |decoded sum - exact sum| per element of a block agreed at `top`."""
    if top is None or top == NONE:
        return 0.0
    return workers / (2 * scale_for(top, workers))


def relative_bound(workers: int) -> float:
    """`error_bound` relative to the block's largest magnitude, at most (module's 3.)."""
    return workers * 2.0 ** (headroom(workers) + (workers.bit_length() - 1) - 30)


def sent(tops: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """The blocks whose values cross the fabric: those not zero on every rank."""
    return tops != NONE


def encode(
    x: npt.NDArray[np.float64], tops: npt.NDArray[np.int64], workers: int
) -> npt.NDArray[np.int32]:
    """The int32 lanes of `x`'s sent blocks, one after another, each at its own scale."""
    keep = sent(tops)
    scales = 2.0 ** (30 - headroom(workers) - tops[keep].astype(np.float64))
    return np.rint(_padded(x)[keep] * scales[:, None]).astype(np.int32).reshape(-1)


def decode(
    sums: npt.NDArray[np.integer], tops: npt.NDArray[np.int64], n: int, workers: int
) -> npt.NDArray[np.float64]:
    """The bucket's sum from the summed lanes of its sent blocks (zero where none were)."""
    keep = sent(tops)
    scales = 2.0 ** (30 - headroom(workers) - tops[keep].astype(np.float64))
    out = np.zeros((tops.size, BLOCK), np.float64)
    out[keep] = np.asarray(sums, np.float64).reshape(-1, BLOCK) / scales[:, None]
    return out.reshape(-1)[:n]


def element_bounds(tops: npt.NDArray[np.int64], n: int, workers: int) -> npt.NDArray[np.float64]:
    """Per element of the sum, its rounding bound (`error_bound` of its block)."""
    keep = sent(tops)
    per = np.zeros(tops.size, np.float64)
    per[keep] = workers / 2 * 2.0 ** (tops[keep].astype(np.float64) + headroom(workers) - 30)
    return np.repeat(per, BLOCK)[:n]


def codes(x: npt.NDArray[np.float64]) -> npt.NDArray[np.int32]:
    """Per element, this rank's count code: +inf 1, -inf 2^8, NaN 2^16, finite 0."""
    c = np.zeros(x.size, np.int32)
    c[np.isposinf(x)] = POS_INF
    c[np.isneginf(x)] = NEG_INF
    c[np.isnan(x)] = NAN
    return c


def apply_codes(total: npt.NDArray[np.float64], summed: npt.NDArray[np.integer]) -> None:
    """Where any rank had inf or NaN, the element becomes what IEEE addition gives."""
    summed = np.asarray(summed, np.int64)
    pos = (summed & 0xFF) > 0
    neg = ((summed >> 8) & 0xFF) > 0
    nan = ((summed >> 16) & 0xFF) > 0
    total[pos] = np.inf
    total[neg] = -np.inf
    total[nan | (pos & neg)] = np.nan
