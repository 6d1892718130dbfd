"""Peer selection for decentralized training (NetMax, ICDE 2021), from the fabric's
telemetry: docs/peers.md gives the model in full.

Every worker i, per iteration, computes for c_i seconds, picks one peer m with probability
p_im, exchanges models with it in t_im seconds (the model's bytes over the pair's path at
its measured residual rate, plus the path's delay; both directions at once, so the slower
one) and both keep the average. So:

    T_i(P)   = c_i + sum_m p_im t_im             worker i's mean iteration time
    R(P)     = sum_i 1 / T_i                     gradient steps per second, all workers
    lam_im   = p_im / T_i + p_mi / T_m           averagings per second on the pair {i, m}
    Lam(P)   = 2nd smallest eigenvalue of the Laplacian with edge weights lam
               (how fast the models agree: disagreement decays like exp(-Lam t))

and the time to a target loss is modelled as

    J(P) = 1 / R(P)  +  kappa * g_u / Lam(P),    g_u = 2 / (n - 1)

seconds per unit of training progress: the time of one gradient step of the whole group,
plus the cost of the models disagreeing. `g_u` makes `kappa` the extra cost of consensus
for uniform peers on a uniform fabric (there J = (1 + kappa) T / n); kappa is calibrated
on measured runs (docs/peers.md). NetMax chooses P to minimise J: fast links raise R and
are favoured, while Lam keeps every worker mixed with the rest. We minimise J by projected
gradient descent over the rows of P (each on the simplex of the worker's reachable peers;
Lam's gradient from its eigenvector), from uniform peers and from time-weighted ones,
keeping the best. On a uniform fabric uniform peers are optimal and returned unchanged.

Baselines behind the same interface: `adpsgd` (uniform peers), `allreduce` (synchronous
ring all-reduce), `ps` (synchronous parameter server), `prague` (random groups with partial
all-reduce).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from agg_optimizer.model.documents import Instance
from agg_optimizer.model.network import Network

POLICIES = ("netmax", "adpsgd", "allreduce", "ps", "prague")
DEFAULT_KAPPA = 1.0


class PeerError(ValueError):
    """Bad input, naming the field."""


@dataclass
class PeerPlan:
    policy: str
    workers: list[str]
    probabilities: np.ndarray  # n x n, rows sum to 1 (gossip policies), else empty
    iteration_s: np.ndarray  # each worker's mean iteration time
    predicted_s: float  # J: modelled seconds per unit of training progress
    updates_per_s: float
    mixing_rate: float  # Lam, 1/s (inf: exact averaging)
    detail: dict[str, float] = field(default_factory=dict)

    def as_json(self) -> dict:
        return {
            "policy": self.policy,
            "workers": self.workers,
            "probabilities": {
                w: {self.workers[m]: round(float(p), 6) for m, p in enumerate(row) if p > 0}
                for w, row in zip(self.workers, self.probabilities, strict=False)
            },
            "iteration_s": {
                w: float(t) for w, t in zip(self.workers, self.iteration_s, strict=True)
            },
            "predicted_s": self.predicted_s,
            "updates_per_s": self.updates_per_s,
            "mixing_rate": self.mixing_rate,
            **({"detail": self.detail} if self.detail else {}),
        }


# --- the fabric: exchange times between workers ---------------------------------------------


def pair_times(inst: Instance, workers: Sequence[str], model_bytes: float) -> np.ndarray:
    """t_im: seconds to send `model_bytes` from worker i to worker m over the INT-aware
    shortest path (bottleneck residual rate, plus the path's delay); inf where no path."""
    net = Network.from_instance(inst)
    for k, w in enumerate(workers):
        if w not in net.attach:
            raise PeerError(f"workers[{k}]: {w!r} is not a host of the topology")
    n = len(workers)
    sw = [net.attach[w] for w in workers]
    ids = net.switch_ids
    row = net.next_hops(sorted(set(sw)), int_aware=True)  # per destination switch
    bits = 8.0 * model_bytes
    t = np.full((n, n), np.inf)
    for i in range(n):
        for m in range(n):
            if i == m:
                continue
            a, b = sw[i], sw[m]
            links = [(workers[i], a)]
            v = net.sw_index[a]
            while ids[v] != b and row[b][v] >= 0:
                links.append((ids[v], ids[row[b][v]]))
                v = row[b][v]
            if ids[v] != b:
                continue  # no path
            links.append((b, workers[m]))
            rate = min(net.resid[e] for e in links)
            t[i, m] = bits / rate + sum(net.delay[e] for e in links)
    return t


# --- the model ------------------------------------------------------------------------------


def _laplacian(lam: np.ndarray) -> np.ndarray:
    w = lam + lam.T  # lam holds directed contributions p_im / T_i
    return np.diag(w.sum(axis=1)) - w


def evaluate(p: np.ndarray, t: np.ndarray, c: np.ndarray, kappa: float) -> tuple[float, dict]:
    """J(P) and its parts (module docstring)."""
    n = len(c)
    tt = np.where(np.isfinite(t), t, 0.0)
    T = c + (p * tt).sum(axis=1)
    R = float((1.0 / T).sum())
    directed = p / T[:, None]
    vals, vecs = np.linalg.eigh(_laplacian(directed))
    lam2 = float(vals[1]) if n > 1 else np.inf
    g_u = 2.0 / (n - 1) if n > 1 else 0.0
    if lam2 <= 1e-12:
        return np.inf, {"T": T, "R": R, "Lam": lam2, "v": vecs[:, 1] if n > 1 else None}
    J = 1.0 / R + kappa * g_u / lam2
    return J, {"T": T, "R": R, "Lam": lam2, "v": vecs[:, 1]}


def _gradient(p: np.ndarray, t: np.ndarray, c: np.ndarray, kappa: float, parts: dict) -> np.ndarray:
    """dJ/dp_im, with Lam's derivative from its (simple) eigenvector v:
    dLam/dlam_e = (v_i - v_m)^2."""
    n = len(c)
    tt = np.where(np.isfinite(t), t, 0.0)
    T, R, lam2, v = parts["T"], parts["R"], parts["Lam"], parts["v"]
    g_u = 2.0 / (n - 1)
    d2 = (v[:, None] - v[None, :]) ** 2  # (v_i - v_k)^2
    # dLam/dp_im = d2[i,m] / T_i - t_im / T_i^2 * sum_k p_ik d2[i,k]
    s = (p * d2).sum(axis=1)
    dlam = d2 / T[:, None] - tt * (s / T**2)[:, None]
    dR = -tt / T[:, None] ** 2
    return -dR / R**2 - kappa * g_u / lam2**2 * dlam


def _project_rows(y: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Euclidean projection of each row onto the simplex of its allowed entries (every row
    has one), all rows at once: sort descending, the largest k whose u_k exceeds
    (sum of the top k - 1) / k sets the threshold."""
    n = y.shape[1]
    u = -np.sort(-np.where(allowed, y, -np.inf), axis=1)  # disallowed sort last
    real = np.isfinite(u)
    css = np.cumsum(np.where(real, u, 0.0), axis=1) - 1.0
    ok = real & (u - css / np.arange(1, n + 1) > 0)  # the first entry always is
    r = n - 1 - np.argmax(ok[:, ::-1], axis=1)
    theta = css[np.arange(len(y)), r] / (r + 1.0)
    return np.where(allowed, np.maximum(y - theta[:, None], 0.0), 0.0)


def netmax(
    t: np.ndarray, c: np.ndarray, kappa: float = DEFAULT_KAPPA, iters: int = 400
) -> np.ndarray:
    """P minimising J by projected gradient descent with backtracking, from uniform peers
    and from peers weighted by 1/t; the better end point."""
    n = len(c)
    allowed = np.isfinite(t) & ~np.eye(n, dtype=bool)
    uniform = allowed / allowed.sum(axis=1, keepdims=True)
    inv = np.where(allowed, 1.0 / np.where(allowed, t, 1.0), 0.0)
    starts = [uniform, inv / inv.sum(axis=1, keepdims=True)]
    best, best_j = uniform, evaluate(uniform, t, c, kappa)[0]
    for p in starts:
        j, parts = evaluate(p, t, c, kappa)
        if not np.isfinite(j):
            continue
        step = 0.05 / max(float(np.abs(_gradient(p, t, c, kappa, parts)).max()), 1e-300)
        # No descent within 40 halvings of the first step: a stationary point (a uniform
        # fabric), not worth the ~1000 halvings down to underflow it used to take.
        floor = step * 1e-12
        for _ in range(iters):
            g = _gradient(p, t, c, kappa, parts)
            while True:
                q = _project_rows(p - step * g, allowed)
                jq, pq = evaluate(q, t, c, kappa)
                if jq < j or step < floor:
                    break
                step *= 0.5
            if not jq < j:
                break
            gain = j - jq
            p, j, parts = q, jq, pq
            if gain < 1e-10 * j:
                break
            step *= 1.5
        if j < best_j:
            best, best_j = p, j
    return best


# --- policies -------------------------------------------------------------------------------


def plan(
    policy: str,
    workers: Sequence[str],
    t: np.ndarray,
    compute_s: float | Sequence[float] = 0.0,
    kappa: float = DEFAULT_KAPPA,
    group: int = 4,
    seed: int = 0,
) -> PeerPlan:
    """Peers of `workers` under `policy` given the exchange times `t` (pair_times)."""
    n = len(workers)
    if policy not in POLICIES:
        raise PeerError(f"policy: unknown {policy!r}; one of {', '.join(POLICIES)}")
    if n < 2:
        raise PeerError(f"workers: {n} worker(s); peers need at least 2")
    if len(set(workers)) != n:
        raise PeerError("workers: a worker is listed twice")
    c = np.broadcast_to(np.asarray(compute_s, dtype=float), (n,)).copy()
    if (c < 0).any() or not np.isfinite(c).all():
        raise PeerError("compute_s: must be finite and non-negative")
    # An exchange sends both models (both keep the average): the slower direction paces it.
    t = np.asarray(t, dtype=float)
    t = np.maximum(t, t.T)
    unreachable = [
        (workers[i], workers[m])
        for i in range(n)
        for m in range(n)
        if i != m and not np.isfinite(t[i, m])
    ]
    if policy in ("netmax", "adpsgd"):
        allowed = np.isfinite(t) & ~np.eye(n, dtype=bool)
        lonely = [workers[i] for i in range(n) if not allowed[i].any()]
        if lonely:
            raise PeerError(f"workers: {lonely[0]} reaches no other worker")
        p = allowed / allowed.sum(axis=1, keepdims=True)
        if policy == "netmax":
            p = netmax(t, c, kappa)
        j, parts = evaluate(p, t, c, kappa)
        return PeerPlan(policy, list(workers), p, parts["T"], j, parts["R"], parts["Lam"])
    if unreachable:
        raise PeerError(f"workers: no path from {unreachable[0][0]} to {unreachable[0][1]}")
    if policy == "allreduce":
        # Ring in the given order: 2 (n - 1) steps of 1/n of the model, paced by the
        # slowest ring link; every worker then holds the exact average.
        ring = [t[i, (i + 1) % n] for i in range(n)]
        T = float(c.max() + 2.0 * (n - 1) / n * max(ring))
        return _sync(policy, workers, T, n)
    if policy == "ps":
        # Worker 0's position hosts nothing special: the PS is the best-connected worker;
        # n models in and n out over its link.
        cost = [max(t[i, k] for i in range(n) if i != k) for k in range(n)]
        k = int(np.argmin(cost))
        T = float(c.max() + 2.0 * (n - 1) * cost[k])
        return _sync(policy, workers, T, n, {"ps_index": float(k)})
    # prague: random groups of `group` workers each iteration, ring all-reduce inside each;
    # the iteration time is the slowest group's, averaged over random partitions.
    rng = np.random.default_rng(seed)
    g = max(2, min(group, n))
    samples = []
    for _ in range(64):
        order = rng.permutation(n)
        slowest = 0.0
        for s in range(0, n, g):
            grp = order[s : s + g]
            if len(grp) < 2:
                continue
            ring = max(t[grp[i], grp[(i + 1) % len(grp)]] for i in range(len(grp)))
            slowest = max(slowest, 2.0 * (len(grp) - 1) / len(grp) * ring)
        samples.append(slowest)
    T = float(c.max() + np.mean(samples))
    # Each worker averages with g - 1 random others per iteration: pairwise averaging rate
    # 2 (g - 1) / ((n - 1) T) on every pair, i.e. g - 1 times uniform gossip's.
    lam = 2.0 * (g - 1) / ((n - 1) * T)
    Lam = n * lam
    R = n / T
    j = 1.0 / R + kappa * (2.0 / (n - 1)) / Lam
    return PeerPlan(policy, list(workers), np.zeros((0, 0)), np.full(n, T), j, R, Lam,
                    {"group": float(g)})  # fmt: skip


def _sync(
    policy: str, workers: Sequence[str], T: float, n: int, detail: dict | None = None
) -> PeerPlan:
    # Exact averaging every iteration: n gradient steps per T, no disagreement term.
    return PeerPlan(
        policy, list(workers), np.zeros((0, 0)), np.full(n, T), T / n, n / T, np.inf,
        detail or {},
    )  # fmt: skip
