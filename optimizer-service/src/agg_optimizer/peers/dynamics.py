"""NetMax on a fabric that changes: the convergence model calibrated on measured runs, and
time to a target loss on a fat-tree whose background traffic and hotspots move
(docs/peers.md; issue 19, part b).

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
import json
import math
import time
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from . import peers
from .documents import Instance
from .sim.core import BACKGROUND, Flow, Simulator
from .sim.fabric import Fabric
from .sim.observe import IntObserver
from .sim.traffic import Background
from .topology import fat_tree

GOSSIP = ("netmax", "adpsgd")

# --- measured runs and the model's terms ----------------------------------------------------


@dataclass
class Phase:
    """From `start_s` (s after the run's start) until the next phase: the fabric's exchange
    times and, for a gossip policy that re-plans, the plan in use."""

    start_s: float
    t: np.ndarray  # n x n exchange times (s); inf on the diagonal and where no path
    probabilities: np.ndarray | None = None


@dataclass
class Run:
    """One measured configuration: a policy on a fabric, the time to target per seed.
    `phases`: a fabric that changes during the run (the first phase is `t` and
    `probabilities` at 0 s); the model's time is then where its progress reaches 1."""

    label: str
    policy: str
    t: np.ndarray  # n x n exchange times (s); inf on the diagonal and where no path
    compute_s: float
    probabilities: np.ndarray | None  # the plan used (gossip policies); None: recomputed
    measured_s: list[float]
    group: int = 4  # prague
    seed: int = 0  # prague's partitions
    phases: list[Phase] | None = None

    @property
    def measured(self) -> float:
        return float(np.mean(self.measured_s))


def _matrix(x: Sequence[Sequence[float | None]], what: str) -> np.ndarray:
    a = np.array([[np.inf if v is None else float(v) for v in row] for row in x], dtype=float)
    if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] < 2:
        raise ValueError(f"{what}: must be an n x n matrix with n >= 2")
    return a


def _plan_matrix(
    x: Sequence[Sequence[float | None]] | None, n: int, what: str
) -> np.ndarray | None:
    if x is None:
        return None
    p = _matrix(x, what)
    if p.shape != (n, n):
        raise ValueError(f"{what}: shape {p.shape}, t is {(n, n)}")
    return p


def load_runs(path: str | Path) -> list[Run]:
    """Runs from a JSON file: {"runs": [{"label", "policy", "t", "compute_s",
    "probabilities", "measured_s"}, ...]} (or the bare list); null entries of `t` are
    inf (the diagonal, unreachable pairs). Optional: "group" and "seed" (prague), and
    "phases": [{"start_s", "t", "probabilities"}, ...] for a fabric that changes during
    the run (the first at 0 s; then `t` and `probabilities` may be left out). Other keys
    (notes, sources) are ignored."""
    doc = json.loads(Path(path).read_text())
    rows = doc["runs"] if isinstance(doc, dict) else doc
    out = []
    for k, r in enumerate(rows):
        where = f"runs[{k}] ({r.get('label', '?')})"
        if r.get("policy") not in peers.POLICIES:
            raise ValueError(f"{where}.policy: unknown {r.get('policy')!r}")
        phases = None
        if r.get("phases"):
            phases = []
            for j, ph in enumerate(r["phases"]):
                t = _matrix(ph["t"], f"{where}.phases[{j}].t")
                p = _plan_matrix(
                    ph.get("probabilities"), len(t), f"{where}.phases[{j}].probabilities"
                )
                phases.append(Phase(float(ph["start_s"]), t, p))
            starts = [ph.start_s for ph in phases]
            if starts[0] != 0.0 or any(b <= a for a, b in itertools.pairwise(starts)):
                raise ValueError(f"{where}.phases: start_s must be 0 first, then increase")
            if len({ph.t.shape for ph in phases}) > 1:
                raise ValueError(f"{where}.phases: every t must have the same workers")
        t = _matrix(r["t"], f"{where}.t") if r.get("t") is not None else None
        if t is None:
            if phases is None:
                raise ValueError(f"{where}.t: missing (and no phases)")
            t = phases[0].t
        p = _plan_matrix(r.get("probabilities"), len(t), f"{where}.probabilities")
        if p is None and phases is not None:
            p = phases[0].probabilities
        m = [float(x) for x in r["measured_s"]]
        if not m or not all(math.isfinite(x) and x > 0 for x in m):
            raise ValueError(f"{where}.measured_s: needs positive finite times")
        out.append(
            Run(
                r["label"],
                r["policy"],
                t,
                float(r.get("compute_s", 0.0)),
                p,
                m,
                int(r.get("group", 4)),
                int(r.get("seed", 0)),
                phases,
            )
        )
    return out


def runs_json(runs: Sequence[Run], **meta: object) -> dict:
    """The file `load_runs` reads (inf written as null)."""

    def mat(a: np.ndarray | None) -> list[list[float | None]] | None:
        if a is None:
            return None
        return [[None if not math.isfinite(v) else float(v) for v in row] for row in a]

    return {
        **meta,
        "runs": [
            {
                "label": r.label,
                "policy": r.policy,
                "t": mat(r.t),
                "compute_s": r.compute_s,
                "probabilities": mat(r.probabilities),
                "measured_s": r.measured_s,
                **({"group": r.group, "seed": r.seed} if r.policy == "prague" else {}),
                **(
                    {
                        "phases": [
                            {
                                "start_s": ph.start_s,
                                "t": mat(ph.t),
                                "probabilities": mat(ph.probabilities),
                            }
                            for ph in r.phases
                        ]
                    }
                    if r.phases
                    else {}
                ),
            }
            for r in runs
        ],
    }


def _names(n: int) -> list[str]:
    return [f"w{i}" for i in range(n)]


def gossip_terms(p: np.ndarray, t: np.ndarray, c: np.ndarray) -> tuple[float, float]:
    """(1/R, g_u/Lam) of plan `p` on symmetric exchange times `t`: J = x1 + kappa * x2
    (x2 inf when the plan does not connect the workers)."""
    _, parts = peers.evaluate(p, t, c, 0.0)
    n = len(c)
    lam = parts["Lam"]
    x2 = (2.0 / (n - 1)) / lam if lam > 1e-12 else math.inf
    return 1.0 / parts["R"], x2


def ps_iteration_s(t: np.ndarray, c: np.ndarray, k: int) -> float:
    """The synchronous PS on worker k (peers.plan's formula, the PS kept in place)."""
    n = len(c)
    return float(c.max() + 2.0 * (n - 1) * max(t[i, k] for i in range(n) if i != k))


def _run_terms(
    run: Run, t: np.ndarray, p: np.ndarray | None, ps_index: int | None
) -> tuple[float, float]:
    n = len(t)
    t = np.maximum(t, t.T)
    c = np.full(n, run.compute_s)
    if run.policy in GOSSIP:
        if p is None:
            if run.policy == "netmax":
                raise ValueError(
                    f"{run.label}: a netmax run needs the probabilities it used (its plan "
                    "depends on the kappa it was planned with)"
                )
            p = peers.plan("adpsgd", _names(n), t, run.compute_s).probabilities
        return gossip_terms(p, t, c)
    if run.policy == "ps" and ps_index is not None:
        return ps_iteration_s(t, c, ps_index) / n, 0.0
    plan = peers.plan(
        run.policy, _names(n), t, run.compute_s, kappa=0.0, group=run.group, seed=run.seed
    )
    if run.policy == "prague":
        return 1.0 / plan.updates_per_s, (2.0 / (n - 1)) / plan.mixing_rate
    return plan.predicted_s, 0.0


def model_terms(run: Run) -> tuple[float, float]:
    """(x1, x2) with J(kappa) = x1 + kappa * x2 for a measured run (module docstring); a
    run with phases: those of its first phase."""
    return _run_terms(run, run.t, run.probabilities, None)


def phase_terms(run: Run) -> list[tuple[float, float, float]]:
    """(start_s, x1, x2) of every phase (one at 0 s for a run without phases). A plan left
    out of a later phase is the previous phase's (a static plan); the PS stays on the
    worker the first phase's plan chose."""
    if not run.phases:
        return [(0.0, *model_terms(run))]
    out = []
    p = run.probabilities
    ps_index = None
    if run.policy == "ps":
        t0 = np.maximum(run.t, run.t.T)
        ps_index = int(peers.plan("ps", _names(len(t0)), t0, run.compute_s).detail["ps_index"])
    for ph in run.phases:
        if ph.probabilities is not None:
            p = ph.probabilities
        out.append((ph.start_s, *_run_terms(run, ph.t, p, ps_index)))
    return out


def predict_time(run: Run, a: float, kappa: float) -> float:
    """The model's time to target: where progress at rate 1 / (a J) reaches 1."""
    done = 0.0
    terms = phase_terms(run)
    for k, (start, x1, x2) in enumerate(terms):
        j = a * (x1 + kappa * x2)
        end = terms[k + 1][0] if k + 1 < len(terms) else math.inf
        if done + (end - start) / j >= 1.0:
            return start + (1.0 - done) * j
        done += (end - start) / j
    return math.inf


# --- calibration ---------------------------------------------------------------------------


@dataclass
class Calibration:
    a: float  # time to target = a * J
    kappa: float
    rows: list[dict]  # label, policy, measured_s, predicted_s, rel_error (fitted rows)
    kappa_fixed: bool = False

    @property
    def rms_rel_error(self) -> float:
        return float(np.sqrt(np.mean([r["rel_error"] ** 2 for r in self.rows])))

    def predict(self, run: Run) -> float:
        return predict_time(run, self.a, self.kappa)

    def as_json(self) -> dict:
        return {
            "a": self.a,
            "kappa": self.kappa,
            "kappa_fixed": self.kappa_fixed,
            "rms_rel_error": self.rms_rel_error,
            "rows": self.rows,
        }


def _fit(xs: np.ndarray, y: np.ndarray, kappa: float | None) -> tuple[float, float]:
    """min sum ((a x1 + b x2 - y) / y)^2 over a, b >= 0; (a, b / a). `kappa` given: a only."""
    if kappa is not None:
        z = (xs[:, 0] + kappa * xs[:, 1]) / y
        return float(z.sum() / (z @ z)), kappa
    a_mat = xs / y[:, None]
    sol, _ = nnls(a_mat, np.ones(len(y)))
    a, b = float(sol[0]), float(sol[1])
    if a <= 0:
        raise ValueError("calibrate: the fit gives a = 0 (the runs do not pin the model)")
    return a, b / a


def _fit_phased(
    runs: Sequence[Run], y: np.ndarray, start: tuple[float, float], kappa: float | None
) -> tuple[float, float]:
    """The same least squares when some runs change fabric: the model's time is no longer
    linear in (a, a kappa), so a bounded nonlinear fit from the linear fit's solution."""
    from scipy.optimize import least_squares

    def resid(theta: np.ndarray) -> np.ndarray:
        a, k = math.exp(theta[0]), (theta[1] if kappa is None else kappa)
        return np.array([predict_time(r, a, k) for r in runs]) / y - 1.0

    if kappa is None:
        x0 = [math.log(start[0]), start[1]]
        sol = least_squares(resid, x0, bounds=([-np.inf, 0.0], [np.inf, np.inf]))
        return math.exp(sol.x[0]), float(sol.x[1])
    sol = least_squares(resid, [math.log(start[0])])
    return math.exp(sol.x[0]), kappa


def calibrate(
    runs: Sequence[Run], *, kappa: float | None = None, measured: Sequence[float] | None = None
) -> Calibration:
    """Fit a > 0 and kappa >= 0 (or only a, for a given `kappa`) to the runs' mean
    measured times: non-negative least squares on relative error (nonlinear when a run
    has phases). `measured` overrides the runs' means (bootstrap)."""
    if not runs:
        raise ValueError("calibrate: no runs")
    xs = np.array([model_terms(r) for r in runs])
    y = np.array(measured if measured is not None else [r.measured for r in runs], dtype=float)
    for r in runs:
        if not all(math.isfinite(x1) and math.isfinite(x2) for _, x1, x2 in phase_terms(r)):
            raise ValueError(f"{r.label}: its plan does not connect the workers (J is infinite)")
    a, k = _fit(xs, y, kappa)
    if any(r.phases for r in runs):
        a, k = _fit_phased(runs, y, (a, k), kappa)
    cal = Calibration(a, k, [], kappa_fixed=kappa is not None)
    for r, m in zip(runs, y, strict=True):
        pred = cal.predict(r)
        cal.rows.append(
            {
                "label": r.label,
                "policy": r.policy,
                "measured_s": float(m),
                "predicted_s": pred,
                "rel_error": (pred - m) / m,
            }
        )
    return cal


def leave_one_out(runs: Sequence[Run], by: str = "policy") -> list[dict]:
    """Refit without each policy (`by="policy"`) or each run (`by="label"`) and predict
    the runs left out: {"left_out", "a", "kappa", "rows": [label, measured_s, predicted_s,
    rel_error]}. A fold whose remaining runs cannot fit the model reports the error."""
    keys = list(dict.fromkeys(getattr(r, by) for r in runs))
    out = []
    for key in keys:
        train = [r for r in runs if getattr(r, by) != key]
        test = [r for r in runs if getattr(r, by) == key]
        fold: dict = {"left_out": key}
        try:
            cal = calibrate(train)
        except ValueError as e:
            fold["error"] = str(e)
            out.append(fold)
            continue
        fold |= {"a": cal.a, "kappa": cal.kappa, "rows": []}
        for r in test:
            pred = cal.predict(r)
            fold["rows"].append(
                {
                    "label": r.label,
                    "measured_s": r.measured,
                    "predicted_s": pred,
                    "rel_error": (pred - r.measured) / r.measured,
                }
            )
        out.append(fold)
    return out


def bootstrap(runs: Sequence[Run], n: int = 2000, seed: int = 0) -> dict:
    """(a, kappa) refitted on the runs' seeds resampled with replacement: 2.5, 50 and 97.5
    percentiles, and the share of fits with kappa at its bound 0."""
    rng = np.random.default_rng(seed)
    fits = []
    for _ in range(n):
        m = [float(np.mean(rng.choice(r.measured_s, len(r.measured_s)))) for r in runs]
        try:
            c = calibrate(runs, measured=m)
        except ValueError:
            continue
        fits.append((c.a, c.kappa))
    f = np.array(fits)
    pct = [2.5, 50.0, 97.5]
    return {
        "resamples": len(f),
        "a": np.percentile(f[:, 0], pct).tolist(),
        "kappa": np.percentile(f[:, 1], pct).tolist(),
        "kappa_zero_share": float(np.mean(f[:, 1] <= 1e-9)),
    }


def kappa_profile(runs: Sequence[Run], kappas: Iterable[float]) -> list[dict]:
    """For each fixed kappa, the best a and the fit's RMS relative error."""
    out = []
    for k in kappas:
        c = calibrate(runs, kappa=k)
        out.append(
            {
                "kappa": k,
                "a": c.a,
                "rms_rel_error": c.rms_rel_error,
                "rows": {r["label"]: r["rel_error"] for r in c.rows},
            }
        )
    return out


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
