"""PyTorch: a DistributedDataParallel communication hook that all-reduces each gradient
bucket through the aggregation protocol (switches sum it on the way, the parameter server
completes it and returns the sum to every worker, docs/protocols.md).

A training script adds two lines after wrapping its model in DDP:

    from agg_agent.torch_hook import AggregationHook
    ddp.register_comm_hook(None, AggregationHook.from_env(rank, world_size))

`torch.distributed` still starts the processes (any backend; gloo on CPU) and DDP still
broadcasts the initial parameters over it; only the gradients' all-reduce goes through the
fabric. The job's number at the switches, its slot pool and the parameter server come
from the environment (`from_env`, names below) or the constructor; `docs/training.md`
says how a job gets them from the optimizer service.

Each bucket is clipped to ±`bound` (gradient clipping by value: the fixed point's range,
counted in `clipped`), padded to the parameter server's `size` (one PS iteration per
bucket; a bucket larger than `size` is an error naming it), summed in fixed point and
divided by the number of workers, as DDP's own all-reduce hook averages.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from agg_agent.endpoints import Worker
from agg_agent.fixedpoint import FixedPoint

ENV = {
    "job": "AGG_JOB",  # the job's number at the switches (the ONOS app's p4_job_id)
    "ps": "AGG_PS",  # host:port of the job's parameter server
    "size": "AGG_SIZE",  # elements per PS iteration: at least the largest bucket
    "bound": "AGG_BOUND",  # fixed-point range: gradients are clipped to +-bound (1.0)
    "window": "AGG_WINDOW",  # chunks in flight: at most the job's slot pool (16)
    "bind": "AGG_BIND",  # this worker's host:port, as the PS is told it (0.0.0.0:48879)
    "timeout_ms": "AGG_TIMEOUT_MS",  # retransmission timeout (200)
}


def _address(text: str, name: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{name}: expected host:port, got {text!r}")
    return host, int(port)


@dataclass
class AggregationHook:
    """The hook (a callable `(state, bucket) -> Future[Tensor]`) and its worker endpoint."""

    worker: Worker
    size: int
    workers: int
    bound: float
    clipped: int = 0  # gradient elements clipped to +-bound so far
    buckets: int = 0  # buckets all-reduced so far

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
        size: int,
        bound: float = 1.0,
        window: int = 16,
        bind: tuple[str, int] = ("0.0.0.0", 48879),
        timeout_s: float = 0.2,
    ) -> AggregationHook:
        fixed = FixedPoint.for_bound(bound, world_size)
        w = Worker(job, rank, fixed, ps, window, timeout=timeout_s, max_retries=1000, bind=bind)
        return cls(w, size, world_size, bound)

    @classmethod
    def from_env(cls, rank: int, world_size: int) -> AggregationHook:
        """From AGG_JOB, AGG_PS, AGG_SIZE (required) and AGG_BOUND, AGG_WINDOW, AGG_BIND,
        AGG_TIMEOUT_MS (optional); a missing or bad one is a ValueError naming it."""
        env = os.environ
        missing = [ENV[k] for k in ("job", "ps", "size") if not env.get(ENV[k])]
        if missing:
            raise ValueError(f"{', '.join(missing)}: not set (see agg_agent.torch_hook)")
        try:
            job, size = int(env[ENV["job"]]), int(env[ENV["size"]])
            bound = float(env.get(ENV["bound"], "1.0"))
            window = int(env.get(ENV["window"], "16"))
            timeout_ms = float(env.get(ENV["timeout_ms"], "200"))
        except ValueError as e:
            raise ValueError(f"AGG_*: not a number ({e})") from None
        return cls.create(
            rank, world_size, job, _address(env[ENV["ps"]], ENV["ps"]), size, bound, window,
            _address(env.get(ENV["bind"], "0.0.0.0:48879"), ENV["bind"]), timeout_ms / 1000,
        )  # fmt: skip

    # `bucket` and the result are left unannotated: DDP's register_comm_hook refuses a
    # hook whose annotations are not exactly dist.GradBucket / Future[Tensor], and this
    # module imports torch only when a bucket arrives.
    def __call__(self, state, bucket):  # type: ignore[no-untyped-def]
        """All-reduce one gradient bucket through the fabric; a completed Future."""
        import torch

        buf = bucket.buffer()
        n = buf.numel()
        if n > self.size:
            raise ValueError(
                f"bucket {bucket.index()} has {n} elements, more than the parameter server's "
                f"size {self.size} (AGG_SIZE)"
            )
        grad = np.zeros(self.size, np.float64)
        grad[:n] = buf.detach().reshape(-1).to(torch.float64).cpu().numpy()
        over = np.abs(grad) > self.bound
        if over.any():
            self.clipped += int(over.sum())
            np.clip(grad, -self.bound, self.bound, out=grad)
        total = self.worker.allreduce(grad)[:n] / self.workers
        self.buckets += 1
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_result(torch.from_numpy(total).to(buf.dtype).reshape(buf.shape))
        return fut

    def close(self) -> None:
        self.worker.close()
