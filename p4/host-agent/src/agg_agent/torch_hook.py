"""PyTorch: a DistributedDataParallel communication hook that all-reduces each gradient
bucket through the aggregation protocol (switches sum it on the way, the parameter server
completes it and returns the sum to every worker, docs/protocols.md).

A training script adds two lines after wrapping its model in DDP:

    from agg_agent.torch_hook import AggregationHook
    ddp.register_comm_hook(None, AggregationHook.from_env(rank, world_size))

`torch.distributed` still starts the processes (any backend; gloo on CPU) and DDP still
broadcasts the initial parameters over it; only the gradients' all-reduce goes through the
fabric. The job's number at the switches, its slot pool and the parameter server
(`agg-agent ps --size 0`: buckets of any size) come from the environment (`from_env`,
names below) or the constructor; `docs/training.md` says how a job gets them from the
optimizer service.

The numbers are those gloo's all-reduce gives (docs/training.md, "Numerical contract"):

1. **Scale, agreed per bucket.** Each rank sends the exponent of its bucket's largest
   finite magnitude as a count in one of 289 eight-bit counters (exponents -160..128,
   three chunks) and how many of its values are not finite; the switches sum the counts,
   so every rank learns the largest exponent E of any rank. No value is ever clipped.
2. **Values** go as int32 at scale 2^(30 - ceil(log2 W) - E): every |x| < 2^E, so no
   rank's value and no sum of W of them overflows; a power of two, so scaling and decoding
   add no error. The sum is exact in integers; the error is rounding only, at most
   W / (2 * scale) per element, under W * 2^(ceil(log2 W) - 30) of the bucket's largest
   magnitude (3.7e-9 at 2 ranks, 1.5e-8 at 4, 9.5e-7 at 32).
3. **inf and NaN**: when any rank has one, a third exchange sums per element a code of
   counts (+inf: 1, -inf: 2^8, NaN: 2^16); an element is NaN if any rank's is NaN or
   both infinities meet, else the infinity seen: IEEE addition, as gloo sums. AMP's
   GradScaler then sees the overflow and skips the step, as with gloo.

The sum is divided by the number of workers, as DDP's own all-reduce hook averages. Sequence
numbers wrap modulo 2^32; a rank or a PS that stops answering fails the bucket within
`deadline_s` (10 s), naming it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from agg_agent.endpoints import DEADLINE_S, Worker
from agg_agent.fixedpoint import INT32_MAX, FixedPoint

log = logging.getLogger(__name__)

ENV = {
    "job": "AGG_JOB",  # the job's number at the switches (the ONOS app's p4_job_id)
    "ps": "AGG_PS",  # host:port of the job's parameter server
    "window": "AGG_WINDOW",  # chunks in flight: at most the job's slot pool (16)
    "bind": "AGG_BIND",  # this worker's host:port, as the PS is told it (0.0.0.0:48879)
    "timeout_ms": "AGG_TIMEOUT_MS",  # retransmission timeout (200)
    "deadline_s": "AGG_DEADLINE_S",  # a bucket unfinished this long fails, naming who (10)
}
# No longer read: buckets of any size need no AGG_SIZE, and nothing is clipped (AGG_BOUND).
RETIRED = ("AGG_SIZE", "AGG_BOUND")

EXP_MIN, EXP_MAX = -160, 128  # exponents counted (frexp's: |x| < 2^e); below: as EXP_MIN
COUNTERS_PER_LANE = 4  # 8-bit counters: at most 32 ranks count one each
META_LANES = 96  # three chunks: 73 lanes of counters, then the count of non-finite values
NONFINITE_LANE = 80
REFUSED_LANE = 81  # ranks with a magnitude beyond 2^EXP_MAX: every rank then fails alike
POS_INF, NEG_INF, NAN = 1, 1 << 8, 1 << 16


def _address(text: str, name: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{name}: expected host:port, got {text!r}")
    return host, int(port)


def meta(x: npt.NDArray[np.float64]) -> npt.NDArray[np.int32]:
    """This rank's contribution to the bucket's agreement: a count at the exponent of its
    largest finite magnitude (none if all are zero), and how many values are not finite."""
    out = np.zeros(META_LANES, np.int64)
    finite = np.isfinite(x)
    # at most 32 ranks add theirs: each count kept under int32's 32nd part
    out[NONFINITE_LANE] = min(int(x.size - np.count_nonzero(finite)), INT32_MAX // 32)
    top = float(np.max(np.abs(x[finite]), initial=0.0))
    if top > 0.0:
        e = int(np.frexp(top)[1])  # top < 2^e
        if e > EXP_MAX:
            out[REFUSED_LANE] = 1
            return out.astype(np.int32)
        k = max(e, EXP_MIN) - EXP_MIN
        out[k // COUNTERS_PER_LANE] += 1 << (8 * (k % COUNTERS_PER_LANE))
    return out.astype(np.int32)


class ValueRefused(ValueError):
    """A finite gradient beyond 2^EXP_MAX (float64 past float32's range) on some rank:
    every rank raises it for the same bucket."""


def agreed(total: npt.NDArray[np.int64]) -> tuple[int | None, int]:
    """From the summed `meta`: the largest exponent of any rank (None: every value zero)
    and the number of values not finite on all ranks together."""
    if total[REFUSED_LANE]:
        raise ValueRefused(
            f"{int(total[REFUSED_LANE])} rank(s) have a finite gradient of magnitude 2^"
            f"{EXP_MAX} or more (beyond float32's range): not all-reduced"
        )
    top = None
    for k in range((EXP_MAX - EXP_MIN) + 1):
        lane, shift = divmod(k, COUNTERS_PER_LANE)
        if (int(total[lane]) >> (8 * shift)) & 0xFF:
            top = EXP_MIN + k
    return top, int(total[NONFINITE_LANE])


def codes(x: npt.NDArray[np.float64]) -> npt.NDArray[np.int32]:
    """Per element, this rank's count code: +inf 1, -inf 2^8, NaN 2^16, finite 0."""
    c = np.zeros(x.size, np.int32)
    c[np.isposinf(x)] = POS_INF
    c[np.isneginf(x)] = NEG_INF
    c[np.isnan(x)] = NAN
    return c


def apply_codes(total: npt.NDArray[np.float64], summed: npt.NDArray[np.int64]) -> None:
    """Where any rank had inf or NaN, the element becomes what IEEE addition gives."""
    pos = (summed & 0xFF) > 0
    neg = ((summed >> 8) & 0xFF) > 0
    nan = ((summed >> 16) & 0xFF) > 0
    total[pos] = np.inf
    total[neg] = -np.inf
    total[nan | (pos & neg)] = np.nan


def error_bound(top: int | None, workers: int) -> float:
    """Largest |decoded sum - exact sum| per element of a bucket agreed at `top`."""
    return 0.0 if top is None else workers / (2 * scale_for(top, workers))


def scale_for(top: int, workers: int) -> float:
    """Every |x| < 2^top: at 2^(30 - ceil(log2 workers) - top) no value, nor a sum of
    `workers`, leaves int32 (each |q| <= 2^30 / workers). A power of two: scaling and
    decoding are exact, so a sum that fits the step (1.0 + 1.0, say) comes out exact."""
    return 2.0 ** (30 - (workers - 1).bit_length() - top)


@dataclass
class AggregationHook:
    """The hook (a callable `(state, bucket) -> Future[Tensor]`) and its worker endpoint."""

    worker: Worker
    workers: int
    clipped: int = 0  # kept for results written before: nothing is clipped any more
    buckets: int = 0  # buckets all-reduced so far
    nonfinite: int = 0  # buckets in which some rank had inf or NaN
    # per bucket, the agreed exponent E (every |value| < 2^E; None: all zero): the rounding
    # bound of that bucket's sum is W / (2 * scale_for(E, W))
    tops: list[int | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        # DDP logs a hook by its function name
        self.__name__ = self.__qualname__ = "aggregation_hook"

    @classmethod
    def create(
        cls,
        rank: int,
        world_size: int,
        job: int,
        ps: tuple[str, int],
        size: int | None = None,
        bound: float | None = None,
        window: int = 16,
        bind: tuple[str, int] = ("0.0.0.0", 48879),
        timeout_s: float = 0.2,
        deadline_s: float = DEADLINE_S,
    ) -> AggregationHook:
        """`size` and `bound` are no longer needed and are ignored (logged)."""
        for name, v in (("size", size), ("bound", bound)):
            if v is not None:
                log.warning("AggregationHook: %s=%s is not used any more (buckets of any "
                            "size, scaled per bucket: nothing is clipped)", name, v)  # fmt: skip
        # The endpoint's own scale is unused: each bucket brings its own (`scale_for`).
        fixed = FixedPoint(1.0, world_size)
        w = Worker(
            job, rank, fixed, ps, window, timeout=timeout_s, max_retries=1 << 62, bind=bind,
            deadline_s=deadline_s,
        )  # fmt: skip
        log.info(
            "AggregationHook: rank %d of %d, job %d, PS %s:%d, Python data path",
            rank, world_size, job, *ps,
        )  # fmt: skip
        return cls(w, world_size)

    @classmethod
    def from_env(cls, rank: int, world_size: int) -> AggregationHook:
        """From AGG_JOB, AGG_PS (required) and AGG_WINDOW, AGG_BIND, AGG_TIMEOUT_MS,
        AGG_DEADLINE_S (optional); a missing or bad one is a ValueError naming it."""
        env = os.environ
        missing = [ENV[k] for k in ("job", "ps") if not env.get(ENV[k])]
        if missing:
            raise ValueError(f"{', '.join(missing)}: not set (see agg_agent.torch_hook)")
        for name in RETIRED:
            if env.get(name):
                log.warning("%s is not used any more (see agg_agent.torch_hook)", name)
        try:
            job = int(env[ENV["job"]])
            window = int(env.get(ENV["window"], "16"))
            timeout_ms = float(env.get(ENV["timeout_ms"], "200"))
            deadline_s = float(env.get(ENV["deadline_s"], str(DEADLINE_S)))
        except ValueError as e:
            raise ValueError(f"AGG_*: not a number ({e})") from None
        return cls.create(
            rank, world_size, job, _address(env[ENV["ps"]], ENV["ps"]), window=window,
            bind=_address(env.get(ENV["bind"], "0.0.0.0:48879"), ENV["bind"]),
            timeout_s=timeout_ms / 1000, deadline_s=deadline_s,
        )  # fmt: skip

    def allreduce(self, x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """The sum over every rank of `x` (float64, any values), as IEEE addition of the
        ranks' values would give it up to the rounding bound above."""
        _, summed_meta = self.worker.exchange(meta(x))
        top, nonfinite = agreed(summed_meta)
        self.tops.append(top)
        total = np.zeros(x.size, np.float64)
        if top is not None:
            scale = scale_for(top, self.workers)
            q = np.rint(np.where(np.isfinite(x), x, 0.0) * scale).astype(np.int32)
            _, sums = self.worker.exchange(q, end=not nonfinite)
            total = sums.astype(np.float64) / scale
        if nonfinite:
            self.nonfinite += 1
            _, summed = self.worker.exchange(codes(x), end=True)
            apply_codes(total, summed)
        elif top is None:  # every value zero: one chunk of zeros ends the step
            self.worker.exchange(np.zeros(1, np.int32), end=True)
        return total

    # `bucket` and the result are left unannotated: DDP's register_comm_hook refuses a
    # hook whose annotations are not exactly dist.GradBucket / Future[Tensor], and this
    # module imports torch only when a bucket arrives.
    def __call__(self, state, bucket):  # type: ignore[no-untyped-def]
        """All-reduce one gradient bucket through the fabric; a completed Future."""
        import torch

        buf = bucket.buffer()
        grad = buf.detach().reshape(-1).to(torch.float64).cpu().numpy()
        total = self.allreduce(grad) / self.workers
        self.buckets += 1
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_result(torch.from_numpy(total).to(buf.dtype).reshape(buf.shape))
        return fut

    def close(self) -> None:
        self.worker.close()
