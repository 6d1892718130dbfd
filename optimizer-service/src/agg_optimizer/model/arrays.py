"""numpy helpers for the engine's hot paths."""

from __future__ import annotations

import numpy as np


def unique_sorted(a: np.ndarray) -> np.ndarray:
    """`np.unique(a)` of a 1-D array, by one sort.

    Without `return_*`, numpy 2.3 and later answer `np.unique` through a hash table, which
    on the 396,325 forest keys of a k=64 fat-tree with 10,000 jobs took 176 ms, against
    8 ms for this sort (docs/benchmarks/scale.md, round 7). The result is the same array.
    """
    s = np.sort(a, kind="stable")
    if len(s) == 0:
        return s
    keep = np.empty(len(s), dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def has_duplicates(a: np.ndarray) -> bool:
    """Whether some value occurs twice in the 1-D array `a` (`len(np.unique(a)) < len(a)`)."""
    s = np.sort(a)
    return bool(np.any(s[1:] == s[:-1]))
