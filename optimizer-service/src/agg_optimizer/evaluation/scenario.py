"""Scenarios: a fabric, background traffic, INT settings and training jobs, as one validated
document, plus the named scenarios `agg-optimizer evaluate` knows.

Every random draw of a run comes from the scenario's seed, split into independent streams
(jobs, background), so all strategies of one seed see the same jobs and the same background
flows (common random numbers: differences between strategies are not noise between runs).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from agg_optimizer.model.documents import Instance, Placement
from agg_optimizer.model.examples import MODEL_BYTES
from agg_optimizer.model.topology import fat_tree, leaf_spine
from agg_optimizer.placement import engine
from agg_optimizer.scheduling.policies import POLICIES, Demand, schedule
from agg_optimizer.sim.core import Simulator
from agg_optimizer.sim.fabric import Fabric
from agg_optimizer.sim.observe import IntObserver
from agg_optimizer.sim.traffic import Background
from agg_optimizer.sim.training import Cluster, IterationRecord, JobSpec, components

# Strategies that read INT re-place their jobs every `replace_every` iterations; the others
# decide once, when the job arrives (as the systems they stand for do).
DYNAMIC = frozenset({"agg", "soar", "greedy", "grid", "milp", "greedy-rr", "agg-mm", "agg-own"})
# Not strategies: references the evaluation reports beside them. "floor" is the network bound
# of streaming aggregation (training.floor_component): what no placement can beat.
REFERENCES = ("floor",)
# GPU compute per iteration (s), so communication overlaps realistic gaps between phases.
COMPUTE_S = {"resnet50": 0.2, "vgg16": 0.3, "bert-large": 0.5}
ModelName = Literal["resnet50", "vgg16", "bert-large"]


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    description: str = ""
    topology: Literal["fat-tree", "leaf-spine"] = "fat-tree"
    k: int = Field(8, ge=2, description="Fat-tree arity (even).")
    spines: int = Field(4, ge=1)
    leaves: int = Field(8, ge=1)
    hosts_per_leaf: int = Field(8, ge=1)
    uplink_gbps: float | None = Field(None, gt=0, description="Leaf-spine uplinks.")
    link_gbps: float = Field(10.0, gt=0)
    slots: int = Field(1024, ge=0, description="Aggregator slots per switch.")
    pool_slots: int = Field(128, ge=1, description="Slots of one job's pool on a switch.")
    jobs: int = Field(6, ge=1)
    workers: int = Field(16, ge=1, description="Workers per job.")
    worker_placement: Literal["packed", "spread", "random"] = "random"
    models: list[ModelName] = Field(default_factory=lambda: list(COMPUTE_S), min_length=1)
    iterations: int = Field(8, ge=1)
    arrival_interval_s: float = Field(
        0.0, ge=0, description="Mean time between job arrivals; 0: all arrive at once."
    )
    background_load: float = Field(0.3, ge=0.0, le=0.9)
    bg_size_alpha: float = Field(1.2, gt=0)
    bg_size_min_bytes: float = Field(10e6, gt=0)
    bg_size_max_bytes: float = Field(2e9, gt=0)
    hotspots: int = Field(0, ge=0)
    hotspot_flows: int = Field(8, ge=1)
    hotspot_period_s: float = Field(2.0, gt=0)
    int_period_s: float = Field(0.01, gt=0)
    int_window_s: float = Field(0.05, gt=0)
    int_staleness_s: float = Field(0.02, ge=0)
    int_flow_counts: bool = Field(
        True, description="INT reports the flows crossing each link (see LinkTelemetry.flows)."
    )
    replace_every: int = Field(2, ge=0, description="Iterations between re-placements; 0: never.")
    switching_penalty_s: float = Field(0.0, ge=0)
    joint_replace: bool = Field(
        False,
        description="Re-place all running jobs together at a job's re-placement (the "
        "service solves all jobs of a strategy together); false: only that job, the others "
        "being measured load.",
    )
    min_improvement: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Hysteresis at re-placement, as the service's control loop applies it: "
        "a job takes its new placement only when its predicted CCT (alone, on the same "
        "INT snapshot) is at least this fraction below the one it runs; 0: always.",
    )
    strategies: list[str] = Field(
        default_factory=lambda: [
            *(s for s in engine.STRATEGIES if s not in engine.ABLATIONS),
            *REFERENCES,
        ],
        min_length=1,
    )
    seeds: int = Field(5, ge=1)
    cojobs: int = Field(
        0,
        ge=0,
        description="Hyper-parameter search: the jobs are trials of this many cojobs (one "
        "model each), run in `stages` stages with the worst trials killed after each; 0: "
        "independent jobs.",
    )
    stages: int = Field(3, ge=1, description="Stages of a cojob (iterations split evenly).")
    keep_fraction: float = Field(0.5, gt=0.0, le=1.0, description="Trials kept per stage.")
    priority_classes: int = Field(
        4,
        ge=2,
        description="Strict-priority queues per switch port for `STRATEGY+POLICY` runs: jobs "
        "are mapped onto classes 1.. k-1 by the policy, background stays in class 0.",
    )

    @model_validator(mode="after")
    def _check(self) -> Scenario:
        if self.topology == "fat-tree" and self.k % 2:
            raise ValueError(f"k: a fat-tree needs an even arity, got {self.k}")
        if self.bg_size_max_bytes <= self.bg_size_min_bytes:
            raise ValueError("bg_size_max_bytes: must be larger than bg_size_min_bytes")
        if self.int_window_s < self.int_period_s:
            raise ValueError("int_window_s: must be at least int_period_s")
        known = [*engine.STRATEGIES, *REFERENCES]
        unknown = [s for s in self.strategies if not is_known_strategy(s)]
        if unknown:
            raise ValueError(
                f"strategies: unknown {', '.join(unknown)}; one of {', '.join(known)}, or "
                f"STRATEGY+POLICY with a policy of {', '.join(POLICIES)}"
            )
        if self.cojobs:
            if self.cojobs > self.jobs:
                raise ValueError(f"cojobs: {self.cojobs} cojobs need at least as many jobs")
            if self.iterations % self.stages:
                raise ValueError(
                    f"iterations: {self.iterations} do not split into {self.stages} stages"
                )
        need = self.jobs * (self.workers + 1)
        if need > self.n_hosts:
            raise ValueError(
                f"jobs: {self.jobs} jobs of {self.workers} workers and a PS need {need} hosts; "
                f"the topology has {self.n_hosts}"
            )
        return self

    @property
    def n_hosts(self) -> int:
        if self.topology == "fat-tree":
            return self.k**3 // 4
        return self.leaves * self.hosts_per_leaf

    def fabric(self) -> Fabric:
        if self.topology == "fat-tree":
            topo = fat_tree(self.k, capacity_gbps=self.link_gbps, slots=self.slots)
        else:
            topo = leaf_spine(
                self.spines,
                self.leaves,
                self.hosts_per_leaf,
                capacity_gbps=self.link_gbps,
                uplink_gbps=self.uplink_gbps,
                slots=self.slots,
            )
        return Fabric.from_topology(topo)

    def job_specs(self, fabric: Fabric, rng: np.random.Generator) -> list[JobSpec]:
        free = list(fabric.hosts)  # topology order: racks are contiguous
        racks = fabric.racks()
        specs = []
        t = 0.0
        for i in range(self.jobs):
            if self.worker_placement == "packed":
                start = int(rng.integers(len(free)))
                chosen = [free[(start + j) % len(free)] for j in range(self.workers)]
            elif self.worker_placement == "spread":
                order = [r for r in rng.permutation(sorted(racks))]
                avail = {r: [h for h in racks[r] if h in free] for r in order}
                chosen = []
                while len(chosen) < self.workers:
                    for r in order:
                        if avail[r] and len(chosen) < self.workers:
                            chosen.append(avail[r].pop(0))
            else:
                chosen = [free[j] for j in rng.choice(len(free), self.workers, replace=False)]
            rest = [h for h in free if h not in set(chosen)]
            ps = rest[int(rng.integers(len(rest)))]
            free = [h for h in rest if h != ps]
            model = self.models[int(rng.integers(len(self.models)))]
            cojob = f"cojob{i % self.cojobs}" if self.cojobs else None
            if cojob is not None:
                # the trials of a cojob tune one model; each configuration has a quality
                model = self.models[(i % self.cojobs) % len(self.models)]
            specs.append(
                JobSpec(
                    id=f"job{i}",
                    workers=chosen,
                    ps=ps,
                    update_bytes=MODEL_BYTES[model],
                    iterations=self.iterations,
                    compute_s=COMPUTE_S[model],
                    arrival_s=t,
                    model=model,
                    cojob=cojob,
                    quality=float(rng.random()) if cojob else 0.0,
                )
            )
            if self.arrival_interval_s:
                t += float(rng.exponential(self.arrival_interval_s))
        return specs


def is_known_strategy(name: str) -> bool:
    """A strategy, a reference, or STRATEGY+POLICY (placement plus a scheduling policy)."""
    base, plus, policy = name.partition("+")
    ok = base in engine.STRATEGIES or base in REFERENCES
    return ok and (not plus or (policy in POLICIES and base in engine.STRATEGIES))


def scheduler_for(
    policy: str, scenario: Scenario, seed: int = 0
) -> Callable[[Cluster], dict[str, int]]:
    """The Cluster's scheduler for `policy`: every running job's round as a demand (bytes
    per link of its placement's streams, progress, bytes sent in flight), ordered by the
    policy onto classes 1 .. k-1 (0 is the background's). `fair` puts every job in the top
    class: above the background, sharing max-min among themselves (the strategy alone,
    without `+POLICY`, is per-flow fair sharing with the background too).

    The demands are listed in an order drawn from `seed` at every call: where a policy
    breaks ties by listing order, a gap between policies is then not an artefact of the
    order jobs were submitted in (reversing only the cojobs' listing moved Grouper's and
    Sincronia's stage completion times by up to 9%)."""

    k = scenario.priority_classes
    shuffle = np.random.default_rng([seed, 0x5C4ED]).permutation

    def sched(cluster: Cluster) -> dict[str, int]:
        fab = cluster.fabric
        ds = []
        stage_rounds: dict[tuple[str, int], int] = {}
        for jid, r in cluster.jobs.items():
            if r.done or r.placement is None or cluster.at_barrier(r):
                continue
            links: dict[str, float] = {}
            for segs in components(r.placement, r.held, r.spec.ps):
                for path in segs:
                    for e in fab.path_links(path):
                        links[str(e)] = links.get(str(e), 0.0) + r.spec.update_bytes
            sent = sum(r.spec.update_bytes - cluster.sim.remaining(f) for f in r.flows)
            stage, left = cluster.stage_of(r) if cluster.stage_iterations else (0, 1)
            if r.spec.cojob is not None:
                for later in range(stage + 1, scenario.stages):
                    stage_rounds[(r.spec.cojob, later)] = cluster.stage_iterations
            ds.append(
                Demand(
                    job=jid,
                    links=links,
                    arrival_s=r.spec.arrival_s,
                    sent_bytes=sent,
                    progress=min(r.iteration / r.spec.iterations, 1.0),
                    cojob=r.spec.cojob,
                    stage=stage,
                    rounds_left=left,
                )
            )
        ds = [ds[i] for i in shuffle(len(ds))]
        s = schedule(policy, ds, k - 1, stage_rounds=stage_rounds)
        return {j: c + 1 for j, c in s.classes.items()}

    return sched


@dataclass
class RunResult:
    scenario: str
    strategy: str
    seed: int
    records: list[IterationRecord]
    sim_time_s: float
    wall_s: float
    events: int
    rate_solves: int
    background_flows: int
    placements: int
    skipped_pools: int
    # Background flows finished during the run and their completion times: what priorities
    # for training traffic cost everything else.
    stages: list[dict] = field(default_factory=list)  # StageRecord of every cojob stage
    bg_finished: int = 0
    bg_fct_mean_s: float = 0.0
    bg_fct_p99_s: float = 0.0
    kept_placements: int = 0  # re-placements a job declined (`min_improvement`)

    def ccts(self) -> np.ndarray:
        return np.array([r.cct_s for r in self.records])


def world(
    scenario: Scenario, fabric: Fabric, bg_rng: np.random.Generator, n_classes: int = 2
) -> tuple[Simulator, IntObserver, Background]:
    """A simulator on `fabric` with the scenario's INT observer and background traffic
    (not started)."""
    sim = Simulator(fabric, n_classes=n_classes)
    observer = IntObserver(
        sim,
        period_s=scenario.int_period_s,
        window_s=scenario.int_window_s,
        staleness_s=scenario.int_staleness_s,
    )
    bg = Background(
        sim,
        bg_rng,
        load=scenario.background_load,
        size_alpha=scenario.bg_size_alpha,
        size_min_bytes=scenario.bg_size_min_bytes,
        size_max_bytes=scenario.bg_size_max_bytes,
        hotspots=scenario.hotspots,
        hotspot_flows=scenario.hotspot_flows,
        hotspot_period_s=scenario.hotspot_period_s,
    )
    return sim, observer, bg


def run(
    scenario: Scenario,
    strategy: str,
    seed: int,
    probe: Callable[[Simulator, float], None] | None = None,
    on_placement: Callable[[float, Instance, Placement], None] | None = None,
) -> RunResult:
    """Simulate every job of `scenario` to its last iteration under `strategy` (`probe`:
    see `Simulator.probe`; `on_placement`: called with the time, the instance and the
    placement of every placement the strategy made, e.g. to keep them or to compare the
    predicted CCT with the simulated one)."""
    t0 = time.perf_counter()
    root = np.random.SeedSequence([seed, 0xA66])
    job_seq, bg_seq = root.spawn(2)
    fabric = scenario.fabric()
    specs = scenario.job_specs(fabric, np.random.default_rng(job_seq))
    for i, s in enumerate(specs):
        s.traffic_class = 1 + i
    sim, observer, bg = world(scenario, fabric, np.random.default_rng(bg_seq), 1 + len(specs))
    sim.probe = probe
    name = strategy
    strategy, _, policy = strategy.partition("+")
    floor = strategy == "floor"

    def place(inst: Instance) -> Placement:
        p = engine.solve(inst, "ps" if floor else strategy, seed=seed)
        if on_placement is not None:
            on_placement(sim.t, inst, p)
        return p

    cluster = Cluster(
        sim,
        observer,
        place,
        slots=scenario.slots,
        pool_slots=scenario.pool_slots,
        replace_every=scenario.replace_every if strategy in DYNAMIC else 0,
        switching_penalty_s=scenario.switching_penalty_s,
        flow_counts=scenario.int_flow_counts,
        ideal=floor,
        scheduler=scheduler_for(policy, scenario, seed) if policy else None,
        stage_iterations=scenario.iterations // scenario.stages if scenario.cojobs else 0,
        keep_fraction=scenario.keep_fraction,
        joint_replace=scenario.joint_replace,
        min_improvement=scenario.min_improvement,
    )
    observer.start()
    bg.start()
    # Let background traffic and INT reach a steady state before the first job arrives.
    warmup = max(scenario.int_window_s + scenario.int_staleness_s, 0.5)
    for s in specs:
        s.arrival_s += warmup
    cluster.submit(specs)
    sim.run(stop=lambda: cluster.finished)
    return RunResult(
        scenario=scenario.name,
        strategy=name,
        seed=seed,
        records=cluster.records,
        sim_time_s=sim.t,
        wall_s=time.perf_counter() - t0,
        events=sim.events_run,
        rate_solves=sim.rate_solves,
        background_flows=bg.started,
        placements=cluster.placements,
        skipped_pools=cluster.skipped_pools,
        kept_placements=cluster.kept_placements,
        stages=[asdict(x) | {"sct_s": x.sct_s} for x in cluster.stages],
        bg_finished=len(bg.fct_s),
        bg_fct_mean_s=float(np.mean(bg.fct_s)) if bg.fct_s else 0.0,
        bg_fct_p99_s=float(np.percentile(bg.fct_s, 99)) if bg.fct_s else 0.0,
    )


def _presets() -> dict[str, Scenario]:
    base = dict(
        k=8,
        jobs=8,
        workers=12,
        iterations=5,
        slots=128,
        background_load=0.3,
        hotspots=2,
        bg_size_min_bytes=50e6,
    )
    out = [
        Scenario(
            name="paper",
            description=(
                "Headline comparison: k=8 fat-tree (128 hosts, 10 Gb/s), 8 concurrent jobs of "
                "12 workers placed at random, ResNet-50/VGG-16/BERT-large updates, 30% "
                "Poisson background with heavy-tailed sizes plus 2 moving hotspots, one pool "
                "per switch (scarce slots), 5 iterations per job."
            ),
            **base,
        ),
        Scenario(
            name="k4",
            description="Small: k=4 fat-tree, 3 jobs of 4 workers, 30% background, ample slots.",
            k=4,
            jobs=3,
            workers=4,
            iterations=6,
            slots=1024,
            background_load=0.3,
            bg_size_min_bytes=50e6,
        ),
        Scenario(
            name="k8-packed",
            description="paper, workers packed rack by rack.",
            **base | {"worker_placement": "packed"},
        ),
        Scenario(
            name="k8-spread",
            description="paper, workers spread one per rack.",
            **base | {"worker_placement": "spread"},
        ),
        Scenario(
            name="k8-ample",
            description="paper with 8 pools per switch (ample slots).",
            **base | {"slots": 1024},
        ),
        Scenario(
            name="k8-load0",
            description="paper without background traffic or hotspots.",
            **base | {"background_load": 0.0, "hotspots": 0},
        ),
        Scenario(
            name="k8-load70",
            description="paper with 70% background load, in flows of 300 MB to 3 GB (fewer, "
            "larger flows keep the simulation within minutes).",
            **base | {"background_load": 0.7, "bg_size_min_bytes": 300e6, "bg_size_max_bytes": 3e9},
        ),
        Scenario(
            name="leaf-spine",
            description="Leaf-spine: 4 spines, 8 leaves of 8 hosts, 10 Gb/s hosts and 40 Gb/s "
            "uplinks, 6 jobs of 8 workers, 30% background, one pool per switch.",
            topology="leaf-spine",
            spines=4,
            leaves=8,
            hosts_per_leaf=8,
            uplink_gbps=40.0,
            jobs=6,
            workers=8,
            iterations=5,
            slots=128,
            background_load=0.3,
            hotspots=1,
            bg_size_min_bytes=50e6,
        ),
        Scenario(
            name="hpsearch",
            description="Hyper-parameter search: k=8 fat-tree, 3 cojobs of 4 trials (8 "
            "workers each, one model per cojob), 3 stages of 2 iterations with the worse half "
            "killed after each, background as in paper, one pool per switch.",
            **base | {"jobs": 12, "workers": 8, "iterations": 6, "cojobs": 3, "stages": 3},
        ),
        Scenario(
            name="jpas",
            description="Jobs arriving over time (one a second on average), 8 iterations "
            "each, otherwise paper: early jobs compete with late ones (JPAS's case).",
            **base | {"iterations": 8, "arrival_interval_s": 1.0},
        ),
    ]
    return {s.name: s for s in out}


SCENARIOS = _presets()
# `evaluate --scenario suite` runs these, for the per-scenario bars.
SUITE = ["k4", "paper", "k8-packed", "k8-spread", "k8-ample", "k8-load0", "k8-load70", "leaf-spine"]
