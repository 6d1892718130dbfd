"""NetMax on a changing fabric (agg_optimizer.peers.dynamics, docs/peers.md): the
calibration recovers the model it was given, progress integrates as computed by hand,
NetMax equals uniform peers on a uniform fabric, re-planning beats a stale plan when a
hotspot lands on the links that plan favours, and the fat-tree's hotspots move and slow
exactly the pairs whose paths they sit on."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from agg_optimizer.peers import calibration as pcal
from agg_optimizer.peers import dynamics as pdyn
from agg_optimizer.peers import selection as peers

ROOT = Path(__file__).resolve().parents[2]


def _racks(n: int, inside: float, across: float) -> np.ndarray:
    t = np.full((n, n), across)
    for i in range(n):
        for m in range(n):
            if (i < n // 2) == (m < n // 2):
                t[i, m] = inside
    np.fill_diagonal(t, np.inf)
    return t


def _random(n: int, seed: int, spread: float = 20.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = 0.05 * np.exp(rng.uniform(0, math.log(spread), (n, n)))
    t = np.maximum(t, t.T)
    np.fill_diagonal(t, np.inf)
    return t


def _uniform(n: int, v: float) -> np.ndarray:
    t = np.full((n, n), v)
    np.fill_diagonal(t, np.inf)
    return t


def _synthetic_runs(a: float, kappa: float, noise: float = 0.0, seed: int = 0) -> list[pcal.Run]:
    """Runs whose times the model itself generates (times a seed's noise)."""
    rng = np.random.default_rng(seed)
    names = [f"w{i}" for i in range(8)]
    out = []
    fabrics = {
        "racks x10": _racks(8, 0.03, 0.3),
        "racks x3": _racks(8, 0.05, 0.15),
        "random": _random(8, 4),
    }
    for fname, t in fabrics.items():
        cases: list[tuple[str, np.ndarray | None]] = [("adpsgd", None)]
        for k in (0.05, 0.5, 3.0):
            cases.append(("netmax", peers.plan("netmax", names, t, 0.01, kappa=k).probabilities))
        cases += [("allreduce", None), ("ps", None), ("prague", None)]
        for policy, p in cases:
            run = pcal.Run(f"{fname} {policy} {len(out)}", policy, t, 0.01, p, [1.0])
            x1, x2 = pcal.model_terms(run)
            true = a * (x1 + kappa * x2)
            run.measured_s = [true * (1 + noise * rng.standard_normal()) for _ in range(3)]
            out.append(run)
    return out


@pytest.mark.parametrize(("a", "kappa"), [(500.0, 0.3), (1200.0, 1.0), (80.0, 0.0), (40.0, 4.0)])
def test_calibration_recovers_a_and_kappa_from_the_models_own_runs(a: float, kappa: float) -> None:
    runs = _synthetic_runs(a, kappa)
    cal = pcal.calibrate(runs)
    assert cal.a == pytest.approx(a, rel=1e-6)
    assert cal.kappa == pytest.approx(kappa, rel=1e-6, abs=1e-9)
    assert cal.rms_rel_error < 1e-8
    for fold in pcal.leave_one_out(runs, "policy"):
        for r in fold["rows"]:
            assert abs(r["rel_error"]) < 1e-6, (fold["left_out"], r)


def test_calibration_with_noise_stays_close() -> None:
    runs = _synthetic_runs(700.0, 0.5, noise=0.05, seed=3)
    cal = pcal.calibrate(runs)
    assert cal.a == pytest.approx(700.0, rel=0.1)
    assert cal.kappa == pytest.approx(0.5, rel=0.25)
    boot = pcal.bootstrap(runs, n=200)
    assert boot["kappa"][0] <= 0.5 <= boot["kappa"][2]


def test_fixed_kappa_fits_a_only() -> None:
    runs = _synthetic_runs(300.0, 1.0)
    assert pcal.calibrate(runs, kappa=1.0).a == pytest.approx(300.0, rel=1e-9)
    worse = pcal.calibrate(runs, kappa=0.0)
    assert worse.kappa == 0.0 and worse.rms_rel_error > 0.05


def test_runs_file_round_trips_and_netmax_needs_its_plan(tmp_path: Path) -> None:
    runs = _synthetic_runs(100.0, 0.2)
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(pcal.runs_json(runs, note="synthetic")))
    back = pcal.load_runs(path)
    assert [r.label for r in back] == [r.label for r in runs]
    assert pcal.calibrate(back).kappa == pytest.approx(0.2, rel=1e-6)
    doc = json.loads(path.read_text())
    netmax = next(r for r in doc["runs"] if r["policy"] == "netmax")
    netmax["probabilities"] = None
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="needs the probabilities it used"):
        pcal.calibrate(pcal.load_runs(path))
    doc["runs"][0]["measured_s"] = []
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"runs\[0\].*measured_s"):
        pcal.load_runs(path)


def test_the_recorded_real_process_runs_load_and_fit() -> None:
    runs = pcal.load_runs(ROOT / "docs" / "peers" / "calibration-runs.json")
    assert {r.policy for r in runs} >= {"adpsgd", "netmax", "allreduce"}
    cal = pcal.calibrate(runs)
    assert cal.a > 0 and cal.kappa >= 0
    assert all(abs(r["rel_error"]) < 0.5 for r in cal.rows)


# --- progress on a piecewise-constant fabric ------------------------------------------------


def _segments(phases: list[tuple[float, float, np.ndarray]], step: float) -> list[pdyn.Segment]:
    """[start, end) phases cut into segments of `step`."""
    out = []
    for start, end, t in phases:
        s = start
        while s < end - 1e-12:
            out.append(pdyn.Segment(s, min(s + step, end), t))
            s += step
    return out


def test_progress_integrates_as_computed_by_hand() -> None:
    # 4 workers, every exchange 0.1 s for a second, then 0.2 s; a = 40, kappa = 1, no compute.
    n, a, kappa = 4, 40.0, 1.0
    segs = _segments([(0.0, 1.0, _uniform(n, 0.1)), (1.0, 30.0, _uniform(n, 0.2))], 0.25)
    pols = [pdyn.Policy(k, k) for k in ("adpsgd", "allreduce", "ps", "prague")]
    out = pdyn.integrate(segs, [f"w{i}" for i in range(n)], pols, {"w": (a, kappa)})["w"]
    # adpsgd: T = t, R = n / t, Lam = n * 2 / ((n - 1) t): J = (1 + kappa) t / n
    #   = 0.05 (rate 1/(a J) = 0.5) for 1 s, then 0.1 (rate 0.25): 0.5 left takes 2 s.
    assert out["adpsgd"].time_s == pytest.approx(3.0)
    # ring all-reduce: T = 2 (n-1)/n t = 0.15 then 0.3; J = T / n; rates 2/3 then 1/3.
    assert out["allreduce"].time_s == pytest.approx(2.0)
    # PS: T = 2 (n-1) t = 0.6 then 1.2; rates 1/6 then 1/12: 5/6 left takes 10 s.
    assert out["ps"].time_s == pytest.approx(11.0)
    # prague, one group of 4: T = 1.5 t, Lam = n * 2 (g-1) / ((n-1) T), J = T/n + g_u/Lam
    #   = 0.0375 + 0.0125 = 0.05 then 0.1: as adpsgd.
    assert out["prague"].time_s == pytest.approx(3.0)
    assert all(o.finished for o in out.values())
    # stopped at 2 s: adpsgd has 0.75 of the way; its time is extrapolated at its mean rate
    cut = pdyn.integrate(
        segs, [f"w{i}" for i in range(n)], pols[:1], {"w": (a, kappa)}, horizon_s=2.0
    )["w"]["adpsgd"]
    assert not cut.finished and cut.progress == pytest.approx(0.75)
    assert cut.time_s == pytest.approx(2.0 / 0.75)


def test_worlds_are_independent() -> None:
    segs = _segments([(0.0, 50.0, _racks(8, 0.03, 0.3))], 0.5)
    w = [f"w{i}" for i in range(8)]
    pols = pdyn.default_policies([0.3])
    both = pdyn.integrate(segs, w, pols, {"x": (200.0, 0.0), "y": (90.0, 2.0)})
    for name, world in (("x", (200.0, 0.0)), ("y", (90.0, 2.0))):
        alone = pdyn.integrate(segs, w, pols, {name: world})[name]
        for p, o in alone.items():
            assert both[name][p].time_s == pytest.approx(o.time_s, rel=1e-12)


@pytest.mark.parametrize("kappa", [0.0, 0.1, 1.0])
def test_netmax_equals_adpsgd_on_a_static_uniform_fabric(kappa: float) -> None:
    segs = _segments([(0.0, 100.0, _uniform(8, 0.08))], 0.25)
    pols = [p for p in pdyn.default_policies([0.1, 1.0]) if p.kind in pdyn.GOSSIP]
    out = pdyn.integrate(
        segs,
        [f"w{i}" for i in range(8)],
        pols,
        {"w": (200.0, kappa)},
        replan_every_s=1.0,
    )["w"]
    base = out["adpsgd"].time_s
    assert out["adpsgd"].finished
    for p in ("netmax (kappa 0.1)", "netmax-static (kappa 0.1)", "netmax (kappa 1)"):
        assert out[p].time_s == pytest.approx(base, rel=1e-9)


def test_netmax_equals_adpsgd_on_an_idle_fat_tree() -> None:
    # No background, no hotspots: every pair's bottleneck is a 10 Gb/s link; paths differ
    # only by microseconds of delay.
    scn = pdyn.FatTreeScenario(
        k=4, background_load=0.0, hotspots=0, warmup_s=0.25, model_bytes=10e6
    )
    tl = pdyn.FatTreeTimeline(scn, 0)
    segs = [s for s, _ in zip(tl, range(40), strict=False)]
    pols = [pdyn.Policy("netmax", "netmax", True, 0.1), pdyn.Policy("adpsgd", "adpsgd")]
    out = pdyn.integrate(segs, tl.workers, pols, {"w": (1000.0, 0.1)}, initial_t=tl.initial_t)
    assert out["w"]["adpsgd"].finished
    assert out["w"]["netmax"].time_s == pytest.approx(out["w"]["adpsgd"].time_s, rel=1e-3)


def test_replanning_beats_the_static_plan_when_the_hotspot_moves_onto_its_links() -> None:
    # Two racks, slow across: the static plan leans on in-rack links. At 2 s a hotspot
    # lands on every in-rack link: now in-rack is 10x slower than across.
    n, w = 8, [f"w{i}" for i in range(8)]
    before, after = _racks(n, 0.03, 0.3), _racks(n, 0.3, 0.03)
    segs = _segments([(0.0, 2.0, before), (2.0, 200.0, after)], 0.125)
    kappa = 0.3
    pols = [
        pdyn.Policy("replan", "netmax", True, kappa),
        pdyn.Policy("static", "netmax", False, kappa),
        pdyn.Policy("adpsgd", "adpsgd"),
    ]
    out = pdyn.integrate(segs, w, pols, {"w": (400.0, kappa)}, replan_every_s=1.0)["w"]
    static = peers.plan("netmax", w, before, kappa=kappa).probabilities
    assert static[0, :4].sum() > 0.8  # it did favour the in-rack links
    assert out["replan"].replans >= 1 and out["static"].replans == 0
    assert out["replan"].finished and out["replan"].time_s > 2.5  # the move mattered
    assert out["replan"].time_s < out["adpsgd"].time_s < out["static"].time_s
    assert out["static"].time_s / out["replan"].time_s > 2.0


@pytest.mark.parametrize("seed", range(6))
def test_replanning_is_never_slower_than_static_when_the_favoured_links_slow(seed: int) -> None:
    n, w = 8, [f"w{i}" for i in range(8)]
    kappa = [0.1, 0.5, 1.0][seed % 3]
    before = _random(n, seed)
    p = peers.plan("netmax", w, before, kappa=kappa).probabilities
    favoured = (p + p.T) > np.median((p + p.T)[~np.eye(n, dtype=bool)])
    after = np.where(favoured, before * 10.0, before)
    segs = _segments([(0.0, 1.0, before), (1.0, 500.0, after)], 0.25)
    a = 100.0  # the target some 10-30 s in: several re-plans after the move
    pols = [
        pdyn.Policy("replan", "netmax", True, kappa),
        pdyn.Policy("static", "netmax", False, kappa),
    ]
    out = pdyn.integrate(segs, w, pols, {"w": (a, kappa)}, replan_every_s=2.0)["w"]
    assert out["replan"].time_s > 3.0 and out["replan"].replans >= 1
    assert out["replan"].finished and out["static"].finished
    assert out["replan"].time_s <= out["static"].time_s * (1 + 1e-9)


# --- the fat-tree's hotspots ----------------------------------------------------------------


def test_fat_tree_hotspots_move_every_period_and_slow_the_pairs_they_sit_between() -> None:
    scn = pdyn.FatTreeScenario(
        k=4, background_load=0.0, hotspots=1, hotspot_streams=8, period_s=0.5, warmup_s=0.5
    )
    tl = pdyn.FatTreeTimeline(scn, 7)
    idle = 8.0 * scn.model_bytes / (scn.link_gbps * 1e9)
    pod = {w: int(w[1]) for w in tl.workers}
    rack = {w: w.rsplit("_", 1)[0] for w in tl.workers}
    n = len(tl.workers)
    checked = 0
    for seg, _ in zip(tl, range(24), strict=False):
        live = [m for m in tl.moves if m[0] <= seg.start_s + 1e-9][-1]
        (where,) = live[1]
        t = np.maximum(seg.t, seg.t.T)
        for i in range(n):
            for m in range(i + 1, n):
                a, b = tl.workers[i], tl.workers[m]
                if where.startswith("pod"):
                    p = int(where.split()[1])
                    hot = pod[a] != pod[b] and p in (pod[a], pod[b])
                else:
                    r = "h" + where.split()[1][1:]  # rack e1_0 holds hosts h1_0_*
                    hot = (rack[a] == r) != (rack[b] == r)
                if hot:  # 8 streams on the link: a ninth gets 1/9 of it, in every interval
                    assert 8.9 * idle < t[i, m] < 9.1 * idle, (seg.start_s, where, a, b)
                else:
                    assert t[i, m] < 1.01 * idle, (seg.start_s, where, a, b)
                checked += 1
    times = [m[0] for m in tl.moves]
    assert times[0] == pytest.approx(-scn.interval_s)
    assert np.allclose(np.diff(times), scn.period_s)
    assert all(x[1] != y[1] for x, y in zip(tl.moves, tl.moves[1:], strict=False))
    assert checked == 24 * n * (n - 1) // 2


# --- runs whose fabric changes --------------------------------------------------------------


def _phased(policy: str, p0: np.ndarray | None, p1: np.ndarray | None) -> pcal.Run:
    before, after = _racks(8, 0.03, 0.3), _racks(8, 0.3, 0.03)
    phases = [pcal.Phase(0.0, before, p0), pcal.Phase(4.0, after, p1)]
    return pcal.Run(
        f"moving {policy} {p1 is not None}", policy, before, 0.0, p0, [1.0], phases=phases
    )


def test_a_phased_runs_predicted_time_is_the_integrated_one() -> None:
    w = [f"w{i}" for i in range(8)]
    a, kappa = 300.0, 0.4
    static = peers.plan("netmax", w, _racks(8, 0.03, 0.3), kappa=1.0).probabilities
    runs = {
        "adpsgd": _phased("adpsgd", None, None),
        "static": _phased("netmax", static, None),
        **{k: _phased(k, None, None) for k in ("allreduce", "ps", "prague")},
    }
    pols = [
        pdyn.Policy("adpsgd", "adpsgd"),
        pdyn.Policy("static", "netmax", False, 1.0),
        *(pdyn.Policy(k, k) for k in ("allreduce", "ps", "prague")),
    ]
    segs = _segments([(0.0, 4.0, _racks(8, 0.03, 0.3)), (4.0, 2000.0, _racks(8, 0.3, 0.03))], 0.5)
    out = pdyn.integrate(segs, w, pols, {"w": (a, kappa)})["w"]
    for name, run in runs.items():
        assert out[name].finished and out[name].time_s > 4.0, name
        assert pcal.predict_time(run, a, kappa) == pytest.approx(out[name].time_s, rel=1e-9), name


def test_calibration_recovers_a_and_kappa_from_phased_runs() -> None:
    w = [f"w{i}" for i in range(8)]
    a, kappa = 150.0, 0.7
    runs = _synthetic_runs(a, kappa)[:7]  # one fabric's static runs...
    for k in (0.1, 1.0):  # ...and a hotspot that moves, with static and live NetMax plans
        p0 = peers.plan("netmax", w, _racks(8, 0.03, 0.3), kappa=k).probabilities
        p1 = peers.plan("netmax", w, _racks(8, 0.3, 0.03), kappa=k).probabilities
        runs += [_phased("netmax", p0, None), _phased("netmax", p0, p1)]
        runs[-2].label += f" {k}"
        runs[-1].label += f" {k}"
    runs += [_phased(k, None, None) for k in ("adpsgd", "allreduce", "ps", "prague")]
    for r in runs:
        r.measured_s = [pcal.predict_time(r, a, kappa)]
    assert any(pcal.predict_time(r, a, kappa) > 4.0 for r in runs if r.phases)
    cal = pcal.calibrate(runs)
    assert cal.a == pytest.approx(a, rel=1e-4)
    assert cal.kappa == pytest.approx(kappa, rel=1e-4)
    folds = pcal.leave_one_out(runs, "label")
    assert max(abs(r["rel_error"]) for f in folds for r in f["rows"]) < 1e-3


def test_phased_runs_round_trip_through_the_file(tmp_path: Path) -> None:
    w = [f"w{i}" for i in range(8)]
    p0 = peers.plan("netmax", w, _racks(8, 0.03, 0.3), kappa=0.1).probabilities
    p1 = peers.plan("netmax", w, _racks(8, 0.3, 0.03), kappa=0.1).probabilities
    runs = [_phased("netmax", p0, p1), _phased("ps", None, None)]
    doc = pcal.runs_json(runs)
    for r in doc["runs"]:  # a file may give the first phase only in "phases"
        r["t"] = r["probabilities"] = None
    (tmp_path / "r.json").write_text(json.dumps(doc))
    back = pcal.load_runs(tmp_path / "r.json")
    for r, b in zip(runs, back, strict=True):
        assert pcal.predict_time(b, 200.0, 0.3) == pytest.approx(pcal.predict_time(r, 200.0, 0.3))
    doc["runs"][0]["phases"][1]["start_s"] = 0.0
    (tmp_path / "r.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"runs\[0\].*phases: start_s"):
        pcal.load_runs(tmp_path / "r.json")
