"""Training jobs on the simulated fabric: iterations of compute then communication, with
the aggregation a strategy placed, slot pools held on switches, and re-placement.

Streaming aggregation. A switch that sums a job's streams emits each chunk of the merged
stream once every input has delivered that chunk, and its slot pool bounds how far an input
may run ahead. At flow level this makes every stream feeding an aggregator, the merged
stream it emits, and recursively everything below it, advance at one rate: the rate of the
slowest of them. So a job's communication is a set of *components*: one per aggregator that
sends straight to the parameter server (PS), holding every stream of its subtree, plus one
per worker whose stream no switch sums. The PS receives one stream per component (incast).
A component is one `Flow` with a stream count per link, so max-min sharing gives each stream
the same share on a bottleneck and the component the rate of its slowest link.

Slots. Each switch has `slots`; a job summing there holds a pool of `pool_slots` until it
moves or ends. An aggregator that finds no free pool is skipped: the job passes through it
unaggregated, and its streams go on to the next aggregator or the PS.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from agg_optimizer.model.documents import Instance, Job, JobPlacement, Placement, Topology
from agg_optimizer.model.network import Network
from agg_optimizer.model.trees import cct_of
from agg_optimizer.sim.core import AGGREGATION, Flow, Simulator
from agg_optimizer.sim.fabric import Fabric
from agg_optimizer.sim.observe import IntObserver

Placer = Callable[[Instance], Placement]


@dataclass
class JobSpec:
    id: str
    workers: list[str]
    ps: str
    update_bytes: int
    iterations: int
    compute_s: float
    arrival_s: float = 0.0
    model: str = ""
    traffic_class: int = AGGREGATION  # the simulator's class for this job's streams
    # Hyper-parameter search: the cojob this trial belongs to, and how good its
    # configuration is (higher: lower loss; the worst trials are killed at stage ends)
    cojob: str | None = None
    quality: float = 0.0


# Learning curve of every model, in the fraction of its training done: accuracy reaches
# 1 - exp(-ACCURACY_RATE * f) of its converged value after a fraction f of its iterations
# (98.2% at the end). A documented stand-in for measured curves: it makes "time to 90% /
# 95% of converged accuracy" the time to finish 57.6% / 74.9% of the iterations, rounded up.
ACCURACY_RATE = 4.0


def iterations_to_accuracy(iterations: int, fraction: float) -> int:
    """Iterations after which a job of `iterations` reaches `fraction` of its converged
    accuracy on the curve above."""
    need = -np.log(1.0 - fraction) / ACCURACY_RATE * iterations
    return min(iterations, max(1, int(np.ceil(need - 1e-9))))


def time_to_accuracy(
    records: list[IterationRecord], iterations: int, fraction: float, compute_s: dict[str, float]
) -> list[float]:
    """Per job that ran all its iterations: seconds from its arrival until the iteration that
    reaches `fraction` of its converged accuracy was summed. The arrival is its first
    round's start less its compute time (the first thing a job does)."""
    by_job: dict[str, list[IterationRecord]] = {}
    for r in records:
        by_job.setdefault(r.job, []).append(r)
    need = iterations_to_accuracy(iterations, fraction)
    out = []
    for recs in by_job.values():
        recs.sort(key=lambda r: r.iteration)
        if len(recs) < iterations:
            continue  # killed (hyper-parameter search): never converged
        arrival = recs[0].start_s - compute_s.get(recs[0].model, 0.0)
        hit = recs[need - 1]
        out.append(hit.start_s + hit.cct_s - arrival)
    return out


@dataclass
class StageRecord:
    """One stage of a cojob: from its start (arrival, or the previous stage's end) until
    its slowest live trial finished the stage's iterations."""

    cojob: str
    stage: int
    start_s: float
    end_s: float
    trials: int  # alive during the stage
    killed: int  # at its end

    @property
    def sct_s(self) -> float:
        return self.end_s - self.start_s


@dataclass
class IterationRecord:
    job: str
    iteration: int
    start_s: float
    cct_s: float
    aggregators: int  # switches that summed this iteration
    ps_streams: int  # streams into the PS
    model: str


@dataclass
class _Running:
    spec: JobSpec
    placement: JobPlacement | None = None
    held: set[str] = field(default_factory=set)  # switches where the job holds a pool
    iteration: int = 0
    outstanding: int = 0
    comm_start: float = 0.0
    done: bool = False
    aggs_now: int = 0
    ps_now: int = 0
    flows: list[Flow] = field(default_factory=list)  # of the round in flight


def components(placement: JobPlacement, held: set[str], ps: str) -> list[list[list[str]]]:
    """The job's streams grouped by the rate they move at: each item is a list of node paths
    (segments) that advance together. Aggregators not in `held` are passed through."""
    paths = placement.worker_paths
    suffix: dict[str, list[str]] = {}
    for path in paths.values():
        for i, v in enumerate(path[1:-1], start=1):
            if v in held and v not in suffix:
                suffix[v] = path[i:]

    def cut(path: list[str]) -> tuple[list[str], str]:
        """From path[0] up to the first holding aggregator (or the PS)."""
        for i, v in enumerate(path[1:-1], start=1):
            if v in held:
                return path[: i + 1], v
        return path, ps

    up: dict[str, str] = {}
    seg_of: dict[str, list[str]] = {}
    for a, sfx in suffix.items():
        seg_of[a], up[a] = cut(sfx)

    def root(a: str) -> str:
        while up[a] != ps:
            a = up[a]
        return a

    groups: dict[str, list[list[str]]] = {a: [] for a in suffix if up[a] == ps}
    for a in suffix:
        groups[root(a)].append(seg_of[a])
    raw: list[list[list[str]]] = []
    for w in sorted(paths):
        seg, to = cut(paths[w])
        if to == ps:
            raw.append([seg])
        else:
            groups[root(to)].append(seg)
    return [groups[a] for a in sorted(groups)] + raw


def floor_component(fabric: Fabric, spec: JobSpec) -> list[list[str]]:
    """The network bound of streaming aggregation: one stream on each worker's uplink and one
    on the PS's downlink, moving together, as if the fabric between them were infinite and
    summed for free. No placement does better: every worker sends its whole update over its
    own uplink, and the PS receives at least one whole sum over its own downlink."""
    return [[w, fabric.attach[w]] for w in spec.workers] + [[fabric.attach[spec.ps], spec.ps]]


class Cluster:
    """The jobs of one run under one strategy (with `ideal`, the network bound instead:
    every job moves as `floor_component`, whatever the placement)."""

    def __init__(
        self,
        sim: Simulator,
        observer: IntObserver,
        placer: Placer,
        *,
        slots: int,
        pool_slots: int,
        replace_every: int = 0,
        switching_penalty_s: float = 0.0,
        flow_counts: bool = True,
        ideal: bool = False,
        scheduler: Callable[[Cluster], dict[str, int]] | None = None,
        stage_iterations: int = 0,
        keep_fraction: float = 0.5,
        joint_replace: bool = False,
        min_improvement: float = 0.0,
    ) -> None:
        """`scheduler(cluster)`: each running job's priority class (higher served first,
        background stays at 0), asked at every placement and every round's start; none:
        every job at 0, sharing max-min with the background."""
        self.sim = sim
        self.scheduler = scheduler
        # Re-place every running job together (as the service does: one solve per strategy
        # over all its jobs) instead of the one job whose turn it is, the others being
        # measured load in the INT snapshot.
        self.joint_replace = joint_replace
        # A re-placed job moves only if its predicted CCT drops by this fraction (the
        # service's `min_improvement`); the kept ones keep their pools.
        self.min_improvement = min_improvement
        self.kept_placements = 0
        # Successive halving for jobs with a cojob: after every `stage_iterations` the
        # cojob's live trials wait for each other, then the best `keep_fraction` go on.
        self.stage_iterations = stage_iterations
        self.keep_fraction = keep_fraction
        self.stages: list[StageRecord] = []
        self._stage_start: dict[str, float] = {}
        self._waiting: dict[str, set[str]] = {}
        self.killed: set[str] = set()
        self.priority: dict[str, int] = {}
        self.ideal = ideal
        self.fabric = sim.fabric
        self.observer = observer
        self.placer = placer
        self.pool_slots = pool_slots
        self.replace_every = replace_every
        self.switching_penalty_s = switching_penalty_s
        self.flow_counts = flow_counts
        topo: Topology = self.fabric.topology
        self.free = {n.id: slots for n in topo.nodes if n.kind == "switch" and n.programmable}
        self.jobs: dict[str, _Running] = {}
        self.records: list[IterationRecord] = []
        self.placements = 0
        self.skipped_pools = 0  # aggregators passed through for want of a pool

    # -- arrivals ---------------------------------------------------------------------------

    def submit(self, specs: list[JobSpec]) -> None:
        """Jobs arriving together are placed together."""
        by_time: dict[float, list[JobSpec]] = {}
        for s in specs:
            by_time.setdefault(s.arrival_s, []).append(s)
        for t, batch in sorted(by_time.items()):
            self.sim.at(t, lambda batch=batch: self._arrive(batch))

    def _arrive(self, batch: list[JobSpec]) -> None:
        for s in batch:
            self.jobs[s.id] = _Running(spec=s)
            if s.cojob is not None:
                self._stage_start.setdefault(s.cojob, self.sim.t)
        self._place([self.jobs[s.id] for s in batch])
        for s in batch:
            self._next_iteration(self.jobs[s.id])

    @property
    def finished(self) -> bool:
        return bool(self.jobs) and all(r.done for r in self.jobs.values())

    # -- placement --------------------------------------------------------------------------

    def _place(self, runs: list[_Running], *, hysteresis: bool = True) -> None:
        """Ask the strategy for `runs` given current INT and the pools other jobs hold.
        With `min_improvement`, a job already placed moves only when that pays."""
        topo: Topology = self.fabric.topology
        residual = dict(self.free)
        for r in runs:
            for s in r.held:
                residual[s] += self.pool_slots
        nodes = [
            n.model_copy(update={"slots": residual[n.id]}) if n.id in residual else n
            for n in topo.nodes
        ]
        inst = Instance(
            topology=Topology(nodes=nodes, links=topo.links),
            telemetry=self.observer.telemetry(
                exclude=[r.spec.traffic_class for r in runs], flow_counts=self.flow_counts
            ),
            jobs=[
                Job(
                    id=r.spec.id,
                    workers=r.spec.workers,
                    ps=r.spec.ps,
                    update_bytes=r.spec.update_bytes,
                    pool_slots=self.pool_slots,
                )
                for r in runs
            ],
            current={r.spec.id: sorted(r.held) for r in runs if r.held},
            switching_penalty_s=self.switching_penalty_s,
        )
        placement = self.placer(inst)
        self.placements += 1
        by_id = {jp.job_id: jp for jp in placement.jobs}
        assert {r.spec.id for r in runs} <= set(by_id), "the strategy left a job unplaced"
        if self.min_improvement > 0 and hysteresis:
            keep = self._not_worth_moving(inst, runs, by_id)
            if keep:
                # The kept jobs keep their placement and pools; the others are placed again
                # around them (their pools held, their traffic measured load), since the
                # joint solution may have given a mover a pool a kept job holds.
                self.kept_placements += len(keep)
                movers = [r for r in runs if r.spec.id not in keep]
                if movers:
                    self._place(movers, hysteresis=False)
                return
        # Release every pool no job wants any more before any job takes one: a job placed
        # together with others may want a switch whose pool another of them gives up.
        for r in runs:
            want = {a.switch for a in by_id[r.spec.id].aggregators}
            for s in r.held - want:
                self.free[s] += self.pool_slots
            r.held &= want
        for r in runs:
            jp = by_id[r.spec.id]
            want = {a.switch for a in jp.aggregators}
            for s in sorted(want - r.held):
                if self.free.get(s, 0) >= self.pool_slots:
                    self.free[s] -= self.pool_slots
                    r.held.add(s)
                else:
                    self.skipped_pools += 1
            r.placement = jp

    def _not_worth_moving(
        self, inst: Instance, runs: list[_Running], new: dict[str, JobPlacement]
    ) -> set[str]:
        """Jobs whose new placement's predicted CCT is not `min_improvement` below the one
        they run, both judged alone on `inst`'s link state (`Service._worth_moving`)."""
        moved = [r for r in runs if r.placement is not None]
        if not moved:
            return set()
        net = Network.from_instance(inst)
        spec = {j.id: j for j in inst.jobs}
        keep = set()
        for r in moved:
            old, jp = r.placement, new[r.spec.id]
            assert old is not None
            before = cct_of(
                net, spec[r.spec.id], old.worker_paths, {a.switch for a in old.aggregators}
            )
            after = cct_of(
                net, spec[r.spec.id], jp.worker_paths, {a.switch for a in jp.aggregators}
            )
            if (
                before is not None
                and after is not None
                and after >= before * (1.0 - self.min_improvement)
            ):
                keep.add(r.spec.id)
        return keep

    def reprioritise(self) -> None:
        """Ask the scheduler again and move the rounds in flight to their new classes."""
        assert self.scheduler is not None
        new = self.scheduler(self)
        for jid, cls in new.items():
            if self.priority.get(jid) != cls:
                self.priority[jid] = cls
                r = self.jobs.get(jid)
                if r is not None:
                    for f in r.flows:
                        self.sim.set_priority(f, cls)

    # -- iterations -------------------------------------------------------------------------

    def _next_iteration(self, r: _Running) -> None:
        self.sim.after(r.spec.compute_s, lambda: self._communicate(r))

    def _communicate(self, r: _Running) -> None:
        assert r.placement is not None
        comps = (
            [floor_component(self.fabric, r.spec)]
            if self.ideal
            else components(r.placement, r.held, r.spec.ps)
        )
        r.outstanding = len(comps)
        r.comm_start = self.sim.t
        r.flows = []
        if self.scheduler is not None:
            self.reprioritise()
        r.aggs_now = len(r.held)
        r.ps_now = len(comps)
        for segs in comps:
            idx = np.concatenate([self.fabric.path_links(p) for p in segs])
            links, mult = np.unique(idx, return_counts=True)
            r.flows.append(
                self.sim.add(
                    Flow(
                        links,
                        mult.astype(float),
                        float(r.spec.update_bytes),
                        r.spec.traffic_class,
                        priority=self.priority.get(r.spec.id, 0),
                        on_done=lambda _f, r=r: self._component_done(r),
                    )
                )
            )

    def _component_done(self, r: _Running) -> None:
        r.outstanding -= 1
        if r.outstanding:
            return
        self.records.append(
            IterationRecord(
                job=r.spec.id,
                iteration=r.iteration,
                start_s=r.comm_start,
                cct_s=self.sim.t - r.comm_start,
                aggregators=r.aggs_now,
                ps_streams=r.ps_now,
                model=r.spec.model,
            )
        )
        r.iteration += 1
        staged = r.spec.cojob is not None and self.stage_iterations > 0
        if r.iteration >= r.spec.iterations:
            self._finish(r)
            if staged:
                self._stage_end(r)
            return
        if staged and r.iteration % self.stage_iterations == 0:
            self._stage_end(r)
            return
        self._go_on(r)

    def _go_on(self, r: _Running) -> None:
        if self.replace_every and r.iteration % self.replace_every == 0:
            if self.joint_replace:
                live = [t for t in self.jobs.values() if not t.done and t.placement is not None]
                self._place(sorted(live, key=lambda t: t.spec.id))
            else:
                self._place([r])
        self._next_iteration(r)

    def _finish(self, r: _Running) -> None:
        r.done = True
        for s in r.held:
            self.free[s] += self.pool_slots
        r.held = set()

    def at_barrier(self, r: _Running) -> bool:
        """Whether a trial finished its stage and waits for its cojob (sends nothing)."""
        cj = r.spec.cojob
        return cj is not None and r.spec.id in self._waiting.get(cj, ())

    def stage_of(self, r: _Running) -> tuple[int, int]:
        """(stage, rounds left in it) of a trial."""
        s = self.stage_iterations
        return r.iteration // s, s - r.iteration % s

    def _stage_end(self, r: _Running) -> None:
        """A trial finished its stage: wait for the cojob's other live trials; the last one
        ends the stage, kills the worst and lets the rest go on."""
        cj = r.spec.cojob
        assert cj is not None
        live = [
            t for t in self.jobs.values() if t.spec.cojob == cj and t.spec.id not in self.killed
        ]
        waiting = self._waiting.setdefault(cj, set())
        waiting.add(r.spec.id)
        if not all(t.spec.id in waiting for t in live):
            return
        waiting.clear()
        stage = r.iteration // self.stage_iterations - 1
        going = [t for t in live if not t.done]
        keep = max(1, int(np.ceil(len(going) * self.keep_fraction))) if going else 0
        going.sort(key=lambda t: (-t.spec.quality, t.spec.id))
        for t in going[keep:]:
            self.killed.add(t.spec.id)
            self._finish(t)
        self.stages.append(
            StageRecord(
                cj, stage, self._stage_start.get(cj, 0.0), self.sim.t, len(live), len(going) - keep
            )
        )
        self._stage_start[cj] = self.sim.t
        for t in going[:keep]:
            self._go_on(t)
