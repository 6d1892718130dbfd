"""Many single-root Dijkstras on one graph, compiled, on every core, stopping early.

A large placement routes every job on one shortest-path tree per parameter-server switch:
a k=64 fat-tree with 10,000 jobs has 2,032 roots on 5,120 switches and 262,144 directed
links, and scipy's `dijkstra(indices=roots)` took 5.0 of the engine's 11.0 s on this
project's 2-core test machine (docs/benchmarks/scale.md, round 3). Here the same search is
a numba loop with a 4-ary heap that:

- runs the roots in threads (the loop holds no GIL), one block of roots per core;
- stops a root's search once every switch asked for (`targets`: the switches its jobs'
  workers sit on) is settled. Their paths to the root are then final, and they are all the
  callers read. A switch it did not settle gets -9999, as an unreachable one does.

Distances are summed along each path from the root in the same order as scipy's, so
wherever the shortest path is unique the next hops are scipy's. Where a path read has an
exact tie on it (another way into one of its switches at the same distance: an idle fabric,
where every link weighs the same), the search says so and that root is routed by scipy
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
# takes about 10 ns per unit on the test machine, this search about half that on its 2
# cores, so loading numba (1.7-3 s) pays from about 3e8 in a fresh process.
COMPILED_MIN_WORK = 3e8
# Once loaded, from this much work on (below it, the threads cost more than they save).
LOADED_MIN_WORK = 2e7

_compiled: Callable[..., None] | None = None
_ready = False  # compiled or loaded, and run once
_failed: str | None = None  # why it could not be (then scipy routes)
log = logging.getLogger(__name__)
_lock = threading.Lock()  # one compile or cache load, however many threads ask
# Children per heap node: fewer levels, so fewer hard-to-predict branches per pop.
ARITY = 4


def _rows(indptr, indices, data, roots, t_ptr, t_idx, first, last, pred, tied):  # type: ignore[no-untyped-def]
    """Dijkstra from roots[first:last] on the CSR graph; writes pred[i] for each root i.
    t_idx[t_ptr[i]:t_ptr[i + 1]] are the nodes root i needs (none: all of them). tied[i]:
    a node on one of those paths (any node, without targets) had two equally short ways in,
    so another Dijkstra may have picked another path there."""
    n = indptr.shape[0] - 1
    dist = np.empty(n, dtype=np.float64)
    state = np.zeros(n, dtype=np.int8)  # 0 unseen, 1 in the heap, 2 settled
    want = np.zeros(n, dtype=np.bool_)
    tie = np.zeros(n, dtype=np.bool_)  # reached at its distance twice
    hkey = np.empty(n, dtype=np.float64)  # binary heap of nodes by (dist, node): keys
    hnode = np.empty(n, dtype=np.int64)  # and nodes
    pos = np.empty(n, dtype=np.int64)  # each node's place in the heap
    for i in range(first, last):
        row = pred[i]
        row[:] = NO_HOP
        state[:] = 0
        tie[:] = False
        need = 0
        for k in range(t_ptr[i], t_ptr[i + 1]):
            v = t_idx[k]
            if not want[v]:
                want[v] = True
                need += 1
        every = need == 0
        root = roots[i]
        dist[root] = 0.0
        hkey[0] = 0.0
        hnode[0] = root
        pos[root] = 0
        size = 1
        state[root] = 1
        while size > 0:
            u = hnode[0]
            size -= 1
            if size > 0:  # the last node to the top, sifted down
                x = hnode[size]
                dx = hkey[size]
                j = 0
                while True:
                    c = ARITY * j + 1
                    if c >= size:
                        break
                    end = min(c + ARITY, size)
                    best = c
                    bk = hkey[c]
                    for cc in range(c + 1, end):
                        kc = hkey[cc]
                        if kc < bk or (kc == bk and hnode[cc] < hnode[best]):
                            best = cc
                            bk = kc
                    y = hnode[best]
                    if bk < dx or (bk == dx and y < x):
                        hkey[j] = bk
                        hnode[j] = y
                        pos[y] = j
                        j = best
                    else:
                        break
                hkey[j] = dx
                hnode[j] = x
                pos[x] = j
            state[u] = 2
            if want[u]:
                want[u] = False
                need -= 1
                if need == 0 and not every:
                    break
            du = dist[u]
            for e in range(indptr[u], indptr[u + 1]):
                v = indices[e]
                if state[v] == 2:
                    continue
                nd = du + data[e]
                if state[v] == 0:
                    state[v] = 1
                    j = size
                    size += 1
                elif nd < dist[v]:
                    j = pos[v]
                    tie[v] = False
                else:
                    if nd == dist[v]:
                        tie[v] = True
                    continue
                dist[v] = nd
                row[v] = u
                while j > 0:  # sift up
                    p = (j - 1) // ARITY
                    dy = hkey[p]
                    y = hnode[p]
                    if nd < dy or (nd == dy and v < y):
                        hkey[j] = dy
                        hnode[j] = y
                        pos[y] = j
                        j = p
                    else:
                        break
                hkey[j] = nd
                hnode[j] = v
                pos[v] = j
        for k in range(size):  # what is left in the heap is not final
            row[hnode[k]] = NO_HOP
        if every:
            for v in range(n):
                if tie[v] and state[v] == 2:
                    tied[i] = True
                    break
        for k in range(t_ptr[i], t_ptr[i + 1]):
            v = t_idx[k]
            want[v] = False
            while v >= 0 and not tied[i]:  # the target's path: any tie on it?
                if tie[v]:
                    tied[i] = True
                v = row[v] if v != root else -1


def _kernel() -> Callable[..., None]:
    global _compiled
    with _lock:
        if _compiled is None:
            from numba import njit

            _compiled = njit(nogil=True, cache=True)(_rows)
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
    (scipy's `dijkstra(gt, indices=roots, return_predecessors=True)[1]`), computed up to
    the nodes `targets[i]` (None: every node; an empty array: every node too). The rows of
    roots where a path read ties with another are scipy's own."""
    n = gt.shape[0]
    roots = np.asarray(roots, dtype=np.int64)
    m = len(roots)
    if targets is None:
        t_ptr = np.zeros(m + 1, dtype=np.int64)
        t_idx = np.zeros(0, dtype=np.int64)
    else:
        if len(targets) != m:
            raise ValueError(f"targets: {len(targets)} lists for {m} roots")
        t_ptr = np.zeros(m + 1, dtype=np.int64)
        t_ptr[1:] = np.cumsum([len(t) for t in targets])
        t_idx = (
            np.concatenate([np.asarray(t, dtype=np.int64) for t in targets])
            if m
            else np.zeros(0, dtype=np.int64)
        )
    pred = np.empty((m, n), dtype=np.int32 if n < 2**31 else np.int64)
    if m == 0:
        return pred
    indptr = np.asarray(gt.indptr, dtype=np.int64)
    indices = np.asarray(gt.indices, dtype=np.int32)
    data = np.asarray(gt.data, dtype=np.float64)
    kernel = _kernel()
    tied = np.zeros(m, dtype=np.bool_)
    parts = max(1, min(workers or threads(), m))
    bounds = np.linspace(0, m, parts + 1).astype(np.int64)
    args = (indptr, indices, data, roots, t_ptr, t_idx)
    if parts == 1:
        kernel(*args, 0, m, pred, tied)
    else:
        with ThreadPoolExecutor(parts) as pool:
            jobs = [
                pool.submit(kernel, *args, int(bounds[p]), int(bounds[p + 1]), pred, tied)
                for p in range(parts)
            ]
            for job in jobs:
                job.result()
    if tied.any():
        # Where two paths tie exactly (an idle fabric: equal weights everywhere), scipy
        # routes those roots, so that its tie-break, the one placements were made with
        # before, still decides which of them a job takes.
        from scipy.sparse.csgraph import dijkstra

        _, again = dijkstra(gt, directed=True, indices=roots[tied], return_predecessors=True)
        pred[tied] = again
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
