"""Job-aware flow scheduling: which job's traffic the switches serve first (issue 17, item 3).

Switches have a few strict-priority queues per port, so a policy is two steps: an **order**
of the jobs (who should finish first), then a **mapping** of that order onto the `k`
classes the fabric has (class k-1 served first, class 0 last; background traffic stays in
the default class 0 unless a policy says otherwise). Every policy here has that shape, so
the simulator, the service and the switches' priority table all take the same output.

A job's traffic is described by its **demand**: the bytes one communication round puts on
each link it crosses (its placement's streams times the update size, `demands_from`), plus
what a policy needs to know of it: arrival, weight, bytes already sent in this round,
training progress, and for hyper-parameter search its cojob and stage.

Policies (`POLICIES`):

- `fair`: per-flow fair sharing, no priorities (every job in one class).
- `fifo`: by arrival.
- `varys`: smallest effective bottleneck first (Varys, SIGCOMM 2014): a job's bottleneck is
  its largest time on any one link (bytes / rate); smallest first.
- `sincronia`: Sincronia's primal-dual ordering (BSSI, SIGCOMM 2018): repeatedly take the most
  loaded link, put last the job with the smallest weight per byte on it, and charge its
  weight to the others on that link. A 4-approximation of weighted completion time.
- `baraat`: FIFO with limited multiplexing (Baraat, SIGCOMM 2014): FIFO, but a job that has
  sent more than `heavy_bytes` of its round is moved behind the light ones, so one elephant
  does not block everything that came after it.
- `grouper`: stage-aware ordering for hyper-parameter search (Grouper, IEEE TNSM 2020). The
  unit is a cojob's stage (all its live trials' remaining rounds of the stage; a stage
  completes when its slowest trial does), and stages of one cojob keep their order. The
  ordering is BSSI over those units, where only a cojob's last unordered stage may be put
  last (its stages form a chain); a job gets the position of its cojob's current stage.
  This is our reading of the paper's primal-dual permutation of stages (docs/scheduling.md).
- `jpas`: progress-aware priorities (JPAS, JNCA 2020): jobs early in training first
  (lowest `progress`, the fraction of the iterations, or of the loss decrease, done), ties by
  arrival; the service re-orders on a period as progress is reported.

The mapping (`to_classes`) cuts the order into `k` contiguous groups of equal size (the
first group gets the top class): the order is kept (a job never has a lower class than a
job after it), and when there are at least `k` jobs every class is used. Under `grouper`
the groups are cut over cojobs, so a cojob's trials share one class (cutting over jobs
split 14 of 22 cojobs across classes).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from agg_optimizer.model.documents import Instance, JobPlacement, Placement


@dataclass(frozen=True)
class Demand:
    """One job's round as the scheduler sees it."""

    job: str
    links: Mapping[str, float]  # link id -> bytes this round puts on it
    arrival_s: float = 0.0
    weight: float = 1.0
    sent_bytes: float = 0.0  # of this round, so far
    progress: float = 0.0  # fraction of training done, in [0, 1]
    cojob: str | None = None
    stage: int = 0
    # Rounds left in the current stage (a stage's demand is this many rounds).
    rounds_left: int = 1


@dataclass
class Schedule:
    """The order (first served first) and each job's class (higher served first)."""

    policy: str
    order: list[str]
    classes: dict[str, int] = field(default_factory=dict)


def _check(demands: Sequence[Demand]) -> None:
    seen: set[str] = set()
    for i, d in enumerate(demands):
        if d.job in seen:
            raise ValueError(f"demands[{i}].job: duplicate job {d.job!r}")
        seen.add(d.job)
        if d.weight <= 0:
            raise ValueError(f"demands[{i}].weight: must be > 0, got {d.weight}")
        if not 0.0 <= d.progress <= 1.0:
            raise ValueError(f"demands[{i}].progress: must be in [0, 1], got {d.progress}")
        if any(b < 0 for b in d.links.values()):
            raise ValueError(f"demands[{i}].links: bytes must be >= 0")


def bssi(
    units: Sequence[str],
    load: Mapping[str, Mapping[str, float]],
    weight: Mapping[str, float],
    may_go_last: Callable[[str, set[str]], bool] | None = None,
) -> list[str]:
    """Sincronia's Bottleneck-Select-Scale-Iterate: an order of `units` (first = served
    first). `load[u]`: bytes per link; `may_go_last(u, left)`: whether `u` may be put last
    among `left` (precedence); default any."""
    left = set(units)
    w = {u: float(weight[u]) for u in units}
    tail: list[str] = []
    index = {u: i for i, u in enumerate(units)}  # ties: the later-listed unit goes last
    while left:
        per_link: dict[str, float] = {}
        for u in left:
            for e, b in load[u].items():
                per_link[e] = per_link.get(e, 0.0) + b
        cands = [u for u in left if may_go_last is None or may_go_last(u, left)]
        if not per_link or max(per_link.values()) <= 0:
            # nothing left on any link: order the rest by weight, heaviest first
            rest = sorted(cands, key=lambda u: (w[u], -index[u]))
            last = rest[0]
        else:
            b = max(per_link, key=lambda e: (per_link[e], e))
            on_b = [u for u in cands if load[u].get(b, 0.0) > 0]
            if not on_b:  # the bottleneck's units all wait for a successor: next link
                loads = sorted(per_link, key=lambda e: -per_link[e])
                b = next(e for e in loads if any(load[u].get(e, 0.0) > 0 for u in cands))
                on_b = [u for u in cands if load[u].get(b, 0.0) > 0]
            last = min(on_b, key=lambda u: (w[u] / load[u][b], -index[u]))
            ratio = w[last] / load[last][b]
            for u in left:
                if u != last and load[u].get(b, 0.0) > 0:
                    w[u] = max(w[u] - ratio * load[u][b], 0.0)
        tail.append(last)
        left.remove(last)
    return tail[::-1]


def _fair(ds: Sequence[Demand], **_: object) -> list[str]:
    return [d.job for d in ds]


def _fifo(ds: Sequence[Demand], **_: object) -> list[str]:
    return [d.job for d in sorted(ds, key=lambda d: d.arrival_s)]


def _varys(
    ds: Sequence[Demand], rates: Mapping[str, float] | None = None, **_: object
) -> list[str]:
    """`rates`: bit/s per link (what is free of background); equal rates without it."""

    def bottleneck(d: Demand) -> float:
        return max((b * 8 / (rates.get(e, 1.0) if rates else 1.0) for e, b in d.links.items()),
                   default=0.0)  # fmt: skip

    return [d.job for d in sorted(ds, key=lambda d: (bottleneck(d), d.arrival_s))]


def _sincronia(ds: Sequence[Demand], **_: object) -> list[str]:
    return bssi([d.job for d in ds], {d.job: d.links for d in ds}, {d.job: d.weight for d in ds})


def _baraat(ds: Sequence[Demand], heavy_bytes: float = 1e9, **_: object) -> list[str]:
    fifo = sorted(ds, key=lambda d: d.arrival_s)
    return [d.job for d in fifo if d.sent_bytes <= heavy_bytes] + [
        d.job for d in fifo if d.sent_bytes > heavy_bytes
    ]


def _jpas(ds: Sequence[Demand], **_: object) -> list[str]:
    return [d.job for d in sorted(ds, key=lambda d: (d.progress, d.arrival_s))]


def _grouper(
    ds: Sequence[Demand], stage_rounds: Mapping[tuple[str, int], int] | None = None, **_: object
) -> list[str]:
    """Stages as units. `stage_rounds[(cojob, s)]`: rounds a later stage s of the cojob will
    take (its trials' demand is scaled by that; the trials alive in a later stage are not
    known before the kills, so the current ones stand in for them). Without it only the
    current stages are ordered."""
    solo = [d for d in ds if d.cojob is None]
    groups: dict[str, list[Demand]] = {}
    for d in ds:
        if d.cojob is not None:
            groups.setdefault(d.cojob, []).append(d)
    load: dict[str, dict[str, float]] = {}
    weight: dict[str, float] = {}
    chain: dict[str, tuple[str, int]] = {}  # unit -> (cojob, stage)
    unit_of_job: dict[str, str] = {}
    units: list[str] = []
    for d in solo:
        u = f"job:{d.job}"
        units.append(u)
        load[u] = {e: b * d.rounds_left for e, b in d.links.items()}
        weight[u] = d.weight
        unit_of_job[d.job] = u
    for cj, members in groups.items():
        cur = min(d.stage for d in members)
        later = sorted(s for (c, s) in (stage_rounds or {}) if c == cj and s > cur)
        for s in [cur, *later]:
            u = f"stage:{cj}:{s}"
            units.append(u)
            chain[u] = (cj, s)
            agg: dict[str, float] = {}
            for d in members:
                rounds = d.rounds_left if s == cur else (stage_rounds or {})[(cj, s)]
                for e, b in d.links.items():
                    agg[e] = agg.get(e, 0.0) + b * rounds
            load[u] = agg
            weight[u] = float(np.mean([d.weight for d in members]))
        for d in members:
            unit_of_job[d.job] = f"stage:{cj}:{cur}"

    def may_go_last(u: str, left: set[str]) -> bool:
        if u not in chain:
            return True
        cj, s = chain[u]
        return not any(v in chain and chain[v][0] == cj and chain[v][1] > s for v in left)

    order = bssi(units, load, weight, may_go_last)
    pos = {u: i for i, u in enumerate(order)}
    arrival = {d.job: d.arrival_s for d in ds}
    return sorted(unit_of_job, key=lambda j: (pos[unit_of_job[j]], arrival[j], j))


POLICIES: dict[str, Callable[..., list[str]]] = {
    "fair": _fair,
    "fifo": _fifo,
    "varys": _varys,
    "sincronia": _sincronia,
    "baraat": _baraat,
    "grouper": _grouper,
    "jpas": _jpas,
}


def to_classes(
    order: Sequence[str], k: int, unit: Mapping[str, str] | None = None
) -> dict[str, int]:
    """Cut `order` into `k` contiguous groups of (nearly) equal size: the first group gets
    class k-1 (served first), the last class 0. Order-preserving, and with at least `k`
    units every class is used. `unit[job]`: jobs that must share a class (a cojob's trials
    under Grouper); the groups are cut over units, in the order of their first job, and a
    unit's jobs all take its class. Without it every job is its own unit."""
    if k < 1:
        raise ValueError(f"k: must be >= 1, got {k}")
    units: list[str] = []
    key = {}
    for job in order:
        u = unit.get(job, f"job:{job}") if unit else f"job:{job}"
        key[job] = u
        if u not in units:
            units.append(u)
    n = len(units)
    cls = {u: k - 1 - (i * min(k, n) // n) for i, u in enumerate(units)}  # 0 .. min(k, n)-1
    return {job: cls[key[job]] for job in order}


def schedule(
    policy: str,
    demands: Sequence[Demand],
    k: int,
    **options: object,
) -> Schedule:
    """Order `demands` by `policy` and map the order onto `k` priority classes (`fair`:
    every job in the top class, i.e. no job above another; `grouper`: a cojob's trials in
    one class, as they share one position in its order)."""
    if policy not in POLICIES:
        raise ValueError(f"policy: unknown {policy!r}; one of {', '.join(POLICIES)}")
    _check(demands)
    order = POLICIES[policy](demands, **options)
    if policy == "fair":
        classes = {j: k - 1 for j in order}
    elif policy == "grouper":
        classes = to_classes(order, k, {d.job: d.cojob for d in demands if d.cojob is not None})
    else:
        classes = to_classes(order, k)
    return Schedule(policy=policy, order=order, classes=classes)


def link_bytes(job_update_bytes: float, placement: JobPlacement) -> dict[str, float]:
    """Bytes one round of a placed job puts on each directed link ("u->v"): its streams
    there (after the aggregators of the placement sum them) times the update size."""
    from agg_optimizer.sim.training import components

    held = {a.switch for a in placement.aggregators}
    ps = next(iter(placement.worker_paths.values()))[-1]
    out: dict[str, float] = {}
    for comp in components(placement, held, ps):
        for seg in comp:
            for u, v in itertools.pairwise(seg):
                key = f"{u}->{v}"
                out[key] = out.get(key, 0.0) + float(job_update_bytes)
    return out


def demands_from(
    instance: Instance, placement: Placement, info: Mapping[str, Mapping[str, object]] | None = None
) -> list[Demand]:
    """The scheduler's view of placed jobs: each job's bytes per link from its placement,
    plus what `info[job]` says (arrival_s, weight, sent_bytes, progress, cojob, stage,
    rounds_left; the job's weight by default)."""
    jobs = {j.id: j for j in instance.jobs}
    out = []
    for jp in placement.jobs:
        job = jobs[jp.job_id]
        extra = dict((info or {}).get(jp.job_id, {}))
        extra.setdefault("weight", job.weight)
        out.append(Demand(job=jp.job_id, links=link_bytes(job.update_bytes, jp), **extra))  # type: ignore[arg-type]
    return out
