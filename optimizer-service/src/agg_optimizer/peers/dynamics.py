"""NetMax on a fabric that changes: time to a target loss on a fat-tree whose background
traffic and hotspots move, with the convergence model of `calibration` (docs/peers.md;
issue 19, part b).

**The model.** `peers.evaluate` gives, for a plan P on pair exchange times t,

    J(P; kappa) = 1 / R(P)  +  kappa * g_u / Lam(P)        (synchronous: J = T / n)

and the time to a target loss is modelled as `a * J`. Both parts are linear in
(a, a * kappa), so `calibrate` fits them to measured runs by non-negative least squares on
relative errors (every row divided by its measurement). A run whose fabric changes (its
`phases`) is predicted as below, where progress reaches 1, and the fit is then a bounded
nonlinear least squares started from the linear one. `leave_one_out` refits without one
policy (or one run) and predicts it: whether the model predicts, or only fits.

**The dynamic fabric.** `FatTreeTimeline` runs the flow-level simulator (`sim.core`) on a
fat-tree (`topology.fat_tree`) with Poisson background flows (`sim.traffic.Background`)
and moving hotspots: every `period_s` each hotspot puts `hotspot_streams` long-lived
streams on both directions of a new random set of links that routing cannot avoid (all the
aggregation-to-core uplinks of a pod, or all the uplinks of a rack's edge switch). Every
`interval_s` the INT observer (`sim.observe`) gives the telemetry of the interval just
ended, and `peers.pair_times` on the instance with that telemetry gives the exchange times:
the fabric is piecewise constant per interval (`Segment`). The gossip traffic itself is
not simulated: an exchange gets the residual rate the telemetry shows.

**Progress.** `integrate` runs every policy over the segments at once: in a segment with
pair times t, a policy with plan P makes progress at rate 1 / (a * J(P, t; kappa)) and
reaches the target when its progress reaches 1. NetMax re-planned (`Policy.replan`)
computes a new plan from the telemetry of the interval that just ended, every
`replan_every_s`: when a hotspot moves, the old plan runs on the new fabric for one
interval. `netmax-static` keeps the plan of the initial fabric; the parameter server stays
where the initial plan put it; all-reduce's ring keeps the workers' order.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from agg_optimizer.model.documents import Instance
from agg_optimizer.model.topology import fat_tree
from agg_optimizer.peers import selection as peers
from agg_optimizer.peers.calibration import GOSSIP, gossip_terms, ps_iteration_s
from agg_optimizer.sim.core import BACKGROUND, Flow, Simulator
from agg_optimizer.sim.fabric import Fabric
from agg_optimizer.sim.observe import IntObserver
from agg_optimizer.sim.traffic import Background

# --- progress on a piecewise-constant fabric ------------------------------------------------


@dataclass
class Segment:
    """[start_s, end_s): the fabric's exchange times `t` (n x n, s)."""

    start_s: float
    end_s: float
    t: np.ndarray


@dataclass(frozen=True)
class Policy:
    name: str  # the label in results
    kind: str  # one of peers.POLICIES
    replan: bool = False  # netmax: re-planned on new telemetry
    plan_kappa: float = peers.DEFAULT_KAPPA  # netmax's own kappa when it plans
    group: int = 4  # prague


def default_policies(plan_kappas: Sequence[float] = (0.1, 1.0)) -> list[Policy]:
    """NetMax re-planned and static for each planning kappa, and the baselines."""
    out = []
    for k in plan_kappas:
        out.append(Policy(f"netmax (kappa {k:g})", "netmax", True, k))
        out.append(Policy(f"netmax-static (kappa {k:g})", "netmax", False, k))
    out += [Policy(k, k) for k in ("adpsgd", "allreduce", "ps", "prague")]
    return out


@dataclass
class Outcome:
    time_s: float  # to the target; unfinished: horizon / progress (extrapolated)
    finished: bool
    progress: float  # at the end of the simulated time
    replans: int = 0


@dataclass
class _State:
    policy: Policy
    planned: bool = False
    p: np.ndarray | None = None  # gossip plan in use
    ps_index: int = -1
    next_replan: float = math.inf
    replans: int = 0


def _plan_gossip(pol: Policy, t: np.ndarray, c: np.ndarray, iters: int) -> np.ndarray:
    n = len(c)
    if pol.kind == "adpsgd":
        allowed = np.isfinite(t) & ~np.eye(n, dtype=bool)
        return allowed / allowed.sum(axis=1, keepdims=True)
    return peers.netmax(t, c, pol.plan_kappa, iters=iters)


def _state_terms(st: _State, workers: Sequence[str], t: np.ndarray, c: np.ndarray) -> tuple:
    pol = st.policy
    if pol.kind in GOSSIP:
        assert st.p is not None
        return gossip_terms(st.p, t, c)
    n = len(c)
    if pol.kind == "ps":
        return ps_iteration_s(t, c, st.ps_index) / n, 0.0
    plan = peers.plan(pol.kind, workers, t, c, kappa=0.0, group=pol.group)
    if pol.kind == "prague":
        return 1.0 / plan.updates_per_s, (2.0 / (n - 1)) / plan.mixing_rate
    return plan.predicted_s, 0.0


def integrate(
    segments: Iterable[Segment],
    workers: Sequence[str],
    policies: Sequence[Policy],
    worlds: Mapping[str, tuple[float, float]],
    *,
    compute_s: float = 0.0,
    initial_t: np.ndarray | None = None,
    replan_every_s: float | None = None,
    horizon_s: float = math.inf,
    extrapolate: Collection[str] = (),
    netmax_iters: int = 100,
    trace: list | None = None,
) -> dict[str, dict[str, Outcome]]:
    """Time to target of every policy in every world {name: (a, kappa)} over `segments`.

    Plans are made on `initial_t` (default: the first segment's times). A re-planned
    policy plans again at the first segment starting at or after each multiple of
    `replan_every_s` (None: every segment), on the previous segment's times (the
    telemetry of the interval that just ended). Stops when every policy reached the
    target in every world, or at `horizon_s`, or when only the policies named in
    `extrapolate` are left: an unfinished policy's time is extrapolated from its mean rate
    so far (`Outcome.finished` false). `netmax_iters`: of `peers.netmax` (100 gets within
    0.1% of 400's J on the fat-trees here, in a quarter of the time). `trace`: gets
    (end_s, {world: {policy: progress}}) per segment."""
    n = len(workers)
    c = np.full(n, float(compute_s))
    states = [_State(p) for p in policies]
    prog = {w: {p.name: 0.0 for p in policies} for w in worlds}
    done: dict[str, dict[str, float]] = {w: {} for w in worlds}
    prev: np.ndarray | None = None if initial_t is None else np.maximum(initial_t, initial_t.T)
    end = 0.0
    needed = [p.name for p in policies if p.name not in set(extrapolate)]
    for seg in segments:
        t = np.maximum(seg.t, seg.t.T)
        if prev is None:
            prev = t
        for st in states:
            pol = st.policy
            if not st.planned:  # first segment: initial plans
                st.planned = True
                if pol.kind in GOSSIP:
                    st.p = _plan_gossip(pol, prev, c, netmax_iters)
                elif pol.kind == "ps":
                    st.ps_index = int(peers.plan("ps", workers, prev, c).detail["ps_index"])
                if pol.replan:
                    st.next_replan = replan_every_s if replan_every_s is not None else 0.0
                    if st.next_replan <= seg.start_s + 1e-9:
                        st.next_replan += replan_every_s or 0.0
            elif pol.replan and seg.start_s >= st.next_replan - 1e-9:
                if any(pol.name not in done[w] for w in worlds):
                    st.p = _plan_gossip(pol, prev, c, netmax_iters)
                    st.replans += 1
                if replan_every_s is None:
                    st.next_replan = seg.start_s
                else:
                    while st.next_replan <= seg.start_s + 1e-9:
                        st.next_replan += replan_every_s
        dt = seg.end_s - seg.start_s
        for st in states:
            name = st.policy.name
            if all(name in done[w] for w in worlds):
                continue
            x1, x2 = _state_terms(st, workers, t, c)
            for w, (a, kappa) in worlds.items():
                if name in done[w]:
                    continue
                j = x1 + kappa * x2 if math.isfinite(x2) else math.inf
                rate = 1.0 / (a * j) if j > 0 and math.isfinite(j) else 0.0
                before = prog[w][name]
                prog[w][name] = before + rate * dt
                if prog[w][name] >= 1.0:
                    done[w][name] = seg.start_s + (1.0 - before) / rate
        end = seg.end_s
        prev = t
        if trace is not None:
            trace.append((end, {w: dict(v) for w, v in prog.items()}))
        if end >= horizon_s or all(p in done[w] for w in worlds for p in needed):
            break
    out: dict[str, dict[str, Outcome]] = {}
    for w in worlds:
        out[w] = {}
        for st in states:
            name = st.policy.name
            if name in done[w]:
                out[w][name] = Outcome(done[w][name], True, prog[w][name], st.replans)
            else:
                pr = prog[w][name]
                est = end / pr if pr > 0 else math.inf
                out[w][name] = Outcome(est, False, pr, st.replans)
    return out


# --- the fat-tree with background and moving hotspots ---------------------------------------


@dataclass
class FatTreeScenario:
    name: str = "k4"
    k: int = 4
    workers_per_rack: int = 2  # workers on the first hosts of each rack...
    racks_per_pod: int = 2  # ...of the first racks of every pod
    link_gbps: float = 10.0
    model_bytes: float = 100e6  # ResNet-50's update (examples.MODEL_BYTES)
    compute_s: float = 0.0
    background_load: float = 0.3
    bg_size_alpha: float = 1.2
    bg_size_min_bytes: float = 50e6
    bg_size_max_bytes: float = 2e9
    hotspots: int = 2
    hotspot_streams: int = 8  # long-lived streams per hot link and direction
    # Times are binary fractions, so that the simulator's clock, the INT samples (every
    # interval / 4) and the interval boundaries meet exactly.
    period_s: float = 1.0  # hotspots move (and NetMax re-plans) every period
    interval_s: float = 0.125  # telemetry interval: the fabric is constant within one
    replan_every_s: float | None = None  # NetMax re-plans; None: every period_s
    warmup_s: float = 2.0  # background reaches a steady state before training starts
    horizon_s: float = 300.0

    def workers(self) -> list[str]:
        h = self.k // 2
        if not (1 <= self.workers_per_rack <= h and 1 <= self.racks_per_pod <= h):
            raise ValueError(f"{self.name}: workers_per_rack and racks_per_pod must be 1..{h}")
        return [
            f"h{p}_{i}_{j}"
            for p in range(self.k)
            for i in range(self.racks_per_pod)
            for j in range(self.workers_per_rack)
        ]

    def as_json(self) -> dict:
        return dict(self.__dict__)


def hotspot_link_sets(
    k: int, racks: Collection[str] | None = None
) -> list[tuple[str, list[tuple[str, str]]]]:
    """Link sets a hotspot can take, none of which INT-aware routing can avoid: a pod's
    aggregation-to-core uplinks, or a rack's edge-to-aggregation uplinks (only the racks
    in `racks`, e.g. those with workers: elsewhere a hotspot is on no worker's path)."""
    h = k // 2
    out = []
    for p in range(k):
        out.append(
            (
                f"pod {p} core uplinks",
                [(f"a{p}_{i}", f"c{i * h + j}") for i in range(h) for j in range(h)],
            )
        )
        for i in range(h):
            if racks is None or f"e{p}_{i}" in racks:
                up = [(f"e{p}_{i}", f"a{p}_{j}") for j in range(h)]
                out.append((f"rack e{p}_{i} uplinks", up))
    return out


class FatTreeTimeline:
    """Segments of `interval_s` of a fat-tree under the scenario's background and moving
    hotspots (module docstring); time 0 is the end of the warm-up. Iterate for segments;
    `initial_t` is the fabric of the interval before time 0, `moves` the hotspots'
    (time, link sets) as they happen."""

    def __init__(self, scn: FatTreeScenario, seed: int) -> None:
        self.scn = scn
        self.workers = scn.workers()
        self.topology = fat_tree(scn.k, capacity_gbps=scn.link_gbps)
        self.fabric = Fabric.from_topology(self.topology)
        bg_seq, hs_seq = np.random.SeedSequence([seed, 0x19B]).spawn(2)
        self.sim = Simulator(self.fabric, n_classes=1)
        self.observer = IntObserver(
            self.sim, period_s=scn.interval_s / 4, window_s=scn.interval_s, staleness_s=0.0
        )
        self.background = Background(
            self.sim,
            np.random.default_rng(bg_seq),
            load=scn.background_load,
            size_alpha=scn.bg_size_alpha,
            size_min_bytes=scn.bg_size_min_bytes,
            size_max_bytes=scn.bg_size_max_bytes,
        )
        self.rng = np.random.default_rng(hs_seq)
        self.sets = hotspot_link_sets(scn.k, {self.fabric.attach[w] for w in self.workers})
        if 2 * scn.hotspots > len(self.sets):
            raise ValueError(f"{scn.name}.hotspots: at most {len(self.sets) // 2} on this fabric")
        self.hot: list[int] = []  # indices into self.sets
        self.hot_flows: list[Flow] = []
        self.moves: list[tuple[float, list[str]]] = []
        self.instance = Instance(topology=self.topology, jobs=[])
        self.t0 = scn.warmup_s
        self.observer.start()
        if scn.background_load > 0:
            self.background.start()
        steps = scn.period_s / scn.interval_s
        if abs(steps - round(steps)) > 1e-9 or steps < 1:
            raise ValueError(f"{scn.name}.period_s: must be a multiple of interval_s")
        # Moves at j * period - interval (re-planning at j * period sees the new fabric),
        # on interval boundaries, after the INT sample there: every interval's telemetry
        # shows one hotspot position only.
        self.next_move = -scn.interval_s if scn.hotspots else math.inf
        self._run_to(-scn.interval_s)
        self._run_to(0.0)
        self.initial_t = self.pair_times()

    def _run_to(self, tau: float) -> None:
        self.sim.run(until=self.t0 + tau)
        if tau >= self.next_move - 1e-9:
            self._move()
            self.next_move += self.scn.period_s

    def _move(self) -> None:
        for f in self.hot_flows:
            self.sim.remove(f)
        self.hot_flows = []
        old = set(self.hot)
        choices = [i for i in range(len(self.sets)) if i not in old]
        pick = self.rng.choice(len(choices), size=self.scn.hotspots, replace=False)
        self.hot = [choices[int(i)] for i in pick]
        for i in self.hot:
            for u, v in self.sets[i][1]:
                for e in ((u, v), (v, u)):
                    links = np.array([self.fabric.index[e]])
                    mult = np.array([float(self.scn.hotspot_streams)])
                    self.hot_flows.append(self.sim.add(Flow(links, mult, math.inf, BACKGROUND)))
        self.moves.append((self.sim.t - self.t0, [self.sets[i][0] for i in self.hot]))

    def pair_times(self) -> np.ndarray:
        """Exchange times from the telemetry of the interval that just ended."""
        inst = self.instance.model_copy(update={"telemetry": self.observer.telemetry()})
        return peers.pair_times(inst, self.workers, self.scn.model_bytes)

    def __iter__(self) -> Iterator[Segment]:
        dt = self.scn.interval_s
        for s in itertools.count():
            start = s * dt
            self._run_to(start + dt)  # a move at the end changes the next segment only
            yield Segment(start, start + dt, self.pair_times())


@dataclass
class SimResult:
    scenario: str
    seed: int
    outcomes: dict[str, dict[str, Outcome]]  # world -> policy -> outcome
    moves: list[tuple[float, list[str]]]
    simulated_s: float
    wall_s: float
    trace: list = field(default_factory=list)
    spread: list = field(default_factory=list)  # (end_s, median, max pair time) per segment


def simulate(
    scn: FatTreeScenario,
    seed: int,
    worlds: Mapping[str, tuple[float, float]],
    policies: Sequence[Policy] | None = None,
    *,
    netmax_iters: int = 100,
    keep_trace: bool = False,
) -> SimResult:
    """Every policy's time to target on one seed of the scenario, in every world
    {name: (a, kappa)} (the calibrated model, and any alternatives), with NetMax
    re-planned every `period_s` one telemetry interval after the hotspots move (or every
    `replan_every_s`, from time 0). The
    parameter server, whose time is several times the horizon, does not hold the
    simulation: its time is extrapolated from its progress when the others are done."""
    t0 = time.perf_counter()
    policies = list(policies or default_policies())
    tl = FatTreeTimeline(scn, seed)
    trace: list | None = [] if keep_trace else None
    spread: list = []

    def segs() -> Iterator[Segment]:
        iu = np.triu_indices(len(tl.workers), 1)
        for s in tl:
            if keep_trace:
                v = np.maximum(s.t, s.t.T)[iu]
                spread.append((s.end_s, float(np.median(v)), float(v.max()), float(v.min())))
            yield s

    out = integrate(
        segs(),
        tl.workers,
        policies,
        worlds,
        compute_s=scn.compute_s,
        initial_t=tl.initial_t,
        replan_every_s=scn.replan_every_s or scn.period_s,
        horizon_s=scn.horizon_s,
        netmax_iters=netmax_iters,
        trace=trace,
        extrapolate=[p.name for p in policies if p.kind == "ps"],
    )
    return SimResult(
        scn.name,
        seed,
        out,
        tl.moves,
        tl.sim.t - tl.t0,
        time.perf_counter() - t0,
        trace or [],
        spread,
    )
