"""The host data path in C (`datapath.c`), for `Worker.exchange` and
`ParameterServer.serve`: the same protocol as their Python code, with batched socket calls.

Built with the machine's C compiler (`$CC`, or `cc`) on first use, into `__pycache__` beside
the source or, where that is not writable, `~/.cache/agg-agent`, one build per source and
flags; called through ctypes. Where no compiler is found or the build fails, `reason()` says
why and the endpoints use their Python code (the readable reference). `AGG_DATAPATH`
chooses: `auto` (the default: C where it builds), `native` (C or an error), `python`.

The C path sends a batch of equal datagrams to one address as one segmented send
(UDP_SEGMENT) and reads coalesced ones (UDP_GRO): the same datagrams on the wire, far less
work a packet in the kernel. `AGG_GSO` chooses where: `auto` (the default: to loopback
addresses only, since a software switch that reads a veth with a packet socket, as bmv2
does, would take a segmented batch for one frame), `on` (every address: for hosts whose
NICs or kernels segment, which is any Linux from 4.18 on real interfaces), `off`.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

from agg_agent import blockfloat as bf
from agg_agent.protocol import LANES, MAX_LANES
from agg_agent.results import IterationResult, ServeStats

if TYPE_CHECKING:
    from collections.abc import Callable

    from agg_agent.fixedpoint import FixedPoint


class Worker(Protocol):
    """What the C loop reads of an `endpoints.Worker` (and writes back: `next_index`,
    `srtt`); a protocol, so this module below `endpoints` imports nothing of it."""

    sock: socket.socket
    target: tuple[str, int]
    job_id: int
    worker_id: int
    fixed: FixedPoint
    window: int
    timeout: float
    max_retries: int
    flight: int
    deadline_s: float
    lanes: int
    run_id: int | None
    next_index: int
    srtt: float | None


class ParameterServer(Protocol):
    """What the C loop reads of an `endpoints.ParameterServer` (and writes back: its run
    and counters)."""

    sock: socket.socket
    job_id: int
    fixed: FixedPoint
    workers: list[tuple[str, int]]
    first_seq: int
    lanes: int
    run_id: int
    runs: int
    other_runs: int
    other_sizes: int
    _stop: bool


log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("datapath.c")
# -ffp-contract=off: no fused multiply-add, whatever the compiler's default, so the
# conversions round as blockfloat.py's numpy does (bit for bit); -fno-trapping-math lets
# the conversions' selects vectorize (it drops FP exception flags, never changes a value)
FLAGS = (
    "-O3", "-ffp-contract=off", "-fno-trapping-math", "-std=gnu11", "-shared", "-fPIC",
    "-Wall", "-Wno-unused-function",
)  # fmt: skip
LIBS = ("-lm",)
STEPS_A_POLL = 64


class WorkerCfg(ctypes.Structure):
    _fields_ = [
        ("fd", ctypes.c_int32),
        ("target_ip", ctypes.c_uint32),
        ("target_port", ctypes.c_uint16),
        ("job", ctypes.c_uint16),
        ("worker", ctypes.c_uint8),
        ("fan_in", ctypes.c_uint8),
        ("window", ctypes.c_uint16),
        ("run", ctypes.c_uint32),
        ("lanes", ctypes.c_int32),
        ("timeout_s", ctypes.c_double),
        ("deadline_s", ctypes.c_double),
        ("max_retries", ctypes.c_int64),
        ("flight", ctypes.c_int32),
        ("gso", ctypes.c_int32),
    ]


class WorkerOut(ctypes.Structure):
    _fields_ = [
        ("packets", ctypes.c_int64),
        ("retrans", ctypes.c_int64),
        ("seconds", ctypes.c_double),
        ("srtt", ctypes.c_double),
        ("fail", ctypes.c_int32),
        ("fail_errno", ctypes.c_int32),
        ("fail_chunk", ctypes.c_int64),
        ("fail_waited", ctypes.c_double),
        ("fail_holds", ctypes.c_int64),
        ("reset_run", ctypes.c_uint32),
        ("queue_counts", ctypes.c_int64 * 256),
    ]


class PsStats(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_int64)
        for name in (
            "chunks", "steps", "aggregated", "raw", "duplicates", "runs", "other_runs",
            "step_aggregated", "step_raw",
        )
    ]  # fmt: skip


def _build_name() -> str:
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(repr((FLAGS, LIBS)).encode())
    return f"datapath-{h.hexdigest()[:16]}.so"


def _folders() -> list[Path]:
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return [SOURCE.parent / "__pycache__", Path(home) / "agg-agent"]


def _compile(name: str) -> Path:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise FileNotFoundError("no C compiler ($CC, cc or gcc)")
    errors = []
    for folder in _folders():
        try:
            folder.mkdir(parents=True, exist_ok=True)
            # built beside, then renamed: a concurrent loader never sees half a library
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
            os.close(fd)
        except OSError as e:
            errors.append(f"{folder}: {e}")
            continue
        r = subprocess.run(
            [cc, *FLAGS, "-o", tmp, str(SOURCE), *LIBS], capture_output=True, text=True
        )
        if r.returncode != 0:
            os.unlink(tmp)
            raise RuntimeError(f"{cc} failed on {SOURCE.name}: {r.stderr[-2000:]}")
        os.replace(tmp, folder / name)
        return folder / name
    raise OSError("; ".join(errors))


@functools.cache
def _lib() -> ctypes.CDLL | str:
    """The loaded library, or why there is none."""
    name = _build_name()
    try:
        built = next((d / name for d in _folders() if (d / name).is_file()), None) or _compile(name)
        lib = ctypes.CDLL(str(built))
    except (OSError, RuntimeError) as e:
        return f"the C data path did not build: {e}"
    if (lib.agg_lanes(), lib.agg_max_lanes()) != (LANES, MAX_LANES):
        return f"{built}: {lib.agg_lanes()}..{lib.agg_max_lanes()} lanes, not {LANES}..{MAX_LANES}"
    layout = (ctypes.c_int32 * 6)()
    lib.agg_bf_layout(layout)
    want = (bf.BLOCK, bf.EXP_MIN, bf.EXP_MAX, bf.BAND, bf.BANDS, bf.HEAD)
    if tuple(layout) != want:
        return f"{built}: block floating point {tuple(layout)}, not blockfloat's {want}"
    lib.agg_bf_agreement.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    lib.agg_bf_agreement32.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    lib.agg_bf_encode.restype = ctypes.c_int64
    lib.agg_bf_encode.argtypes = [
        ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int,
        ctypes.c_void_p,
    ]  # fmt: skip
    lib.agg_bf_decode.argtypes = [
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int,
        ctypes.c_void_p,
    ]  # fmt: skip
    lib.agg_worker_exchange.restype = ctypes.c_int
    lib.agg_worker_exchange.argtypes = [
        ctypes.POINTER(WorkerCfg), ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
        ctypes.c_int32, ctypes.c_void_p, ctypes.POINTER(WorkerOut),
    ]  # fmt: skip
    lib.agg_worker_exchange_bf.restype = ctypes.c_int
    lib.agg_worker_exchange_bf.argtypes = [
        ctypes.POINTER(WorkerCfg), ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
        ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_int32,
        ctypes.POINTER(WorkerOut),
    ]  # fmt: skip
    lib.agg_ps_new.restype = ctypes.c_void_p
    lib.agg_ps_new.argtypes = [
        ctypes.c_int, ctypes.c_uint16, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_uint32, ctypes.c_uint32, ctypes.c_int64, ctypes.c_int32,
    ]  # fmt: skip
    lib.agg_ps_free.argtypes = [ctypes.c_void_p]
    lib.agg_ps_set_gso.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.agg_gso_stats.argtypes = [ctypes.c_void_p]
    lib.agg_ps_set_workers.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.agg_ps_run.restype = ctypes.c_uint32
    lib.agg_ps_run.argtypes = [ctypes.c_void_p]
    lib.agg_ps_other_sizes.restype = ctypes.c_int64
    lib.agg_ps_other_sizes.argtypes = [ctypes.c_void_p]
    lib.agg_ps_poll.restype = ctypes.c_int64
    lib.agg_ps_poll.argtypes = [
        ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(PsStats), ctypes.c_void_p, ctypes.c_int64,
        ctypes.c_void_p,
    ]  # fmt: skip
    return lib


def reason() -> str | None:
    """Why the C data path cannot be used here (None: it can)."""
    lib = _lib()
    return lib if isinstance(lib, str) else None


def choose(requested: str | None = None) -> str:
    """'native' or 'python', from `requested` or AGG_DATAPATH (auto: C where it builds)."""
    want = (requested or os.environ.get("AGG_DATAPATH") or "auto").lower()
    if want not in ("auto", "native", "python"):
        raise ValueError(f"AGG_DATAPATH: 'auto', 'native' or 'python', got {want!r}")
    if want == "python":
        return "python"
    why = reason()
    if why is None:
        return "native"
    if want == "native":
        raise RuntimeError(why)
    log.warning("%s: using the Python data path", why)
    return "python"


GSO_MODES = {"off": 0, "on": 1, "auto": 2}


def gso_mode() -> int:
    """`AGG_GSO` as the C code takes it: 0 off, 1 on, 2 to loopback addresses only."""
    want = (os.environ.get("AGG_GSO") or "auto").lower()
    if want not in GSO_MODES:
        raise ValueError(f"AGG_GSO: 'auto', 'on' or 'off', got {want!r}")
    return GSO_MODES[want]


def gso_stats() -> tuple[int, int, bool]:
    """This process's segmented sends, coalesced messages read, and whether the kernel
    refused segmentation (then every datagram goes alone, as with `AGG_GSO=off`)."""
    out = (ctypes.c_int64 * 3)()
    _ready().agg_gso_stats(out)
    refused = bool(out[2])
    if refused and not _said_refused:
        _said_refused.append(True)
        log.warning("the kernel refused UDP segmentation (no support on this route, or a "
                    "packet over its MTU): sending datagram by datagram from now on")  # fmt: skip
    return out[0], out[1], refused


_said_refused: list[bool] = []


@functools.lru_cache(maxsize=256)
def _ip_port(addr: tuple[str, int]) -> tuple[int, int]:
    """An address in network order, resolved once (not on every exchange)."""
    ip = int.from_bytes(socket.inet_aton(socket.gethostbyname(addr[0])), "little")
    return ip, socket.htons(addr[1])


def _cfg(w: Worker) -> tuple[WorkerCfg, WorkerOut]:
    ip, port = _ip_port(w.target)
    cfg = WorkerCfg(
        w.sock.fileno(), ip, port, w.job_id, w.worker_id, w.fixed.workers, w.window,
        w.run_id or 0, w.lanes, w.timeout, -1.0 if w.deadline_s is None else w.deadline_s,
        w.max_retries, w.flight, gso_mode(),
    )  # fmt: skip
    out = WorkerOut()
    out.srtt = -1.0 if w.srtt is None else w.srtt
    return cfg, out


def exchange(
    w: Worker, q: npt.NDArray[np.int32], end: bool
) -> tuple[int, int, float, npt.NDArray[np.int64], WorkerOut]:
    """`Worker.exchange`'s loop in C: (packets, retransmissions, seconds, sums, details)."""
    lib = _ready()
    chunks = -(-q.size // w.lanes)
    if q.size == chunks * w.lanes:
        lanes = np.ascontiguousarray(q, np.int32)
    else:
        lanes = np.zeros(chunks * w.lanes, np.int32)
        lanes[: q.size] = q
    sums = np.empty(chunks * w.lanes, np.int64)
    cfg, out = _cfg(w)
    lib.agg_worker_exchange(
        ctypes.byref(cfg), w.next_index, lanes.ctypes.data, chunks, int(end),
        sums.ctypes.data, ctypes.byref(out),
    )  # fmt: skip
    return out.packets, out.retrans, out.seconds, sums[: q.size], out


def exchange_blocks(
    w: Worker,
    x: npt.NDArray[np.float32],
    tops: npt.NDArray[np.int64],
    y: npt.NDArray[np.float32],
    end: bool,
) -> tuple[int, int, float, int, WorkerOut]:
    """The values of float32 `x`'s blocks agreed at `tops`, exchanged in block floating
    point, and the mean over the workers into float32 `y` (may be `x`): in one pass,
    `blockfloat.encode`, `Worker.exchange`, `blockfloat.decode` and the division by the
    number of workers, rounded to float32 (numpy's and torch's steps, bit for bit).
    Returns (packets, retransmissions, seconds, chunks, details)."""
    lib = _ready()
    for name, a in (("x", x), ("y", y)):
        if a.dtype != np.float32 or not a.flags.c_contiguous or a.size != x.size:
            raise ValueError(f"{name}: a contiguous float32 array of {x.size} values")
    if not y.flags.writeable:
        raise ValueError("y: read-only")
    tops = np.ascontiguousarray(tops, np.int64)
    if tops.size != bf.blocks(x.size):
        raise ValueError(f"tops: {tops.size} blocks for {x.size} values")
    workers = w.fixed.workers
    bf.headroom(workers)
    chunks = -(-int(np.count_nonzero(bf.sent(tops))) * bf.BLOCK // w.lanes)
    cfg, out = _cfg(w)
    lib.agg_worker_exchange_bf(
        ctypes.byref(cfg), w.next_index, x.ctypes.data, x.size, tops.ctypes.data, bf.NONE,
        workers, y.ctypes.data, int(end), ctypes.byref(out),
    )  # fmt: skip
    return out.packets, out.retrans, out.seconds, chunks, out


def serve(
    ps: ParameterServer, retain: int, each: Callable[[IterationResult], None] | None
) -> ServeStats:
    """`ParameterServer.serve`'s loop in C, until `ps.stop()`; `each` per step, as there."""
    from agg_agent.fixedpoint import FixedPointOverflow

    lib = _lib()
    assert not isinstance(lib, str), lib

    def addresses() -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint16]]:
        ips, ports = zip(*(_ip_port(a) for a in ps.workers), strict=True)
        return np.array(ips, np.uint32), np.array(ports, np.uint16)

    known = list(ps.workers)
    ip_arr, port_arr = addresses()
    handle = lib.agg_ps_new(
        ps.sock.fileno(), ps.job_id, ps.fixed.workers, ip_arr.ctypes.data, port_arr.ctypes.data,
        ps.run_id, ps.first_seq, retain, ps.lanes,
    )  # fmt: skip
    if not handle:
        raise MemoryError(f"the C parameter server: no memory for {retain} chunks of {ps.lanes}")
    lib.agg_ps_set_gso(handle, gso_mode())
    st = PsStats(runs=ps.runs)
    steps = np.zeros(3 * STEPS_A_POLL, np.float64)
    overflow = np.zeros(3, np.int64)
    done = 0
    try:
        while not ps._stop:
            if ps.workers != known:  # changed by its owner, as Python's serve would see
                known = list(ps.workers)
                ip_arr, port_arr = addresses()
                lib.agg_ps_set_workers(handle, ip_arr.ctypes.data, port_arr.ctypes.data)
            n = lib.agg_ps_poll(
                handle, 50, ctypes.byref(st), steps.ctypes.data, STEPS_A_POLL,
                overflow.ctypes.data,
            )  # fmt: skip
            ps.run_id, ps.runs, ps.other_runs = lib.agg_ps_run(handle), st.runs, st.other_runs
            gso_stats()
            if lib.agg_ps_other_sizes(handle) > ps.other_sizes:
                if not ps.other_sizes:
                    log.warning(
                        "job %d: packets with another number of values than this parameter "
                        "server's %d (set the same lanes on every rank and the PS): dropped",
                        ps.job_id, ps.lanes,
                    )  # fmt: skip
                ps.other_sizes = lib.agg_ps_other_sizes(handle)
            if n == -2:
                raise MemoryError("the C parameter server: no memory for a receive batch")
            if n < 0:
                idx, lane, value = (int(v) for v in overflow)
                raise FixedPointOverflow(f"sum[{lane}]: {value} outside int32 (chunk {idx})")
            for k in range(min(n, STEPS_A_POLL)):
                if each is not None:
                    r = IterationResult(done, np.zeros(0), float(steps[3 * k + 2]))
                    r.aggregated_packets, r.raw_packets = int(steps[3 * k]), int(steps[3 * k + 1])
                    each(r)
                done += 1
    finally:
        lib.agg_ps_free(handle)
    return ServeStats(st.chunks, st.steps, st.aggregated, st.raw, st.duplicates, st.runs)


# Block floating point (agg_agent.blockfloat, the reference): the hook's conversions of a
# bucket, one pass over it in C instead of numpy's several (docs/benchmarks/training.md).


def _ready() -> ctypes.CDLL:
    lib = _lib()
    if isinstance(lib, str):
        raise RuntimeError(lib)
    return lib


def bf_agreement(x: npt.NDArray[np.float64]) -> npt.NDArray[np.int32]:
    """`blockfloat.agreement(x)`, in C."""
    x = np.ascontiguousarray(x, np.float64)
    out = np.zeros(bf.agreement_lanes(x.size), np.int32)
    _ready().agg_bf_agreement(x.ctypes.data, x.size, out.ctypes.data)
    return out


def bf_agreement32(x: npt.NDArray[np.float32]) -> npt.NDArray[np.int32]:
    """`blockfloat.agreement(x)` of float32 values (as float64, exactly), in C."""
    x = np.ascontiguousarray(x, np.float32)
    out = np.zeros(bf.agreement_lanes(x.size), np.int32)
    _ready().agg_bf_agreement32(x.ctypes.data, x.size, out.ctypes.data)
    return out


def bf_encode(
    x: npt.NDArray[np.float64], tops: npt.NDArray[np.int64], workers: int
) -> npt.NDArray[np.int32]:
    """`blockfloat.encode(x, tops, workers)`, in C."""
    x = np.ascontiguousarray(x, np.float64)
    tops = np.ascontiguousarray(tops, np.int64)
    bf.headroom(workers)  # the same ValueError for a bad count
    if tops.size != bf.blocks(x.size):
        raise ValueError(f"tops: {tops.size} blocks for {x.size} values")
    out = np.empty(int(np.count_nonzero(bf.sent(tops))) * bf.BLOCK, np.int32)
    n = _ready().agg_bf_encode(x.ctypes.data, x.size, tops.ctypes.data, bf.NONE, workers,
                               out.ctypes.data)  # fmt: skip
    assert n == out.size
    return out


def bf_decode(
    sums: npt.NDArray[np.integer], tops: npt.NDArray[np.int64], n: int, workers: int
) -> npt.NDArray[np.float64]:
    """`blockfloat.decode(sums, tops, n, workers)`, in C."""
    sums = np.ascontiguousarray(sums, np.int64)
    tops = np.ascontiguousarray(tops, np.int64)
    bf.headroom(workers)
    if tops.size != bf.blocks(n) or sums.size != np.count_nonzero(bf.sent(tops)) * bf.BLOCK:
        raise ValueError(f"sums: {sums.size} values for {tops.size} blocks of {n} values")
    out = np.empty(n, np.float64)
    _ready().agg_bf_decode(sums.ctypes.data, tops.ctypes.data, bf.NONE, n, workers,
                           out.ctypes.data)  # fmt: skip
    return out
