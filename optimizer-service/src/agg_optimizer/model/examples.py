"""Random example instances: a fat-tree with uneven INT telemetry and training jobs."""

from __future__ import annotations

import numpy as np

from agg_optimizer.model.documents import (
    DEFAULT_POOL_SLOTS,
    Instance,
    Job,
    LinkTelemetry,
    SwitchTelemetry,
    Telemetry,
    Topology,
)
from agg_optimizer.model.topology import fat_tree

# Update sizes of real models (bytes per worker per iteration, fp32 gradients).
MODEL_BYTES = {"resnet50": 100_000_000, "vgg16": 530_000_000, "bert-large": 1_300_000_000}
# With a background level, links at least this busy build queues (hot links).
HOT_UTILIZATION = 0.6


def random_telemetry(
    topo: Topology,
    rng: np.random.Generator,
    *,
    hot_fraction: float = 0.15,
    level: float | None = None,
):
    """Background load: most directed links lightly used, a few hot ones (queues build).

    With `level` (0..1), every directed link's utilisation is drawn uniformly in
    [level / 2, min(1, 3 level / 2)] instead (mean about `level`, `hot_fraction` unused), and
    links at HOT_UTILIZATION or more are the hot ones."""
    if level is not None and not 0.0 <= level <= 1.0:
        raise ValueError(f"background: must be in [0, 1], got {level}")
    links, switches = [], []
    for ln in topo.links:
        for u, v in ((ln.src, ln.dst), (ln.dst, ln.src)):
            if level is None:
                hot = rng.random() < hot_fraction
                util = float(rng.uniform(0.6, 0.95) if hot else rng.uniform(0.0, 0.3))
            else:
                util = float(rng.uniform(level / 2, min(1.0, 1.5 * level)))
                hot = util >= HOT_UTILIZATION
            queue = float(rng.uniform(20_000, 200_000) if hot else rng.uniform(0, 5_000))
            links.append(
                LinkTelemetry(
                    src=u,
                    dst=v,
                    utilization=round(util, 4),
                    queue_bytes=round(queue),
                    latency_us=round(float(rng.uniform(1.0, 5.0)), 2),
                )
            )
    for n in topo.nodes:
        if n.kind == "switch":
            switches.append(
                SwitchTelemetry(switch=n.id, hop_latency_us=round(float(rng.uniform(0.5, 3)), 2))
            )
    return Telemetry(links=links, switches=switches)


def random_jobs(
    topo: Topology,
    n_jobs: int,
    rng: np.random.Generator,
    *,
    workers: tuple[int, int] = (8, 64),
    max_aggregators: int | None = None,
    pool_slots: int = DEFAULT_POOL_SLOTS,
) -> list[Job]:
    """Jobs whose workers are spread over racks; sizes drawn from real models."""
    hosts = [n.id for n in topo.nodes if n.kind == "host"]
    sizes = list(MODEL_BYTES.values())
    jobs = []
    for i in range(n_jobs):
        n = int(rng.integers(workers[0], workers[1] + 1))
        n = min(n, len(hosts) - 1)
        pick = rng.choice(len(hosts), size=n + 1, replace=False)
        members = [hosts[k] for k in pick]
        jobs.append(
            Job(
                id=f"job{i}",
                workers=members[1:],
                ps=members[0],
                update_bytes=sizes[int(rng.integers(len(sizes)))],
                weight=1.0,
                max_aggregators=max_aggregators,
                pool_slots=pool_slots,
            )
        )
    return jobs


def example_instance(
    k: int = 4,
    n_jobs: int = 4,
    seed: int = 0,
    *,
    slots: int = 512,
    workers: tuple[int, int] = (4, 12),
    topology: Topology | None = None,
    background: float | None = None,
    max_aggregators: int | None = None,
    pool_slots: int | None = None,
) -> Instance:
    """A k-ary fat-tree (or `topology`, which then replaces it and `slots`), random telemetry
    (`background`: see `random_telemetry`'s level) and `n_jobs` jobs, each capped at
    `max_aggregators` and taking pools of `pool_slots` when given."""
    rng = np.random.default_rng(seed)
    topo = fat_tree(k, slots=slots) if topology is None else topology
    hosts = sum(1 for n in topo.nodes if n.kind == "host")
    if hosts < 2:
        raise ValueError(f"topology: {hosts} host(s); a job needs a worker and a PS")
    lo, hi = min(workers[0], hosts - 1), min(workers[1], hosts - 1)
    return Instance(
        topology=topo,
        telemetry=random_telemetry(topo, rng, level=background),
        jobs=random_jobs(
            topo,
            n_jobs,
            rng,
            workers=(lo, hi),
            max_aggregators=max_aggregators,
            pool_slots=DEFAULT_POOL_SLOTS if pool_slots is None else pool_slots,
        ),
    )
