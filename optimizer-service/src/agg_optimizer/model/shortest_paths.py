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

The search has two kernels, the same loops: `routing_kernel.c`, built by the machine's C
compiler for its own CPU (-march=native: a link relaxed for the 16 roots four at a time
in AVX registers) into a shared library beside the sources, and called through ctypes; and
`_blocks` below, compiled by numba where there is no C compiler (a slim container image).
At k=64 with 10,000 jobs the C kernel routes in 0.42-0.48 s against numba's 0.84-0.98 s,
and a fresh process loads it in milliseconds where importing numba and loading its cache
took 3.1-3.4 s (docs/benchmarks/scale.md, round 6). Building either costs seconds once per
install (`make sync` runs this module). `Network.next_hops` uses the search where it pays
(`use_compiled`): from `LOADED_MIN_WORK` where it is loaded or the C kernel is built, and
otherwise, where it would have to be built or numba loaded, from `COMPILED_MIN_WORK`.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

NO_HOP = -9999  # scipy's predecessor value for "none"
# Work of a routing call: roots x directed links (k=32 with 1,000 jobs: 1.3e7; k=48 with
# 10,000 jobs: 1.3e8; k=64 with 3,000 jobs: 4.1e8; k=64 with 10,000 jobs: 5.3e8). scipy
# takes about 10 ns per unit on the test machine, so building the C kernel (about 1 s) or
# loading numba's (3.1-3.4 s) pays from about 3e8 in a fresh process.
COMPILED_MIN_WORK = 3e8
# Once loaded, or where the C kernel is built already (loading it takes a millisecond), from
# this much work on (below it, the threads cost more than they save).
LOADED_MIN_WORK = 2e7
LANES = 16  # roots per block: a block's distances (switches x 16 x 8 bytes) stay in cache
MAX_SWEEPS = 64  # a block not settled by then is scipy's
C_SOURCE = Path(__file__).with_name("routing_kernel.c")
# -march=native: the build is for this machine's CPU (its name says which: `_c_build_name`).
# Never -ffast-math: distances must be the IEEE sums scipy's Dijkstra takes.
C_FLAGS = ("-O3", "-march=native", "-shared", "-fPIC")

_compiled: Callable[..., None] | None = None
kernel_name: str | None = None  # "c" or "numba", once one is loaded
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


@functools.cache
def _cpu() -> str:
    """What a build with -march=native depends on: the machine and its CPU's features."""
    sig = [platform.machine()]
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key = line.split(":", 1)[0].strip()
                if key in ("vendor_id", "model name", "flags", "Features", "CPU part"):
                    sig.append(line.strip())
                elif not line.strip() and len(sig) > 1:
                    break  # the first processor's lines are enough
    except OSError:
        sig.append(platform.processor())
    return "\n".join(sig)


def _c_build_name() -> str:
    """The shared library's file name: one per source, flags and CPU."""
    h = hashlib.sha256(C_SOURCE.read_bytes())
    h.update(repr(C_FLAGS).encode())
    h.update(_cpu().encode())
    return f"routing_kernel-{h.hexdigest()[:16]}.so"


def _c_folders() -> list[Path]:
    """Where a build is looked for and written: beside the sources, as numba's cache is, or
    the user's cache folder where the package's is not writable (an image's venv)."""
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return [C_SOURCE.parent / "__pycache__", Path(home) / "agg-optimizer"]


def c_kernel(build: bool = True) -> Callable[..., None]:
    """The kernel in C (`routing_kernel.c`), called through ctypes with `_blocks`'s
    arguments. Built with the C compiler (`$CC`, or `cc`) on first use where no build for
    this source, these flags and this CPU exists and `build`; raises saying why where it
    cannot be built or loaded."""
    name = _c_build_name()
    built = next((d / name for d in _c_folders() if (d / name).is_file()), None)
    if built is None:
        if not build:
            raise FileNotFoundError(f"{name} not built")
        built = _c_compile(name)
    lib = ctypes.CDLL(str(built))
    if lib.lanes_per_block() != LANES:
        raise RuntimeError(f"{built}: a block of {lib.lanes_per_block()} roots, not {LANES}")
    fn = lib.blocks
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int64, *[ctypes.c_void_p] * 9, *[ctypes.c_int64] * 3]
    fn.argtypes += [ctypes.c_void_p, ctypes.c_void_p]
    i64, f64 = np.dtype(np.int64), np.dtype(np.float64)
    kinds = (i64, i64, f64, i64, i64, f64, i64, i64, i64)  # the graph, its transpose, roots, t_*

    def kernel(*a: Any) -> None:  # `_blocks`'s arguments
        arrays, (most, first, last, pred, again) = a[:9], a[9:]
        for i, (x, kind) in enumerate(zip(arrays, kinds, strict=True)):
            if x.dtype != kind or not x.flags.c_contiguous:
                raise TypeError(f"argument {i}: a contiguous {kind} array is needed")
        if pred.dtype != np.int32 or not pred.flags.c_contiguous or again.dtype != np.bool_:
            raise TypeError("pred: a contiguous int32 array, again: a bool array are needed")
        n = len(arrays[0]) - 1
        pointers = [x.ctypes.data for x in arrays]
        if fn(n, *pointers, most, first, last, pred.ctypes.data, again.ctypes.data) != 0:
            raise MemoryError(f"routing: no memory for {n} x {LANES} distances")

    return kernel


def _c_compile(name: str) -> Path:
    cc = shutil.which(os.environ.get("CC") or "cc")
    if cc is None:
        raise RuntimeError("no C compiler: neither $CC nor cc is on PATH")
    tried = []
    for folder in _c_folders():
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".routing_kernel-", suffix=".so", dir=folder)
        except OSError as e:
            tried.append(f"{folder}: {e.strerror}")
            continue
        os.close(fd)
        try:
            run = subprocess.run(
                [cc, *C_FLAGS, "-o", tmp, str(C_SOURCE)],
                capture_output=True,
                text=True,
                timeout=600,
            )
            if run.returncode != 0:
                raise RuntimeError(f"{cc} {' '.join(C_FLAGS)}: {run.stderr.strip()[-500:]}")
            os.replace(tmp, folder / name)  # atomic: another process may build it too
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        log.info("routing kernel compiled into %s", folder / name)
        return folder / name
    raise RuntimeError(f"no writable folder for the routing kernel ({'; '.join(tried)})")


def numba_kernel() -> Callable[..., None]:
    """`_blocks` compiled by numba (cached beside the sources): where no C compiler is."""
    from numba import njit

    return njit(nogil=True, cache=True)(_blocks)


def _kernel() -> Callable[..., None]:
    """The kernel in use: C's where it can be built, numba's otherwise."""
    global _compiled, kernel_name
    with _lock:
        if _compiled is None:
            try:
                _compiled, kernel_name = c_kernel(), "c"
            except Exception as e:  # no compiler, no writable folder: numba's instead
                log.info("routing kernel in C unavailable (%s): numba's routes", e)
                _compiled, kernel_name = numba_kernel(), "numba"
        return _compiled


def _c_built() -> bool:
    """Whether the C kernel is built already (then loading it costs a millisecond)."""
    global _compiled, kernel_name
    with _lock:
        if _compiled is None:
            try:
                _compiled, kernel_name = c_kernel(build=False), "c"
            except Exception:
                return False
        return kernel_name == "c"


def use_compiled(work: float) -> bool:
    """Whether a routing call of this much work (roots x directed links) should use this
    search rather than scipy's. Loads it on the first call that should; where it cannot be
    compiled or loaded (no compiler and no numba, no writable cache folder), says why once
    in the log and answers False from then on: scipy routes the same."""
    global _failed
    loaded = work >= LOADED_MIN_WORK and (_ready or (_failed is None and _c_built()))
    if not (work >= COMPILED_MIN_WORK or loaded):
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
    kernel: Callable[..., None] | None = None,
) -> np.ndarray:
    """pred[i, v]: the node before v on a shortest path from roots[i] in the CSR graph `gt`
    (scipy's `dijkstra(gt, indices=roots, return_predecessors=True)[1]`), given on the paths
    of the nodes `targets[i]` (None, or an empty array: every node) and -9999 elsewhere. The
    rows of roots where a path read ties with another are scipy's own. `kernel`: the one
    to search with (`c_kernel()`, `numba_kernel()`); by default the one in use."""
    n = gt.shape[0]
    roots = np.ascontiguousarray(roots, dtype=np.int64)
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
        np.ascontiguousarray(g.indptr, dtype=i64),
        np.ascontiguousarray(g.indices, dtype=i64),
        np.ascontiguousarray(g.data, dtype=f64),
        np.ascontiguousarray(r.indptr, dtype=i64),
        np.ascontiguousarray(r.indices, dtype=i64),
        np.ascontiguousarray(r.data, dtype=f64),
        roots,
        t_ptr,
        t_idx,
        MAX_SWEEPS,
    )
    kernel = kernel or _kernel()
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


def warm(kernel: Callable[..., None] | None = None) -> None:
    """Build the search (or load it from its cache), as `make sync` does once; `kernel`:
    that one (`c_kernel()` or `numba_kernel()`) rather than the one in use."""
    global _ready
    from scipy.sparse import csr_matrix

    gt = csr_matrix((np.ones(2), (np.array([0, 1]), np.array([1, 0]))), shape=(2, 2))
    next_hops(gt, np.array([0]), workers=1, kernel=kernel)
    if kernel is None:
        _ready = True


if __name__ == "__main__":
    import time

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    t = time.monotonic()
    print("building the routing search into its cache (once per install)")
    warm()
    print(f"routing search ({kernel_name}) built or loaded in {time.monotonic() - t:.1f} s")
    if kernel_name == "c":  # numba's too, for a process where the C build is missing
        t = time.monotonic()
        warm(numba_kernel())
        print(f"routing search (numba) compiled or loaded in {time.monotonic() - t:.1f} s")
