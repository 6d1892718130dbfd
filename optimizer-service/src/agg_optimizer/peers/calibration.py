"""The convergence model of decentralized training, calibrated on measured runs (docs/peers.md;
issue 19, part b).

`peers.evaluate` gives, for a plan P on pair exchange times t,

    J(P; kappa) = 1 / R(P)  +  kappa * g_u / Lam(P)        (synchronous: J = T / n)

and the time to a target loss is modelled as `a * J`. Both parts are linear in
(a, a * kappa), so `calibrate` fits them to measured runs by non-negative least squares on
relative errors (every row divided by its measurement). A run whose fabric changes (its
`phases`) is predicted as `dynamics.integrate` does, where progress reaches 1, and the fit is
then a bounded nonlinear least squares started from the linear one. `leave_one_out` refits
without one policy (or one run) and predicts it: whether the model predicts, or only fits.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from agg_optimizer.peers import selection as peers

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
