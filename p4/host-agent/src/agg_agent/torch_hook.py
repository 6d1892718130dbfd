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

The numbers are those gloo's all-reduce gives up to a stated rounding bound, with no
value clipped (`agg_agent.blockfloat`; docs/training.md, "Numerical contract"): each block
of 256 values gets its own power-of-two scale, agreed by every rank in one exchange before
the values go as int32; the error is rounding only, at most 7.5e-9 (2 ranks), 6.0e-8 (4)
or 3.1e-5 (32) of the block's largest magnitude. inf and NaN, when any rank has one, come
out as IEEE addition gives them, through a further exchange of per-element codes, so AMP's
GradScaler skips the step as with gloo. A bucket is then: agreement, values of the blocks
not zero on every rank, and codes if some rank has inf or NaN.

The sum is divided by the number of workers, as DDP's own all-reduce hook averages. Sequence
numbers wrap modulo 2^32; a rank or a PS that stops answering fails the bucket within
`deadline_s` (10 s), naming it.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from agg_agent import blockfloat as bf
from agg_agent import native
from agg_agent.blockfloat import ValueRefused, error_bound
from agg_agent.endpoints import DEADLINE_S, Worker
from agg_agent.fixedpoint import FixedPoint
from agg_agent.protocol import LANES, check_lanes

__all__ = ["AggregationHook", "ValueRefused", "error_bound"]

log = logging.getLogger(__name__)

ENV = {
    "job": "AGG_JOB",  # the job's number at the switches (the ONOS app's p4_job_id)
    "ps": "AGG_PS",  # host:port of the job's parameter server
    "window": "AGG_WINDOW",  # chunks in flight: at most the job's slot pool (16)
    "bind": "AGG_BIND",  # this worker's host:port, as the PS is told it (0.0.0.0:48879)
    "timeout_ms": "AGG_TIMEOUT_MS",  # retransmission timeout (200)
    "deadline_s": "AGG_DEADLINE_S",  # a bucket unfinished this long fails, naming who (10)
    "overlap": "AGG_OVERLAP",  # 1: all-reduce while backward goes on (default); 0: not
    # values a packet (32): larger only where the PS makes every sum, as its --lanes
    "lanes": "AGG_LANES",
}
# No longer read: buckets of any size need no AGG_SIZE, and nothing is clipped (AGG_BOUND).
RETIRED = ("AGG_SIZE", "AGG_BOUND")


def _address(text: str, name: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{name}: expected host:port, got {text!r}")
    return host, int(port)


@dataclass
class AggregationHook:
    """The hook (a callable `(state, bucket) -> Future[Tensor]`) and its worker endpoint."""

    worker: Worker
    workers: int
    clipped: int = 0  # kept for results written before: nothing is clipped any more
    buckets: int = 0  # buckets all-reduced so far
    nonfinite: int = 0  # buckets in which some rank had inf or NaN
    # per bucket, the largest top of its blocks (every |value| < 2^top; None: all zero):
    # error_bound(top, W) bounds every element of that bucket's sum
    tops: list[int | None] = field(default_factory=list)
    # the last bucket's per-block tops (blockfloat.NONE: zero on every rank)
    last_tops: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    last_n: int = 0
    # All-reduce in a thread of its own while backward goes on (the C data path releases
    # the GIL in its socket loop); False: in DDP's thread, the Future completed on return.
    overlap: bool = True
    _pool: ThreadPoolExecutor | None = field(default=None, repr=False)
    _queued: Future[None] | None = field(default=None, repr=False)  # the last bucket handed over
    values_sent: int = 0  # values that crossed the fabric (blocks zero everywhere do not)

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
        lanes: int = LANES,
    ) -> AggregationHook:
        """`size` and `bound` are no longer needed and are ignored (logged). `lanes`:
        values a packet, as the PS's (`agg-agent ps --lanes`); switches sum only 32, so more
        is for a job whose PS makes every sum (docs/protocols.md, "Chunk size")."""
        for name, v in (("size", size), ("bound", bound)):
            if v is not None:
                log.warning("AggregationHook: %s=%s is not used any more (buckets of any "
                            "size, scaled per bucket: nothing is clipped)", name, v)  # fmt: skip
        # The endpoint's own scale is unused: each bucket brings its own (`scale_for`).
        fixed = FixedPoint(1.0, world_size)
        w = Worker(
            job, rank, fixed, ps, window, timeout=timeout_s, max_retries=1 << 62, bind=bind,
            deadline_s=deadline_s, lanes=lanes,
        )  # fmt: skip
        log.info(
            "AggregationHook: rank %d of %d, job %d, PS %s:%d, %s data path, %d values a packet",
            rank, world_size, job, *ps, "C" if w.datapath == "native" else "Python", lanes,
        )  # fmt: skip
        return cls(w, world_size)

    @classmethod
    def from_env(cls, rank: int, world_size: int) -> AggregationHook:
        """From AGG_JOB, AGG_PS (required) and AGG_WINDOW, AGG_BIND, AGG_TIMEOUT_MS,
        AGG_DEADLINE_S, AGG_OVERLAP, AGG_LANES (optional); a missing or bad one is a
        ValueError naming it."""
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
            lanes = int(env.get(ENV["lanes"], str(LANES)))
        except ValueError as e:
            raise ValueError(f"AGG_*: not a number ({e})") from None
        check_lanes(lanes, ENV["lanes"])
        overlap = env.get(ENV["overlap"], "1")
        if overlap not in ("0", "1"):
            raise ValueError(f"AGG_OVERLAP: 0 or 1, got {overlap!r}")
        hook = cls.create(
            rank, world_size, job, _address(env[ENV["ps"]], ENV["ps"]), window=window,
            bind=_address(env.get(ENV["bind"], "0.0.0.0:48879"), ENV["bind"]),
            timeout_s=timeout_ms / 1000, deadline_s=deadline_s, lanes=lanes,
        )  # fmt: skip
        hook.overlap = overlap == "1"
        return hook

    def allreduce(self, x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """The sum over every rank of `x` (float64, any values), as IEEE addition of the
        ranks' values would give it, up to `last_bounds()` per element."""
        x = np.ravel(np.asarray(x, np.float64))
        # the C data path converts in C too (agg_agent.native, identical to blockfloat's)
        c = self.worker.datapath == "native"
        tops, nonfinite = self._agree(native.bf_agreement(x) if c else bf.agreement(x), x.size)
        return self._values(x, tops, nonfinite)

    def allreduce_mean32(self, x: npt.NDArray[np.float32]) -> None:
        """In place, float32 `x` becomes the mean over every rank, as `allreduce(x) /
        workers` rounded to float32 gives it, bit for bit: on the C data path, converted as
        packets go and come (`Worker.exchange_blocks`), with no copy of the bucket."""
        if x.dtype != np.float32 or x.ndim != 1 or not x.flags.c_contiguous:
            raise ValueError("x: a contiguous one-dimensional float32 array")
        c = self.worker.datapath == "native"
        tops, nonfinite = self._agree(native.bf_agreement32(x) if c else bf.agreement(x), x.size)
        live = int(np.count_nonzero(bf.sent(tops)))
        if c and live and not nonfinite:
            self.values_sent += live * bf.BLOCK
            self.worker.exchange_blocks(x, tops, x, end=True)
        else:  # inf or NaN somewhere, all zero, or the Python data path: the reference's way
            x[:] = self._values(x.astype(np.float64), tops, nonfinite) / self.workers

    def _agree(self, lanes: npt.NDArray[np.int32], n: int) -> tuple[npt.NDArray[np.int64], int]:
        """Exchange this rank's agreement lanes: the blocks' tops and the non-finite count."""
        _, summed = self.worker.exchange(lanes)
        tops, nonfinite = bf.agreed(summed, n)
        self.last_tops, self.last_n = tops, n
        live = tops[bf.sent(tops)]
        self.tops.append(int(live.max()) if live.size else None)
        return tops, nonfinite

    def _values(
        self, x: npt.NDArray[np.float64], tops: npt.NDArray[np.int64], nonfinite: int
    ) -> npt.NDArray[np.float64]:
        """The agreed bucket's sum: its values, then codes if some rank has inf or NaN."""
        c = self.worker.datapath == "native"
        live = bool(bf.sent(tops).any())
        total = np.zeros(x.size, np.float64)
        if live:
            q = (native.bf_encode if c else bf.encode)(x, tops, self.workers)
            self.values_sent += q.size
            _, sums = self.worker.exchange(q, end=not nonfinite)
            total = (native.bf_decode if c else bf.decode)(sums, tops, x.size, self.workers)
        if nonfinite:
            self.nonfinite += 1
            _, codes = self.worker.exchange(bf.codes(x), end=True)
            bf.apply_codes(total, codes)
        elif not live:  # every value zero: one chunk of zeros ends the step
            self.worker.exchange(np.zeros(1, np.int32), end=True)
        return total

    def last_bounds(self) -> npt.NDArray[np.float64]:
        """Per element of the last bucket's sum, its rounding bound (`blockfloat`)."""
        return bf.element_bounds(self.last_tops, self.last_n, self.workers)

    # `bucket` and the result are left unannotated: DDP's register_comm_hook refuses a
    # hook whose annotations are not exactly dist.GradBucket / Future[Tensor], and this
    # module imports torch only when a bucket arrives.
    def __call__(self, state, bucket):  # type: ignore[no-untyped-def]
        """All-reduce one gradient bucket through the fabric: a Future that completes when
        its sum arrives, so DDP goes on with backward meanwhile (`overlap`; buckets are
        all-reduced one after another, in the order DDP hands them over)."""
        import torch

        buf = bucket.buffer()
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        if buf.dtype == torch.float32 and buf.device.type == "cpu" and buf.is_contiguous():
            # float32 on the CPU, DDP's usual bucket: its mean written into it, as gloo's
            # all-reduce does (DDP leaves a bucket alone until its Future completes)
            values = buf.detach().view(-1).numpy()

            def mean() -> torch.Tensor:
                self.allreduce_mean32(values)
                return buf

        else:  # another dtype or device: through a float64 copy
            grad = buf.detach().reshape(-1).to(torch.float64).cpu().numpy()

            def mean() -> torch.Tensor:
                total = self.allreduce(grad) / self.workers
                return torch.from_numpy(total).to(buf.dtype).reshape(buf.shape)

        def reduce() -> None:
            try:
                result = mean()
                self.buckets += 1
                fut.set_result(result)
            except BaseException as e:  # the Future carries it to DDP
                fut.set_exception(e)

        last = getattr(bucket, "is_last", lambda: False)()
        if not self.overlap or (last and (self._queued is None or self._queued.done())):
            # The last bucket of backward, nothing queued before it: no backward is left to
            # hide it behind, so it goes in DDP's thread, without a thread's hand-over.
            reduce()
        else:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="agg-hook")
            self._queued = self._pool.submit(reduce)
        # DDP's C++ side casts a Future's value to a Tensor, and one carrying an exception
        # fails as "Unable to cast <message> to Tensor"; raised in a `then` callback, the
        # exception reaches the training script as itself (TimeoutError naming the rank).
        return fut.then(lambda f: f.value())

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self.worker.close()
