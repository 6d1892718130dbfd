"""Max-min fair rates by progressive filling, for flows that may cross a link several times.

A flow here is whatever moves at one rate: a plain background flow, or a job's aggregation
component (every stream of it advances together, see `training.py`). `mult` says how many of
the flow's streams cross each link, so a flow at rate r loads link e with mult * r. Raising
every unfrozen flow's rate together and freezing the flows of each link that fills gives
per-stream max-min fairness: on a bottleneck every stream gets the same share, and a coupled
component gets that share on every link it uses.

The simulator calls this at every flow arrival and completion, tens of thousands of times a
run, so the loops are compiled with numba (cached on disk after the first run). Flows are
rows of padded arrays (`links[s, :width[s]]`) that the simulator keeps between calls.

`fill_numpy` is the same filling with numpy's array operations: for a caller that solves a
few times (the placement's shared CCT), importing numba and loading the compiled loops
(about 1 s, and seconds more where the cache is cold) costs more than it saves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

# A link counts as full when less than this fraction of its capacity is left.
FULL_TOL = 1e-9

_compiled: Callable[..., np.ndarray] | None = None


def fill(rows, width, links, mult, cls, capacity, link_rate):  # type: ignore[no-untyped-def]
    """Rates of the flows in `rows`; adds each class's load per link to `link_rate`.
    Compiled with numba on the first call."""
    global _compiled
    if _compiled is None:
        from numba import njit

        _compiled = njit(cache=True)(_fill_loops)
    return _compiled(rows, width, links, mult, cls, capacity, link_rate)


def warm() -> None:
    """Compile `fill` (or load it from numba's cache) for the simulator's array types, so
    that a run that keeps time (the demo's live fabric) does not compile mid-run. `make
    sync` runs it once (`python -m agg_optimizer.sim.fairshare`)."""
    rows = np.zeros(1, dtype=np.int64)
    width = np.ones(1, dtype=np.int64)
    links = np.zeros((1, 8), dtype=np.int64)
    mult = np.ones((1, 8))
    cls = np.zeros(1, dtype=np.int64)
    fill(rows, width, links, mult, cls, np.ones(1), np.zeros((2, 1)))


def fill_numpy(
    rows: np.ndarray,
    width: np.ndarray,
    links: np.ndarray,
    mult: np.ndarray,
    cls: np.ndarray,
    capacity: np.ndarray,
    link_rate: np.ndarray,
) -> np.ndarray:
    """`fill` without numba: one vectorised pass per filling round."""
    lk = links[rows]
    on = np.arange(lk.shape[1]) < width[rows][:, None]
    lk = np.where(on, lk, 0)
    mu = np.where(on, mult[rows], 0.0)
    n, n_links = rows.shape[0], capacity.shape[0]
    rate = np.zeros(n)
    left = capacity.astype(np.float64, copy=True)
    frozen = np.zeros(n, dtype=bool)
    while not frozen.all():
        live = ~frozen
        load = np.bincount(lk[live].ravel(), weights=mu[live].ravel(), minlength=n_links)
        pos = load > 0.0
        if not pos.any():
            break  # the flows left load no link: unbounded (`fill` would not end)
        ratio = np.where(pos, left / np.where(pos, load, 1.0), np.inf)
        inc = max(float(ratio.min()), 0.0)
        left -= load * inc
        # The bottleneck is full by definition, whatever the rounding left of it: with a
        # relative tolerance only, a tiny (subnormal) capacity never counted as full and
        # the loop never ended (found by the property test).
        left[ratio <= inc] = 0.0
        rate[live] += inc
        full = left <= FULL_TOL * capacity
        frozen |= live & (full[lk] & on).any(axis=1)
    np.add.at(link_rate, (np.broadcast_to(cls[rows][:, None], lk.shape)[on], lk[on]),
              (mu * rate[:, None])[on])  # fmt: skip
    return rate


def _fill_loops(rows: Any, width: Any, links: Any, mult: Any, cls: Any, capacity: Any,
                link_rate: Any) -> Any:  # fmt: skip  # pragma: no cover - compiled
    n = rows.shape[0]
    n_links = capacity.shape[0]
    rate = np.zeros(n)
    left = capacity.copy()
    load = np.zeros(n_links)
    frozen = np.zeros(n, np.bool_)
    seen = np.zeros(n_links, np.bool_)
    used = np.empty(n_links, np.int64)
    n_used = 0
    for a in range(n):
        s = rows[a]
        for j in range(width[s]):
            e = links[s, j]
            if not seen[e]:
                seen[e] = True
                used[n_used] = e
                n_used += 1
    live = n
    while live > 0:
        for u in range(n_used):
            load[used[u]] = 0.0
        for a in range(n):
            if not frozen[a]:
                s = rows[a]
                for j in range(width[s]):
                    load[links[s, j]] += mult[s, j]
        inc = np.inf
        for u in range(n_used):
            e = used[u]
            if load[e] > 0.0 and left[e] / load[e] < inc:
                inc = left[e] / load[e]
        if inc < 0.0:
            inc = 0.0
        for u in range(n_used):
            e = used[u]
            if load[e] > 0.0 and left[e] / load[e] <= inc:
                left[e] = 0.0  # the bottleneck: full, whatever the rounding (fill_numpy)
            else:
                left[e] -= load[e] * inc
        for a in range(n):
            if frozen[a]:
                continue
            rate[a] += inc
            s = rows[a]
            for j in range(width[s]):
                e = links[s, j]
                if left[e] <= FULL_TOL * capacity[e]:
                    frozen[a] = True
                    live -= 1
                    break
    for a in range(n):
        s = rows[a]
        for j in range(width[s]):
            link_rate[cls[s], links[s, j]] += mult[s, j] * rate[a]
    return rate


def fill_by_priority(
    fill_fn: Callable[..., np.ndarray],
    rows: np.ndarray,
    priority: np.ndarray,
    width: np.ndarray,
    links: np.ndarray,
    mult: np.ndarray,
    cls: np.ndarray,
    capacity: np.ndarray,
    link_rate: np.ndarray,
) -> np.ndarray:
    """Strict priority between levels, max-min within each: the flows of the highest
    `priority[rows]` are filled on the whole capacity, each lower level on what the levels
    above left (as strict-priority egress queues serve them). One level is plain `fill_fn`.
    """
    prio = priority[rows]
    levels = np.unique(prio)
    if levels.size == 1:
        return fill_fn(rows, width, links, mult, cls, capacity, link_rate)
    rate = np.zeros(rows.shape[0])
    left = capacity.astype(np.float64, copy=True)
    for level in levels[::-1]:
        at = np.flatnonzero(prio == level)
        sub = rows[at]
        r = fill_fn(sub, width, links, mult, cls, np.ascontiguousarray(left), link_rate)
        rate[at] = r
        on = np.arange(links.shape[1]) < width[sub][:, None]
        used = np.bincount(links[sub][on], weights=(mult[sub] * r[:, None])[on],
                           minlength=left.size)  # fmt: skip
        left = np.maximum(left - used, 0.0)
    return rate


def max_min_rates(
    flows: list[tuple[list[int], list[float]]],
    capacity: np.ndarray,
    priority: list[int] | None = None,
) -> np.ndarray:
    """Rates (bit/s) of flows given as (link indices, streams on each); every flow must
    cross at least one link (its rate would be unbounded otherwise). `priority`: one level
    per flow, higher served first (`fill_by_priority`); default all equal."""
    n = len(flows)
    w = max((len(f[0]) for f in flows), default=1)
    links = np.zeros((max(n, 1), w), dtype=np.int64)
    mult = np.zeros((max(n, 1), w))
    width = np.zeros(max(n, 1), dtype=np.int64)
    for i, (ls, ms) in enumerate(flows):
        if not ls:
            raise ValueError(f"flows[{i}]: a flow must cross at least one link")
        links[i, : len(ls)] = ls
        mult[i, : len(ms)] = ms
        width[i] = len(ls)
    cap = np.ascontiguousarray(capacity, dtype=np.float64)
    link_rate = np.zeros((1, cap.size))
    prio = np.zeros(max(n, 1), dtype=np.int64)
    if priority is not None:
        if len(priority) != n:
            raise ValueError(f"priority: {len(priority)} levels for {n} flows")
        prio[:n] = priority
    return fill_by_priority(
        fill, np.arange(n, dtype=np.int64), prio, width, links, mult, np.zeros_like(width), cap,
        link_rate,
    )  # fmt: skip


if __name__ == "__main__":
    import time

    t = time.monotonic()
    print("compiling the simulator's fair-share loop into numba's cache (once per install)")
    warm()
    print(f"fair-share loop compiled, or loaded from the cache, in {time.monotonic() - t:.1f} s")
