"""A real model trained data-parallel: an MLP on scikit-learn's handwritten digits (1,797
8x8 images, shipped inside the wheel: nothing is downloaded), one process per worker
under `torch.distributed` (gloo) and DistributedDataParallel, the gradients all-reduced
either by gloo (`--allreduce gloo`) or through the aggregation protocol
(`--allreduce agg`: `AggregationHook`, the two lines a user adds).

Every worker starts from the same parameters (seeded; DDP broadcasts rank 0's anyway) and
takes its share of each global batch in a fixed order, so two runs that differ only in
the all-reduce take the same steps: their parameters differ only by rounding (float32 in
gloo's sum, fixed point in ours), which `compare` measures.

    agg-agent train --rank R --world N --master HOST:PORT --allreduce agg|gloo \
        [--ps HOST:PORT --job J --bind HOST:PORT] [--epochs 30] [--out result.json]
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

HIDDEN = 64
SEED = 0


def dataset() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Digits, scaled to [0, 1], split 80/20 with a fixed seed (stratified)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.2, random_state=SEED, stratify=y)
    return xtr, ytr.astype(np.int64), xte, yte.astype(np.int64)


def model() -> Any:
    import torch

    torch.manual_seed(SEED)
    return torch.nn.Sequential(
        torch.nn.Linear(64, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 10)
    )


def interface_towards(host: str) -> str | None:
    """The network interface this machine reaches `host` through (the one holding that
    address, if it is ours): gloo otherwise advertises the address the hostname resolves
    to, 127.0.0.1 in a network namespace, and its peers cannot connect."""
    try:
        route = subprocess.run(["ip", "-o", "-4", "route", "get", host], capture_output=True,
                               text=True, timeout=10).stdout.split()  # fmt: skip
        dev = route[route.index("dev") + 1] if "dev" in route else None
        if dev in (None, "lo"):
            addrs = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True,
                                   text=True, timeout=10).stdout.splitlines()  # fmt: skip
            dev = next((ln.split()[1] for ln in addrs if f" {host}/" in ln), dev)
        return dev if dev != "lo" else None
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def parameter_count() -> int:
    return sum(p.numel() for p in model().parameters())


@dataclass
class Result:
    allreduce: str
    world: int
    epochs: int
    steps: int
    seconds: float  # training wall time (evaluations excluded)
    accuracy: list[tuple[int, float, float]] = field(default_factory=list)  # epoch, s, acc
    parameters: list[float] = field(default_factory=list)
    clipped: int = 0
    # Per step: the largest |gradient| applied (after the all-reduce, unscaled), and with a
    # GradScaler its scale after the step (it halves on a step with inf or NaN, skipped).
    grad_max: list[float] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)
    nonfinite: int = 0  # buckets the hook saw inf or NaN in
    tops: list[int | None] = field(default_factory=list)  # the hook's agreed exponents
    values_sent: int = 0  # values the hook sent (blocks zero on every rank are not)
    # With `check_gloo`: per bucket, the hook's all-reduced (averaged) gradient against
    # gloo's all-reduce of the same local gradients: the largest |hook - gloo| as a share of
    # the tolerance (`GlooCheck`; <= 1 everywhere, or `check_over` counts the elements),
    # and the largest |hook - gloo| relative to its block's largest |gradient|.
    check_ratio: list[float] = field(default_factory=list)
    check_relative: list[float] = field(default_factory=list)
    check_over: int = 0

    def time_to(self, target: float) -> float | None:
        return next((t for _e, t, a in self.accuracy if a >= target), None)


class GlooCheck:
    """A comm hook around the aggregation hook that also all-reduces every bucket with gloo
    (the same local gradients) and compares, element by element, on every rank. Tolerance:
    the hook's rounding bound (per block, `AggregationHook.last_bounds`) / W, plus the
    roundings of the buckets' type (gloo's sum of W values, up to (W-1) * u * sum|x| / W
    with u half its ulp, and the cast of either result, half an ulp each); inf and NaN
    must be where gloo has them."""

    def __init__(self, hook: Any, world: int, res: Result) -> None:
        self.hook, self.world, self.res = hook, world, res
        self.__name__ = self.__qualname__ = "aggregation_hook_checked_against_gloo"

    def __call__(self, state, bucket):  # type: ignore[no-untyped-def]
        import torch
        import torch.distributed as dist

        local = bucket.buffer().detach().clone()
        fut = self.hook(state, bucket)
        got = fut.wait().detach().reshape(-1).to(torch.float64).numpy()
        ref_t, mag_t = local.clone(), local.abs()
        dist.all_reduce(ref_t)
        dist.all_reduce(mag_t)
        ref = (ref_t / self.world).reshape(-1).to(torch.float64).numpy()
        mag = mag_t.reshape(-1).to(torch.float64).numpy()
        # half an ulp, relative, of the buckets' type: 2^-24 float32, 2^-8 bfloat16
        w, eps = self.world, float(torch.finfo(local.dtype).eps) / 2
        both = np.isfinite(got) & np.isfinite(ref)
        same_special = all(
            np.array_equal(f(got), f(ref)) for f in (np.isnan, np.isposinf, np.isneginf)
        )
        diff = np.abs(got - ref)[both]
        tol = (
            self.hook.last_bounds()[both] / w
            + eps * (np.abs(got[both]) + np.abs(ref[both]))
            + (w - 1) * eps * mag[both] / w
            + 1e-300
        )
        self.res.check_over += int(np.count_nonzero(diff > tol)) + (0 if same_special else 1)
        self.res.check_ratio.append(float(np.max(diff / tol, initial=0.0)))
        x = local.reshape(-1).to(torch.float64).numpy()
        biggest = np.where(np.isfinite(x), np.abs(x), 0.0)
        t = torch.from_numpy(biggest)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        block = _block_max(t.numpy())[both]
        rel = diff / np.where(block > 0, block / w, 1.0)
        self.res.check_relative.append(float(np.max(rel, initial=0.0)))
        return fut


def _block_max(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Per element, the largest value of its block (`blockfloat.BLOCK` values a block)."""
    from agg_agent.blockfloat import BLOCK, blocks

    pad = np.zeros(blocks(x.size) * BLOCK)
    pad[: x.size] = x
    return np.repeat(pad.reshape(-1, BLOCK).max(axis=1), BLOCK)[: x.size]


def train(
    rank: int,
    world: int,
    master: tuple[str, int],
    allreduce: str,
    epochs: int = 30,
    batch: int = 32,
    lr: float = 0.1,
    max_steps: int | None = None,
    hook_args: dict[str, Any] | None = None,
    loss_scale: float = 1.0,
    grad_scaler: float | None = None,
    inf_at: int | None = None,
    bucket_cap_mb: float | None = None,
    check_gloo: bool = False,
    dtype: str = "float32",
) -> Result:
    """Train; every rank returns the same Result (rank 0's evaluation).

    For the comparisons with gloo (docs/training.md): `loss_scale` multiplies the loss
    (large gradients; give lr / loss_scale for the same updates); `grad_scaler` trains
    with AMP's GradScaler at that initial scale; `inf_at` makes rank 1's loss infinite at
    that step (its gradients inf and NaN); `bucket_cap_mb` sets DDP's bucket size (small
    values give several buckets of unequal sizes); `check_gloo` compares every bucket's
    all-reduce with gloo's (`GlooCheck`); `dtype` ("float32", "bfloat16", "float16") is the
    model's, so its gradients (the buckets) are of that type."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    if "GLOO_SOCKET_IFNAME" not in os.environ and not master[0].startswith("127."):
        ifname = interface_towards(master[0])
        if ifname:
            os.environ["GLOO_SOCKET_IFNAME"] = ifname
    dist.init_process_group(
        "gloo", init_method=f"tcp://{master[0]}:{master[1]}", rank=rank, world_size=world
    )
    hook = None
    try:
        if dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype: 'float32', 'bfloat16' or 'float16', got {dtype!r}")
        torch_dtype = getattr(torch, dtype)
        net = model().to(torch_dtype)
        ddp = DDP(net) if bucket_cap_mb is None else DDP(net, bucket_cap_mb=bucket_cap_mb)
        scaler = torch.amp.GradScaler("cpu", init_scale=grad_scaler) if grad_scaler else None
        res = Result(allreduce, world, 0, 0, 0.0)
        if allreduce == "agg":
            from agg_agent.torch_hook import AggregationHook

            hook = AggregationHook.create(rank, world, **(hook_args or {}))
            ddp.register_comm_hook(None, GlooCheck(hook, world, res) if check_gloo else hook)
        elif allreduce != "gloo":
            raise ValueError(f"allreduce: 'agg' or 'gloo', got {allreduce!r}")
        xtr, ytr, xte, yte = dataset()
        xtr_t, ytr_t = torch.from_numpy(xtr).to(torch_dtype), torch.from_numpy(ytr)
        xte_t, yte_t = torch.from_numpy(xte).to(torch_dtype), torch.from_numpy(yte)
        opt = torch.optim.SGD(ddp.parameters(), lr=lr)
        loss_fn = torch.nn.CrossEntropyLoss()
        per_step = batch * world
        order = np.random.default_rng(SEED)
        elapsed = 0.0
        for epoch in range(epochs):
            perm = order.permutation(len(xtr))
            t0 = time.perf_counter()
            for start in range(0, len(perm) - per_step + 1, per_step):
                idx = perm[start + rank * batch : start + (rank + 1) * batch]
                opt.zero_grad()
                loss = loss_fn(ddp(xtr_t[idx]), ytr_t[idx]) * loss_scale
                if inf_at is not None and res.steps == inf_at and rank == 1:
                    loss = loss * float("inf")
                if scaler is None:
                    loss.backward()
                    opt.step()
                else:
                    scaler.scale(loss).backward()
                    scaler.step(opt)
                    scaler.update()
                    res.scales.append(float(scaler.get_scale()))
                res.grad_max.append(
                    max(float(p.grad.abs().max()) for p in net.parameters() if p.grad is not None)
                )
                res.steps += 1
                if max_steps is not None and res.steps >= max_steps:
                    break
            elapsed += time.perf_counter() - t0
            res.epochs = epoch + 1
            with torch.no_grad():
                acc = float((net(xte_t).argmax(1) == yte_t).float().mean())
            res.accuracy.append((epoch + 1, elapsed, acc))
            if max_steps is not None and res.steps >= max_steps:
                break
        res.seconds = elapsed
        res.parameters = (
            torch.cat([p.detach().reshape(-1) for p in net.parameters()]).float().tolist()
        )
        res.clipped = hook.clipped if hook else 0
        res.nonfinite = hook.nonfinite if hook else 0
        res.tops = list(hook.tops) if hook else []
        res.values_sent = hook.values_sent if hook else 0
        dist.barrier()
        return res
    finally:
        if hook is not None:
            hook.close()
        dist.destroy_process_group()


def save(res: Result, path: Path) -> None:
    path.write_text(json.dumps(asdict(res)))


def load(path: Path) -> Result:
    d = json.loads(path.read_text())
    d["accuracy"] = [tuple(x) for x in d["accuracy"]]
    return Result(**d)


def compare(a: Result, b: Result) -> float:
    """Largest absolute difference between two runs' parameters."""
    return float(np.max(np.abs(np.array(a.parameters) - np.array(b.parameters))))
