"""Shortest-path next hops from many roots on one graph: compiled, on every core, many roots
at a time.

A large placement routes every job on one shortest-path tree per parameter-server switch:
a k=64 fat-tree with 10,000 jobs has 2,032 roots on 5,120 switches and 262,144 directed
links. scipy's `dijkstra(indices=roots)` took 5.0 of the engine's 11.0 s there on this
project's 2-core test machine, and a compiled Dijkstra per root still 1.9 s on both cores
(docs/benchmarks/scale.md). Here the roots go through the graph `LANES` at a time:

- **Distances**, by Bellman-Ford over a block of roots: each switch holds its distance from
  each of the block's roots side by side, and relaxing a link relaxes it for all of them in
  one short loop over adjacent memory. Sweeps go over the switches forwards and backwards in
  turn, and a switch pushes its distances on only if they changed since it last did; the
  block is done when a sweep finds nothing changed. A fat-tree needs about six sweeps (an
  up-down path settles in two), about two passes over every link in all.
- **Next hops**, only where they are read: for each switch on a path asked for (`targets`:
  the switches a root's jobs' workers sit on; none: every switch), the one link into it whose
  tail's distance plus the link's weight is its distance.

Distances are sums along each path from the root, link by link, as scipy's Dijkstra sums
them, and both are the least such sum, so wherever the shortest path is unique the next hops
are scipy's. Where a path read has an exact tie on it (two links into one of its switches
give its distance: an idle fabric, where every link weighs the same), or a block has not
settled in `MAX_SWEEPS` (a graph far from a fabric's few layers), scipy routes those roots
again, so that ties break as they always did and placements stay what they were.

Compiling costs seconds once per install (`make sync` runs `warm()`; numba caches it beside
the sources), and importing numba and loading the cache costs 1.7-3 s in a fresh process
on the test machine. So `Network.next_hops` uses this search where it pays for that
(`use_compiled`): in a process that has loaded it already (the service after its first
large solve) from `LOADED_MIN_WORK`, and otherwise only from `COMPILED_MIN_WORK`.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

NO_HOP = -9999  # scipy's predecessor value for "none"
# Work of a routing call: roots x directed links (k=32 with 1,000 jobs: 1.3e7; k=48 with
# 10,000 jobs: 1.3e8; k=64 with 3,000 jobs: 4.1e8; k=64 with 10,000 jobs: 5.3e8). scipy
# takes about 10 ns per unit on the test machine, so loading numba (1.7-3 s) pays from
# about 3e8 in a fresh process.
COMPILED_MIN_WORK = 3e8
# Once loaded, from this much work on (below it, the threads cost more than they save).
LOADED_MIN_WORK = 2e7
LANES = 16  # roots per block: a block's distances (switches x 16 x 8 bytes) stay in cache
MAX_SWEEPS = 64  # a block not settled by then is scipy's

_compiled: Callable[..., None] | None = None
_ready = False  # compiled or loaded, and run once
_failed: str | None = None  # why it could not be (then scipy routes)
log = logging.getLogger(__name__)
_lock = threading.Lock()  # one compile or cache load, however many threads ask


def _blocks(  # type: ignore[no-untyped-def]
    indptr, indices, data, rptr, ridx, rdata, roots, t_ptr, t_idx, most, first, last, pred, again
):
    """Next hops from roots[first:last] (a multiple of LANES from `first`) on the CSR graph
    (indptr, indices, data), whose transpose is (rptr, ridx, rdata): pred[i] for each root i
    on the paths of the nodes t_idx[t_ptr[i]:t_ptr[i + 1]] (none: every node), NO_HOP
    elsewhere. again[i]: scipy must route root i (a tie on a path read, or its block not
    settled in `most` sweeps)."""
    L = LANES
    n = indptr.shape[0] - 1
    dist = np.empty(n * L, dtype=np.float64)  # dist[v * L + b]: v's distance from root b
    mine = np.empty(L, dtype=np.float64)  # the pushing node's distances
    dirty = np.zeros(n, dtype=np.bool_)  # changed since it last pushed them on
    for s in range(first, last, L):
        lanes = min(L, last - s)
        dist[:] = np.inf
        for b in range(lanes):
            dist[roots[s + b] * L + b] = 0.0
            dirty[roots[s + b]] = True
        sweeps = 0
        busy = True
        while busy and sweeps < most:
            busy = False
            for k in range(n):
                u = k if sweeps % 2 == 0 else n - 1 - k
                if not dirty[u]:
                    continue
                dirty[u] = False
                busy = True
                for b in range(L):
                    mine[b] = dist[u * L + b]
                for e in range(indptr[u], indptr[u + 1]):
                    o = indices[e] * L
                    w = data[e]
                    changed = False
                    for b in range(L):
                        x = mine[b] + w
                        if x < dist[o + b]:
                            dist[o + b] = x
                            changed = True
                    if changed:
                        dirty[indices[e]] = True
            sweeps += 1
        for b in range(lanes):
            i = s + b
            row = pred[i]
            row[:] = NO_HOP
            if busy:  # not settled: scipy's
                again[i] = True
                continue
            root = roots[i]
            every = t_ptr[i] == t_ptr[i + 1]
            for k in range(n if every else t_ptr[i + 1] - t_ptr[i]):
                v = k if every else t_idx[t_ptr[i] + k]
                while v != root and row[v] == NO_HOP and not again[i]:
                    dv = dist[v * L + b]
                    if dv == np.inf:  # unreachable
                        break
                    hop = -1
                    ways = 0  # links into v whose tail's distance plus weight is v's
                    for e in range(rptr[v], rptr[v + 1]):
                        u = ridx[e]
                        if dist[u * L + b] + rdata[e] == dv:
                            ways += 1
                            hop = u
                    if ways != 1:  # a tie; or none, which settled distances rule out
                        again[i] = True
                        break
                    row[v] = hop
                    v = hop
        dirty[:] = False


def _kernel() -> Callable[..., None]:
    global _compiled
    with _lock:
        if _compiled is None:
            from numba import njit

            _compiled = njit(nogil=True, cache=True)(_blocks)
        return _compiled


def use_compiled(work: float) -> bool:
    """Whether a routing call of this much work (roots x directed links) should use this
    search rather than scipy's. Loads it on the first call that should; where it cannot be
    compiled or loaded (no numba, no writable cache folder), says why once in the log and
    answers False from then on: scipy routes the same."""
    global _failed
    if not (work >= COMPILED_MIN_WORK or (_ready and work >= LOADED_MIN_WORK)):
        return False
    if _failed is None and not _ready:
        try:
            warm()
        except Exception as e:  # any failure to build an optimisation: scipy instead
            _failed = f"{type(e).__name__}: {e}"
            log.warning("compiled routing unavailable, scipy routes instead: %s", _failed)
    return _ready


def preload() -> bool:
    """Load the search now, as the first call that needs it would (a service that knows its
    fabric is large, at start); False where it cannot be loaded (the log says why once)."""
    return use_compiled(COMPILED_MIN_WORK)


def threads() -> int:
    """Cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def next_hops(
    gt: Any,
    roots: np.ndarray,
    targets: list[np.ndarray] | None = None,
    *,
    workers: int | None = None,
) -> np.ndarray:
    """pred[i, v]: the node before v on a shortest path from roots[i] in the CSR graph `gt`
    (scipy's `dijkstra(gt, indices=roots, return_predecessors=True)[1]`), given on the paths
    of the nodes `targets[i]` (None, or an empty array: every node) and -9999 elsewhere. The
    rows of roots where a path read ties with another are scipy's own."""
    n = gt.shape[0]
    roots = np.asarray(roots, dtype=np.int64)
    m = len(roots)
    t_ptr = np.zeros(m + 1, dtype=np.int64)
    t_idx = np.zeros(0, dtype=np.int64)
    if targets is not None:
        if len(targets) != m:
            raise ValueError(f"targets: {len(targets)} lists for {m} roots")
        t_ptr[1:] = np.cumsum([len(t) for t in targets])
        if m:
            t_idx = np.concatenate([np.asarray(t, dtype=np.int64) for t in targets])
    pred = np.empty((m, n), dtype=np.int32 if n < 2**31 else np.int64)
    if m == 0:
        return pred
    g = gt.tocsr()
    r = g.transpose().tocsr()  # the links into each node
    i64, f64 = np.int64, np.float64
    args = (
        np.asarray(g.indptr, dtype=i64),
        np.asarray(g.indices, dtype=i64),
        np.asarray(g.data, dtype=f64),
        np.asarray(r.indptr, dtype=i64),
        np.asarray(r.indices, dtype=i64),
        np.asarray(r.data, dtype=f64),
        roots,
        t_ptr,
        t_idx,
        MAX_SWEEPS,
    )
    kernel = _kernel()
    again = np.zeros(m, dtype=np.bool_)
    blocks = -(-m // LANES)
    parts = max(1, min(workers or threads(), blocks))
    cut = [min(m, LANES * (blocks * p // parts)) for p in range(parts + 1)]
    if parts == 1:
        kernel(*args, 0, m, pred, again)
    else:
        with ThreadPoolExecutor(parts) as pool:
            jobs = [
                pool.submit(kernel, *args, cut[p], cut[p + 1], pred, again) for p in range(parts)
            ]
            for job in jobs:
                job.result()
    if again.any():
        # Where two paths tie exactly (an idle fabric: equal weights everywhere), scipy
        # routes those roots, so that its tie-break, the one placements were made with
        # before, still decides which of them a job takes.
        from scipy.sparse.csgraph import dijkstra

        _, rows = dijkstra(gt, directed=True, indices=roots[again], return_predecessors=True)
        pred[again] = rows
    return pred


def warm() -> None:
    """Compile the search (or load it from numba's cache), as `make sync` does once."""
    global _ready
    from scipy.sparse import csr_matrix

    gt = csr_matrix((np.ones(2), (np.array([0, 1]), np.array([1, 0]))), shape=(2, 2))
    next_hops(gt, np.array([0]), workers=1)
    _ready = True


if __name__ == "__main__":
    import time

    t = time.monotonic()
    print("compiling the routing search into numba's cache (once per install)")
    warm()
    print(f"routing search compiled, or loaded from the cache, in {time.monotonic() - t:.1f} s")
