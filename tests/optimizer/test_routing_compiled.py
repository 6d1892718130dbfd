"""The compiled, threaded routing search for many roots (`agg_optimizer.model.shortest_paths`),
its kernel in C and its kernel in numba each, against scipy's Dijkstra, and the network's
link arrays against a plain dict built from the telemetry (the speed-ups of issue 33 must
not change what the engine routes on)."""

from __future__ import annotations

import logging
import os
import random
import shutil

import numpy as np
import pytest
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import dijkstra as scipy_dijkstra

from agg_optimizer.model import shortest_paths
from agg_optimizer.model.documents import DEFAULT_LINK_LATENCY_US
from agg_optimizer.model.examples import example_instance
from agg_optimizer.model.network import RESIDUAL_FLOOR, Network
from agg_optimizer.placement import engine


def _graph(n: int, m: int, seed: int, integer: bool = False) -> csr_matrix:
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    keep = src != dst
    w = rng.integers(1, 4, m).astype(float) if integer else rng.random(m) + 0.01
    g = csr_matrix((w[keep], (dst[keep], src[keep])), shape=(n, n))
    g.sum_duplicates()
    return g


@pytest.fixture(scope="module")
def portable_c_kernel(tmp_path_factory):  # type: ignore[no-untyped-def]
    """The C kernel built without -march=native: the CPU family's baseline (SSE2 on x86-64,
    2 doubles per vector where this machine's AVX takes 4), as a CPU without AVX builds it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(shortest_paths, "C_FLAGS", ("-O3", "-shared", "-fPIC"))
        folder = tmp_path_factory.mktemp("portable")
        mp.setattr(shortest_paths, "_c_folders", lambda: [folder])
        try:
            return shortest_paths.c_kernel()
        except RuntimeError as e:
            pytest.skip(f"the C kernel cannot be built here: {e}")


@pytest.fixture(params=["c", "c-portable", "numba"])
def kernel(request):  # type: ignore[no-untyped-def]
    """Each kernel of the search: C's as built for this machine's CPU, C's as built for the
    CPU family's baseline, and numba's."""
    if request.param == "numba":
        return shortest_paths.numba_kernel()
    if request.param == "c-portable":
        return request.getfixturevalue("portable_c_kernel")
    try:
        return shortest_paths.c_kernel()
    except RuntimeError as e:
        pytest.skip(f"the C kernel cannot be built here: {e}")


def _path(pred: np.ndarray, root: int, v: int) -> list[int]:
    out = [v]
    while v != root:
        v = int(pred[v])
        assert v >= 0, "a target's path ends before its root"
        out.append(v)
    return out


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_full_rows_are_scipys_where_paths_are_unique(workers: int, kernel) -> None:  # type: ignore[no-untyped-def]
    g = _graph(600, 5000, 1)  # random real weights: every shortest path is unique
    roots = np.random.default_rng(2).choice(600, 40, replace=False)
    _, want = scipy_dijkstra(g, directed=True, indices=roots, return_predecessors=True)
    got = shortest_paths.next_hops(g, roots, workers=workers, kernel=kernel)
    assert got.shape == want.shape
    assert np.array_equal(got, want)  # unreachable nodes too: -9999 in both


def test_with_targets_every_targets_path_is_scipys_and_the_rest_is_not_claimed(kernel) -> None:  # type: ignore[no-untyped-def]
    g = _graph(800, 6000, 3)
    rng = np.random.default_rng(4)
    roots = rng.choice(800, 30, replace=False)
    targets = [rng.choice(800, int(rng.integers(1, 15)), replace=False) for _ in roots]
    dist, want = scipy_dijkstra(g, directed=True, indices=roots, return_predecessors=True)
    got = shortest_paths.next_hops(g, roots, targets, workers=2, kernel=kernel)
    unclaimed = 0
    for i, r in enumerate(roots):
        for t in targets[i]:
            if np.isinf(dist[i, t]):
                assert got[i, t] == shortest_paths.NO_HOP
                continue
            assert _path(got[i], r, t) == _path(want[i], r, t)
        unclaimed += int(np.sum(got[i] == shortest_paths.NO_HOP) > np.sum(want[i] == -9999))
    assert unclaimed > 0  # switches off the paths read are left -9999, or this tests nothing


@pytest.mark.parametrize("with_targets", [False, True])
def test_on_exact_ties_the_paths_are_scipys_still(with_targets: bool, kernel) -> None:  # type: ignore[no-untyped-def]
    """Weights 1-3: many equally short paths. Roots with a tie on a path read are routed by
    scipy again, so ties break as scipy breaks them."""
    g = _graph(500, 4000, 5, integer=True)
    rng = np.random.default_rng(6)
    roots = np.arange(0, 500, 25)
    targets = [rng.choice(500, 10, replace=False) for _ in roots] if with_targets else None
    _, want = scipy_dijkstra(g, directed=True, indices=roots, return_predecessors=True)
    got = shortest_paths.next_hops(g, roots, targets, workers=2, kernel=kernel)
    for i, r in enumerate(roots):
        for t in targets[i] if targets else range(500):
            if want[i, t] == -9999:
                continue
            assert _path(got[i], r, t) == _path(want[i], r, t)


def _counting_scipy(monkeypatch) -> list[int]:  # type: ignore[no-untyped-def]
    """Roots that `shortest_paths.next_hops` gives back to scipy, counted."""
    import scipy.sparse.csgraph as csgraph

    seen: list[int] = []
    real = csgraph.dijkstra

    def counted(*a, **kw):  # type: ignore[no-untyped-def]
        seen.append(len(kw["indices"]))
        return real(*a, **kw)

    monkeypatch.setattr(csgraph, "dijkstra", counted)
    return seen


def test_only_roots_with_a_tie_on_a_path_read_go_back_to_scipy(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(shortest_paths, "COMPILED_MIN_WORK", 0)
    uneven = example_instance(8, 80, 11)  # INT telemetry on every link: no ties
    idle = uneven.model_copy(
        update={"telemetry": uneven.telemetry.model_copy(update={"links": []})}
    )  # every link weighs the same: ties everywhere
    seen = _counting_scipy(monkeypatch)
    engine.solve(uneven, "agg")
    assert seen == []
    engine.solve(idle, "agg")
    assert seen and seen[0] > 0


def test_roots_whose_block_does_not_settle_are_scipys(monkeypatch, kernel) -> None:  # type: ignore[no-untyped-def]
    """A path whose switches alternate between low and high numbers gains one link per
    sweep: past MAX_SWEEPS its roots' block is not settled, and scipy routes them."""
    n = 3 * shortest_paths.MAX_SWEEPS
    walk = [v for k in range(n // 2) for v in (k, n - 1 - k)]  # 0, n-1, 1, n-2, ...
    rng = np.random.default_rng(8)
    src = np.array(walk[:-1] + walk[1:])
    dst = np.array(walk[1:] + walk[:-1])
    g = csr_matrix((rng.random(len(src)) + 0.5, (src, dst)), shape=(n, n))
    roots = np.array([walk[0], walk[n // 2]])  # one block: from either, the far end is far
    _, want = scipy_dijkstra(g, directed=True, indices=roots, return_predecessors=True)
    seen = _counting_scipy(monkeypatch)
    got = shortest_paths.next_hops(g, roots, workers=1, kernel=kernel)
    assert seen == [2]
    assert np.array_equal(got, want)
    monkeypatch.setattr(shortest_paths, "MAX_SWEEPS", 10 * n)  # given the sweeps, it settles
    seen.clear()
    assert np.array_equal(shortest_paths.next_hops(g, roots, workers=1, kernel=kernel), want)
    assert seen == []


def test_targets_must_match_the_roots() -> None:
    g = _graph(20, 60, 6)
    with pytest.raises(ValueError, match="targets"):
        shortest_paths.next_hops(g, np.array([0, 1]), [np.array([3])])


def _reference_links(inst) -> tuple[dict, dict]:  # type: ignore[no-untyped-def]
    """Residual rate and delay per direction from a dict of the telemetry (the last entry
    of a direction wins; a direction without one gets the defaults)."""
    tel = {(t.src, t.dst): t for t in inst.telemetry.links}
    resid, delay = {}, {}
    for ln in inst.topology.links:
        c = ln.capacity_gbps * 1e9
        for e in ((ln.src, ln.dst), (ln.dst, ln.src)):
            t = tel.get(e)
            util, q = (t.utilization, t.queue_bytes) if t else (0.0, 0.0)
            lat = t.latency_us if t else DEFAULT_LINK_LATENCY_US
            fair = c / (t.flows + 1) if t is not None and t.flows is not None else 0.0
            resid[e] = max(c * (1 - util), fair, RESIDUAL_FLOOR * c)
            delay[e] = lat * 1e-6 + 8 * q / c
    return resid, delay


@pytest.mark.parametrize("shape", ["as written", "shuffled, some missing, some twice", "none"])
def test_the_networks_link_values_are_the_telemetrys(shape: str) -> None:
    inst = example_instance(8, 12, 7)
    tl = list(inst.telemetry.links)
    if shape != "as written":
        random.Random(1).shuffle(tl)
        tl = [] if shape == "none" else tl[7:] + tl[:4]
        if tl:
            tl[0] = tl[0].model_copy(update={"flows": 3, "utilization": 0.9})
        inst = inst.model_copy(
            update={"telemetry": inst.telemetry.model_copy(update={"links": tl})}
        )
    net = Network.from_instance(inst)
    resid, delay = _reference_links(inst)
    assert dict(net.resid) == pytest.approx(resid, rel=1e-12)
    assert dict(net.delay) == pytest.approx(delay, rel=1e-12)
    assert len(net.resid) == len(resid) and set(net.cap) == set(resid)
    # host links read by position, as the engine's large path does: the dicts' values
    hosts = sorted(net.attach)
    for which, ref in (("resid", resid), ("delay", delay)):
        up = [ref[(h, net.attach[h])] for h in hosts]
        down = [ref[(net.attach[h], h)] for h in hosts]
        assert net.host_values(which, hosts, up=True).tolist() == up
        assert net.host_values(which, hosts, up=False).tolist() == down
        at = np.array([net.index[h] for h in hosts])
        assert net.host_values_at(which, at, up=True).tolist() == up
        assert net.host_values_at(which, at, up=False).tolist() == down
    assert net.host_switches(at).tolist() == [net.sw_index[net.attach[h]] for h in hosts]


def test_host_values_read_the_dicts_where_a_direction_is_given_twice() -> None:
    """Two links between one pair (never in a checked instance): the network keeps dicts,
    the last link winning, and host_values reads them."""
    inst = example_instance(4, 3, 2)
    links = list(inst.topology.links)
    host_link = next(ln for ln in links if ln.src.startswith("h") or ln.dst.startswith("h"))
    twice = host_link.model_copy(update={"capacity_gbps": host_link.capacity_gbps * 2})
    inst = inst.model_copy(
        update={"topology": inst.topology.model_copy(update={"links": [*links, twice]})}
    )
    net = Network.from_instance(inst)
    assert net._host_up is None and isinstance(net.cap, dict)
    h = host_link.src if host_link.src.startswith("h") else host_link.dst
    assert net.host_values("cap", [h], up=True).tolist() == [twice.capacity_gbps * 1e9]
    at = np.array([net.index[h]])
    assert net._host_switch is None
    assert net.host_values_at("cap", at, up=True).tolist() == [twice.capacity_gbps * 1e9]
    assert net.host_switches(at).tolist() == [net.sw_index[net.attach[h]]]
    with pytest.raises(KeyError):
        Network.from_instance(example_instance(4, 3, 2)).host_values("cap", ["e0_0"], up=True)


def test_the_engine_places_the_same_with_the_compiled_search(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """An instance above SHARED_ROUTING_MAX_JOBS routes on one tree per PS switch: the same
    placement whichever search routes it (its telemetry is uneven, so paths are unique)."""
    inst = example_instance(8, 80, 11)
    monkeypatch.setattr(shortest_paths, "COMPILED_MIN_WORK", float("inf"))
    monkeypatch.setattr(shortest_paths, "LOADED_MIN_WORK", float("inf"))
    with_scipy = engine.solve(inst, "agg")
    monkeypatch.setattr(shortest_paths, "COMPILED_MIN_WORK", 0)
    compiled = engine.solve(inst, "agg")
    assert compiled.objective_s == with_scipy.objective_s
    assert [j.model_dump() for j in compiled.jobs] == [j.model_dump() for j in with_scipy.jobs]


def test_without_the_compiled_search_scipy_routes_and_the_log_says_why(monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    def broken() -> None:
        raise RuntimeError("cannot cache function '_rows': no locator available")

    monkeypatch.setattr(shortest_paths, "_ready", False)
    monkeypatch.setattr(shortest_paths, "_failed", None)
    monkeypatch.setattr(shortest_paths, "warm", broken)
    monkeypatch.setattr(shortest_paths, "COMPILED_MIN_WORK", 0)
    inst = example_instance(8, 80, 11)
    seen = _counting_scipy(monkeypatch)
    placed = engine.solve(inst, "agg")
    assert len(placed.jobs) == 80 and seen == []  # scipy's whole call, not a fallback's
    assert "compiled routing unavailable" in caplog.text and "no locator" in caplog.text
    assert shortest_paths.use_compiled(1e12) is False


def _fresh_state(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The module as a new process finds it: no kernel loaded yet."""
    for name, value in (("_compiled", None), ("kernel_name", None), ("_ready", False)):
        monkeypatch.setattr(shortest_paths, name, value)
    monkeypatch.setattr(shortest_paths, "_failed", None)


def test_the_c_kernel_is_built_once_in_the_first_writable_folder(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    if shutil.which(os.environ.get("CC") or "cc") is None:
        pytest.skip("no C compiler ($CC or cc) on PATH to build the C kernel with")
    (tmp_path / "a-file").write_text("")
    cache = tmp_path / "cache"
    monkeypatch.setattr(shortest_paths, "_c_folders", lambda: [tmp_path / "a-file" / "x", cache])
    with pytest.raises(FileNotFoundError):
        shortest_paths.c_kernel(build=False)
    built = shortest_paths.c_kernel()
    assert [p.name for p in cache.iterdir()] == [shortest_paths._c_build_name()]  # no temp left
    g = _graph(300, 2000, 9)
    _, want = scipy_dijkstra(g, directed=True, indices=[0, 7], return_predecessors=True)
    assert np.array_equal(shortest_paths.next_hops(g, np.array([0, 7]), kernel=built), want)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))  # loaded again, not rebuilt
    again = shortest_paths.c_kernel()
    assert np.array_equal(shortest_paths.next_hops(g, np.array([0, 7]), kernel=again), want)
    # a build is for one CPU (-march=native): another CPU's process builds its own
    monkeypatch.setattr(shortest_paths, "_cpu", lambda: "another machine")
    with pytest.raises(RuntimeError, match="no C compiler"):
        shortest_paths.c_kernel()


def test_without_a_c_compiler_numba_routes_and_the_log_says_why(monkeypatch, tmp_path, caplog):  # type: ignore[no-untyped-def]
    _fresh_state(monkeypatch)
    monkeypatch.setattr(shortest_paths, "_c_folders", lambda: [tmp_path])
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    caplog.set_level(logging.INFO, logger=shortest_paths.__name__)
    assert shortest_paths.use_compiled(shortest_paths.LOADED_MIN_WORK) is False  # not built
    assert shortest_paths.use_compiled(shortest_paths.COMPILED_MIN_WORK) is True
    assert shortest_paths.kernel_name == "numba"
    assert "routing kernel in C unavailable" in caplog.text and "no C compiler" in caplog.text
    g = _graph(300, 2000, 10)
    _, want = scipy_dijkstra(g, directed=True, indices=[3], return_predecessors=True)
    assert np.array_equal(shortest_paths.next_hops(g, np.array([3])), want)


def test_a_built_c_kernel_is_used_from_the_loaded_threshold_in_a_fresh_process(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Loading a built C kernel costs a millisecond, not numba's seconds: a fresh process
    uses it from LOADED_MIN_WORK on, without waiting for COMPILED_MIN_WORK."""
    try:
        shortest_paths.c_kernel()  # built, as `make sync` does
    except RuntimeError as e:
        pytest.skip(f"the C kernel cannot be built here: {e}")
    _fresh_state(monkeypatch)
    assert shortest_paths.use_compiled(shortest_paths.LOADED_MIN_WORK / 2) is False
    assert shortest_paths.use_compiled(shortest_paths.LOADED_MIN_WORK) is True
    assert shortest_paths.kernel_name == "c"
