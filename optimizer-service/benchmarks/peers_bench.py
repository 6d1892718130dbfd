"""Time to a target loss of decentralized training under each peer policy, in a
discrete-event simulation (docs/peers.md, "Measured in simulation").

Not real processes: every worker is a logistic-regression model in numpy, time is
simulated from the fabric's exchange times. What runs for real is the training (gradients,
averaging, non-IID data, the loss); what is modelled is only how long each step takes:

- gossip (netmax, adpsgd): asynchronous; worker i computes for c, picks peer m by P,
  exchanges for t_im (both copies averaged at the end), applies its gradient; repeat.
- allreduce, ps: synchronous rounds of the plan's iteration time; every worker steps,
  then all hold the exact average.
- prague: rounds; random groups of 4 average within the group; the slowest group paces.

Fabrics: two racks of 4 workers whose cross-rack exchange is `--slow` times the in-rack
one, and random heterogeneous pair speeds (log-uniform over `--spread`). The target: every
worker's model within 5% of the way from the initial loss to the optimum (regularised
logistic loss on all workers' data, which are not identically distributed).

    uv run python optimizer-service/benchmarks/peers_bench.py --seeds 5
"""

from __future__ import annotations

import argparse
import heapq
import math
import sys

import numpy as np

from agg_optimizer.peers import selection as peers

N, D, PER = 8, 20, 200  # workers, features, samples per worker


def _data(seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Non-IID: each worker's features are shifted, labels from one true model."""
    rng = np.random.default_rng(seed)
    w_true = rng.normal(size=D)
    xs, ys = [], []
    for _ in range(N):
        x = rng.normal(size=(PER, D)) + rng.normal(scale=1.5, size=D)
        p = 1 / (1 + np.exp(-(x @ w_true) / 3))
        xs.append(x)
        ys.append((rng.random(PER) < p).astype(float))
    return xs, ys


def _loss(w: np.ndarray, xs: list[np.ndarray], ys: list[np.ndarray]) -> float:
    x, y = np.vstack(xs), np.concatenate(ys)
    z = x @ w
    return float(np.mean(np.logaddexp(0, z) - y * z) + 0.5e-2 * w @ w)


def _worst(w: list[np.ndarray], xs: list[np.ndarray], ys: list[np.ndarray]) -> float:
    """The worst worker's model on all the data: every copy must be good, since any one
    of them is the model a user takes away."""
    return max(_loss(wi, xs, ys) for wi in w)


def _grad(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return x.T @ (1 / (1 + np.exp(-(x @ w))) - y) / len(y) + 1e-2 * w


def _optimum(xs: list[np.ndarray], ys: list[np.ndarray]) -> float:
    w = np.zeros(D)
    x, y = np.vstack(xs), np.concatenate(ys)
    for _ in range(3000):
        w -= 0.5 * _grad(w, x, y)
    return _loss(w, xs, ys)


LR = 0.05


def _gossip(p, t, c, xs, ys, target, budget_s, rng) -> float:
    w = [np.zeros(D) for _ in range(N)]
    heap = []
    for i in range(N):
        m = rng.choice(N, p=p[i])
        heapq.heappush(heap, (c + t[i, m], i, m))
    events = 0
    while heap:
        now, i, m = heapq.heappop(heap)
        if now > budget_s:
            return math.inf
        g = _grad(w[i], xs[i], ys[i])
        w[i] = w[m] = (w[i] + w[m]) / 2
        w[i] = w[i] - LR * g
        events += 1
        if events % N == 0 and _worst(w, xs, ys) <= target:
            return now
        nxt = rng.choice(N, p=p[i])
        heapq.heappush(heap, (now + c + t[i, nxt], i, nxt))
    return math.inf


def _rounds(round_s, mix, xs, ys, target, budget_s) -> float:
    w = [np.zeros(D) for _ in range(N)]
    now = 0.0
    while now <= budget_s:
        dt = round_s()  # decides the round's groups, then mixing uses them
        w = [w[i] - LR * _grad(w[i], xs[i], ys[i]) for i in range(N)]
        w = mix(w)
        now += dt
        if _worst(w, xs, ys) <= target:
            return now
    return math.inf


def run(policy: str, t: np.ndarray, c: float, xs, ys, target, budget_s, seed, kappa=1.0):
    rng = np.random.default_rng(seed)
    workers = [f"w{i}" for i in range(N)]
    plan = peers.plan(policy, workers, t, compute_s=c, kappa=kappa)
    if policy in ("netmax", "adpsgd"):
        return _gossip(plan.probabilities, np.maximum(t, t.T), c, xs, ys, target, budget_s, rng)
    if policy in ("allreduce", "ps"):
        T = float(plan.iteration_s[0])

        def exact(w):
            avg = np.mean(w, axis=0)
            return [avg.copy() for _ in w]

        return _rounds(lambda: T, exact, xs, ys, target, budget_s)
    tt = np.maximum(t, t.T)

    state: dict[str, np.ndarray] = {}

    def group_round() -> float:
        order = state["order"] = rng.permutation(N)
        slowest = 0.0
        for s in range(0, N, 4):
            grp = order[s : s + 4]
            ring = max(tt[grp[k], grp[(k + 1) % len(grp)]] for k in range(len(grp)))
            slowest = max(slowest, 2 * (len(grp) - 1) / len(grp) * ring)
        return c + slowest

    def mix(w):
        out = list(w)
        for s in range(0, N, 4):
            grp = state["order"][s : s + 4]
            avg = np.mean([w[k] for k in grp], axis=0)
            for k in grp:
                out[k] = avg.copy()
        return out

    return _rounds(group_round, mix, xs, ys, target, budget_s)


def fabrics(seed: int, slow: float, spread: float) -> dict[str, np.ndarray]:
    base = 0.05
    racks = np.full((N, N), base)
    for i in range(N):
        for m in range(N):
            if (i < N // 2) != (m < N // 2):
                racks[i, m] = base * slow
    rng = np.random.default_rng(seed + 1000)
    het = base * np.exp(rng.uniform(0, math.log(spread), (N, N)))
    het = (het + het.T) / 2
    for t in (racks, het):
        np.fill_diagonal(t, np.inf)
    return {f"two racks, cross x{slow:g}": racks, f"random pairs, spread x{spread:g}": het}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--slow", type=float, default=10.0)
    ap.add_argument("--spread", type=float, default=20.0)
    ap.add_argument("--compute", type=float, default=0.01)
    ap.add_argument("--kappas", default="0.25,1,4")
    args = ap.parse_args()
    kappas = [float(k) for k in args.kappas.split(",")]
    rows = []
    for name, t in fabrics(0, args.slow, args.spread).items():
        res: dict[str, list[float]] = {}
        for seed in range(args.seeds):
            xs, ys = _data(seed)
            opt = _optimum(xs, ys)
            start = _loss(np.zeros(D), xs, ys)
            target = opt + 0.05 * (start - opt)  # 95% of the way from start to optimum
            budget = 2000.0
            for pol in ("adpsgd", "allreduce", "ps", "prague"):
                got = run(pol, t, args.compute, xs, ys, target, budget, seed)
                res.setdefault(pol, []).append(got)
            for k in kappas:
                key = f"netmax (kappa {k:g})"
                res.setdefault(key, []).append(
                    run("netmax", t, args.compute, xs, ys, target, budget, seed, kappa=k)
                )
            print(f"{name}: seed {seed} done", file=sys.stderr)
        base = np.array(res["adpsgd"])
        for pol, v in res.items():
            a = np.array(v)
            ratio = base / a
            rows.append((name, pol, a.mean(), 1.96 * a.std(ddof=1) / math.sqrt(len(a)),
                         ratio.mean(), ratio.min(), ratio.max()))  # fmt: skip
    print(
        "| fabric | policy | time to target (s, simulated) | ±95% "
        "| speed-up vs adpsgd (mean) | min | max |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r[0]} | {r[1]} | {r[2]:.2f} | {r[3]:.2f} "
            f"| {r[4]:.2f}x | {r[5]:.2f}x | {r[6]:.2f}x |"
        )


if __name__ == "__main__":
    main()
