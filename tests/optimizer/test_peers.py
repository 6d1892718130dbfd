"""NetMax peer selection (agg_optimizer.peers.selection, docs/peers.md): the probabilities are a
distribution per worker that respects the fabric, reduce to uniform on a uniform fabric,
move towards fast links when one slows, never model worse than uniform peers, and reach
the optimum a brute-force search finds; gossip averaging with them converges to the
optimum of a small convex problem."""

from __future__ import annotations

import numpy as np
import pytest

from agg_optimizer.model.documents import Instance, Job, LinkTelemetry, Telemetry
from agg_optimizer.model.topology import fat_tree
from agg_optimizer.peers import selection as peers

W = [f"w{i}" for i in range(8)]


def _times(n: int, seed: int, lo: float = 0.02, hi: float = 1.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = rng.uniform(lo, hi, (n, n))
    t = (t + t.T) / 2
    np.fill_diagonal(t, np.inf)
    return t


def _racks(slow: float = 1.0) -> np.ndarray:
    t = np.full((8, 8), 0.1)
    for i in range(8):
        for m in range(8):
            if (i < 4) != (m < 4):
                t[i, m] = slow
    np.fill_diagonal(t, np.inf)
    return t


@pytest.mark.parametrize("seed", range(12))
def test_rows_are_distributions_over_other_workers(seed: int) -> None:
    t = _times(8, seed)
    p = peers.plan("netmax", W, t, compute_s=0.05).probabilities
    assert np.allclose(p.sum(axis=1), 1.0) and (p >= 0).all()
    assert (np.diag(p) == 0).all()


def test_unreachable_peers_get_no_probability() -> None:
    t = _times(8, 3)
    cut = [(0, 5), (2, 7), (4, 1)]
    for i, m in cut:
        t[i, m] = t[m, i] = np.inf
    p = peers.plan("netmax", W, t, compute_s=0.05).probabilities
    for i, m in cut:
        assert p[i, m] == 0 and p[m, i] == 0
    assert np.allclose(p.sum(axis=1), 1.0)
    with pytest.raises(peers.PeerError, match=r"^workers: w0 reaches no other worker"):
        t[0, :] = np.inf
        peers.plan("netmax", W, t)


@pytest.mark.parametrize("compute_s", [0.0, 0.05, 1.0])
def test_uniform_fabric_gives_uniform_peers(compute_s: float) -> None:
    t = np.full((8, 8), 0.3)
    np.fill_diagonal(t, np.inf)
    p = peers.plan("netmax", W, t, compute_s=compute_s).probabilities
    assert np.allclose(p, (1 - np.eye(8)) / 7, atol=1e-9)


def test_a_slower_link_loses_probability_to_the_fast_ones() -> None:
    t = _times(8, 5, 0.2, 0.3)
    before = peers.plan("netmax", W, t, compute_s=0.05).probabilities
    t[0, 3] = t[3, 0] = 3.0  # the pair's path got congested
    after = peers.plan("netmax", W, t, compute_s=0.05).probabilities
    assert after[0, 3] < 0.5 * before[0, 3] and after[3, 0] < 0.5 * before[3, 0]
    others = [m for m in range(1, 8) if m != 3]
    assert after[0, others].sum() > before[0, others].sum()


@pytest.mark.parametrize("seed", range(8))
def test_netmax_never_models_worse_than_uniform_peers(seed: int) -> None:
    t = _times(8, seed + 100)
    nm = peers.plan("netmax", W, t, compute_s=0.02)
    ad = peers.plan("adpsgd", W, t, compute_s=0.02)
    assert nm.predicted_s <= ad.predicted_s + 1e-12


@pytest.mark.parametrize("kappa", [0.2, 1.0, 3.0])
def test_netmax_reaches_the_optimum_of_a_search_over_the_symmetric_family(kappa: float) -> None:
    """Two racks of 4, cross-rack 10x slower: by symmetry the optimum gives each worker a
    share a of in-rack peers; a fine search over a gives the optimum NetMax must reach."""
    t, c = _racks(1.0), np.full(8, 0.05)
    best = np.inf
    for a in np.linspace(0.001, 0.999, 2000):
        p = np.where((np.arange(8)[:, None] < 4) == (np.arange(8)[None, :] < 4), a / 3, (1 - a) / 4)
        np.fill_diagonal(p, 0.0)
        best = min(best, peers.evaluate(p, t, c, kappa)[0])
    got = peers.plan("netmax", W, t, compute_s=0.05, kappa=kappa).predicted_s
    assert got <= best * (1 + 1e-6)
    # the less consensus costs, the more it keeps to fast links
    share = peers.plan("netmax", W, t, compute_s=0.05, kappa=kappa).probabilities[0, :4].sum()
    assert share > 3 / 7


def test_gradient_matches_finite_differences() -> None:
    t, c = _times(6, 9), np.full(6, 0.03)
    rng = np.random.default_rng(2)
    p = rng.uniform(size=(6, 6))
    np.fill_diagonal(p, 0)
    p /= p.sum(axis=1, keepdims=True)
    j, parts = peers.evaluate(p, t, c, 1.0)
    g = peers._gradient(p, t, c, 1.0, parts)
    h = 1e-7
    for i, m in [(0, 1), (2, 5), (4, 3), (5, 0)]:
        q = p.copy()
        q[i, m] += h
        num = (peers.evaluate(q, t, c, 1.0)[0] - j) / h
        assert num == pytest.approx(g[i, m], rel=1e-4, abs=1e-9)


def test_baselines_and_bad_input() -> None:
    t = _racks(1.0)
    ar = peers.plan("allreduce", W, t, compute_s=0.05)
    # the ring in this order crosses the racks twice: paced by the slow link
    assert ar.iteration_s[0] == pytest.approx(0.05 + 2 * 7 / 8 * 1.0)
    assert ar.mixing_rate == np.inf and ar.predicted_s == pytest.approx(ar.iteration_s[0] / 8)
    ps = peers.plan("ps", W, t, compute_s=0.05)
    assert ps.predicted_s > ar.predicted_s  # the PS's link carries every model
    pr = peers.plan("prague", W, t, compute_s=0.05, group=4)
    assert 0 < pr.predicted_s < np.inf
    for args, field in (
        (("magic", W, t), "policy"),
        (("netmax", W[:1], t[:1, :1]), "workers"),
        (("netmax", ["a", "a"], t[:2, :2]), "workers"),
    ):
        with pytest.raises(peers.PeerError, match=rf"^{field}: "):
            peers.plan(*args)
    with pytest.raises(peers.PeerError, match=r"^compute_s: "):
        peers.plan("netmax", W, t, compute_s=-1.0)


def test_pair_times_follow_the_fabric_and_its_telemetry() -> None:
    topo = fat_tree(4)
    workers = ["h0_0_0", "h0_0_1", "h1_0_0", "h2_1_1"]
    job = Job(id="j", workers=workers, ps="h3_0_0", update_bytes=10_000_000)
    idle = peers.pair_times(Instance(topology=topo, jobs=[job]), workers, 10_000_000)
    assert idle[0, 1] < idle[0, 2]  # same rack beats another pod (more hops, more delay)
    assert idle[0, 2] == pytest.approx(8e7 / 10e9, rel=0.05)  # 10 MB at 10 Gb/s
    hot = Telemetry(links=[LinkTelemetry(src="h1_0_0", dst="e1_0", utilization=0.9)])
    busy = peers.pair_times(Instance(topology=topo, telemetry=hot, jobs=[job]), workers, 10**7)
    assert busy[2, 0] > 5 * idle[2, 0] and busy[0, 2] == pytest.approx(idle[0, 2])
    p = peers.plan("netmax", workers, busy, compute_s=0.001).probabilities
    q = peers.plan("netmax", workers, idle, compute_s=0.001).probabilities
    assert p[2, 0] + p[2, 1] + p[2, 3] == pytest.approx(1.0)
    assert p[0, 2] < q[0, 2]  # others avoid pulling from the congested uplink's host too
    with pytest.raises(peers.PeerError, match=r"^workers\[1\]: 'nope'"):
        peers.pair_times(Instance(topology=topo, jobs=[job]), ["h0_0_0", "nope"], 1)


def test_gossip_with_netmax_peers_converges_to_the_least_squares_optimum() -> None:
    """Asynchronous decentralized SGD as docs/peers.md models it: a worker picks a peer by
    P, both average their models, then it takes a gradient step on its own data."""
    rng = np.random.default_rng(0)
    n, d = 8, 5
    a = [rng.normal(size=(40, d)) for _ in range(n)]
    x_true = rng.normal(size=d)
    b = [ai @ x_true + 0.1 * rng.normal(size=40) for ai in a]
    x_star = np.linalg.lstsq(np.vstack(a), np.concatenate(b), rcond=None)[0]
    p = peers.plan("netmax", W, _racks(1.0), compute_s=0.05).probabilities
    x = rng.normal(size=(n, d)) * 3
    for k in range(20_000):
        i = k % n
        m = rng.choice(n, p=p[i])
        x[i] = x[m] = (x[i] + x[m]) / 2
        lr = 0.02 / (1 + k / 4000)
        x[i] -= lr * a[i].T @ (a[i] @ x[i] - b[i]) / len(b[i])
    assert np.abs(x - x_star).max() < 0.05, np.abs(x - x_star).max()


def test_cli_prints_the_plan_and_names_a_bad_job(tmp_path) -> None:
    import json
    import subprocess
    import sys

    inst = Instance(
        topology=fat_tree(4),
        jobs=[Job(id="j", workers=["h0_0_0", "h1_0_0", "h2_0_0"], ps="h3_0_0", update_bytes=10**6)],
    )
    path = tmp_path / "inst.json"
    path.write_text(inst.model_dump_json())
    cmd = [sys.executable, "-c", "from agg_optimizer.cli import main; main()", "peers", str(path)]
    r = subprocess.run([*cmd, "--job", "j", "--compute-s", "0.01"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["policy"] == "netmax" and len(out["probabilities"]) == 3
    r = subprocess.run([*cmd, "--job", "x"], capture_output=True, text=True)
    want = f"agg-optimizer: error: --job: no job 'x' in {path}"
    assert r.returncode == 2 and r.stderr.strip() == want
