"""The generator's compiled sender: the same synthetic reports, sent with `sendmmsg`.

`generator.generate(..., fast=True)` comes here. Reports are made as the generator makes
them (`SyntheticFabric`, a ring refreshed every `epoch_s`); what differs is the sending:
each switch's share of every 2 ms goes out in one `sendmmsg` call on that switch's
socket, with the sequence numbers patched by compiled code, so one core offers several
hundred thousand datagrams per second (the Python sender tops out near 150,000). The
benchmark uses it to offer the collector rates the Python sender cannot.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import socket
import time

import numpy as np
from llvmlite import binding as llvm
from numba import njit, types

from .synthetic import SyntheticFabric, _ring

SLOT = 2048  # bytes per ring datagram at least (more when many reports share one)
LAST_CPU_S = 0.0  # CPU seconds the last `send` spent while sending (user + system)
LAST_ELAPSED_S = 0.0  # wall time of the last `send`, from its first datagram to its last

# Offsets in a v2 datagram (group header 8 B, individual report header 12 B, inner IPv4
# 20 B, UDP): the inner packet's source address (the destination follows) and UDP ports.
FLOW_SRC = 8 + 12 + 12
FLOW_SPORT = 8 + 12 + 20

# libc's sendmmsg, called from compiled code by its symbol name (an external function is
# resolved when the compiled code is loaded), not through a ctypes pointer: a function that
# calls a ctypes pointer embeds its address, and numba cannot cache it (every start compiled
# it again, for seconds, with a warning). Pointers as 64-bit integers: the same in the
# x86-64 and AArch64 calling conventions.
llvm.load_library_permanently(ctypes.util.find_library("c") or "libc.so.6")
sendmmsg = types.ExternalFunction(
    "sendmmsg", types.int32(types.int32, types.int64, types.uint32, types.int32)
)


@njit(cache=True)
def _send_round(bufs, lens, rows, nrows, pos, seqs, fds, counts, v2, mm, iov, flows, sends):
    """Send counts[s] datagrams of switch s from its ring rows (cyclically, from pos[s]),
    each with the switch's next sequence number, one sendmmsg per switch; returns the
    datagrams the kernel took. `flows` > 0 (v2): the first report of each datagram gets
    one of flows 0..flows-1 in its inner packet's addresses and ports (UDP inner packets):
    row r's k-th send carries flow (r + R * (k mod flows // R)) mod flows for R ring rows,
    so that with at least as many flows as rows each flow keeps one row's path (`sends`
    counts each row's sends)."""
    sent = 0
    base = bufs.ctypes.data
    iov_base = iov.ctypes.data
    for s in range(fds.shape[0]):
        if nrows[s] == 0:
            continue
        left = counts[s]
        while left > 0:
            m = min(left, nrows[s], mm.shape[0])
            for j in range(m):
                r = rows[s, (pos[s] + j) % nrows[s]]
                q = seqs[s]
                seqs[s] = q + 1
                if v2:
                    w = (2 << 28) | (q & 0x3FFFFF)
                    o = 0
                else:
                    w = q & 0xFFFFFFFF
                    o = 8
                bufs[r, o] = (w >> 24) & 0xFF
                bufs[r, o + 1] = (w >> 16) & 0xFF
                bufs[r, o + 2] = (w >> 8) & 0xFF
                bufs[r, o + 3] = w & 0xFF
                if flows > 0 and v2:
                    nr = sends.shape[0]
                    f = (r + nr * (sends[r] % max(1, flows // nr))) % flows
                    sends[r] += 1
                    # 10.a.b.c:4000 > 10.255.255.1:5000 with a.b.c = f
                    bufs[r, FLOW_SRC + 1] = (f >> 16) & 0xFF
                    bufs[r, FLOW_SRC + 2] = (f >> 8) & 0xFF
                    bufs[r, FLOW_SRC + 3] = f & 0xFF
                    bufs[r, FLOW_SRC + 4], bufs[r, FLOW_SRC + 5] = 10, 255
                    bufs[r, FLOW_SRC + 6], bufs[r, FLOW_SRC + 7] = 255, 1
                    bufs[r, FLOW_SPORT], bufs[r, FLOW_SPORT + 1] = 4000 >> 8, 4000 & 0xFF
                    bufs[r, FLOW_SPORT + 2], bufs[r, FLOW_SPORT + 3] = 5000 >> 8, 5000 & 0xFF
                iov[j, 0] = base + r * bufs.shape[1]
                iov[j, 1] = lens[r]
                mm[j, 2] = iov_base + j * 16
                mm[j, 3] = 1
            pos[s] = (pos[s] + m) % nrows[s]
            n = sendmmsg(fds[s], mm.ctypes.data, m, 0)
            if n > 0:
                sent += n
            left -= m
    return sent


def send(
    target: tuple[str, int],
    rate: float,
    switches: int,
    duration_s: float,
    seed: int = 0,
    family: str = "v2",
    epoch_s: float = 0.5,
    pool: int = 512,
    per_datagram: int = 1,
    flows: int = 0,
) -> int:
    """Send for `duration_s` at `rate` reports per second; returns reports sent. `flows`
    > 0: that many distinct flows, round robin over the datagrams (v2)."""
    fabric = SyntheticFabric(switches, seed, family)
    sinks = list(fabric.leaves)
    af = socket.AF_INET6 if ":" in target[0] else socket.AF_INET
    socks = []
    for _ in sinks:
        sk = socket.socket(af, socket.SOCK_DGRAM)
        sk.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * 1024 * 1024)
        sk.connect(target)
        socks.append(sk)
    fds = np.array([sk.fileno() for sk in socks], np.int32)
    index = {s: k for k, s in enumerate(sinks)}
    nsinks = len(sinks)
    seqs = np.zeros(nsinks, np.int64)
    pos = np.zeros(nsinks, np.int64)
    mm = np.zeros((256, 8), np.int64)
    iov = np.zeros((256, 2), np.int64)
    sends = np.zeros(1, np.int64)
    dgram_rate = rate / per_datagram
    # Loaded from numba's cache (compiled by `int-collector compile`, or by the first run)
    # before the clock starts.
    warm()
    start = time.perf_counter()
    cpu0 = time.process_time()
    next_epoch = start
    sent = 0  # datagrams due so far (the pace)
    taken = 0  # datagrams the kernel took
    v2 = family == "v2"
    counts = np.zeros(nsinks, np.int64)
    min_burst = max(1, int(dgram_rate * 0.002))
    max_burst = max(min_burst, min(int(dgram_rate * 0.02), 16384))
    bufs = lens = rows = nrows = None
    turn = 0
    try:
        while True:
            now = time.perf_counter()
            if now - start >= duration_s:
                break
            if now >= next_epoch:
                fabric.step(epoch_s)
                ring = _ring(fabric, pool, per_datagram, sinks)
                slot = max(SLOT, max(len(d) for _s, d in ring))
                bufs = np.zeros((len(ring), slot), np.uint8)
                lens = np.zeros(len(ring), np.int64)
                sends = np.zeros(len(ring), np.int64)
                per: list[list[int]] = [[] for _ in sinks]
                for r, (sink, data) in enumerate(ring):
                    bufs[r, : len(data)] = np.frombuffer(bytes(data), np.uint8)
                    lens[r] = len(data)
                    per[index[sink]].append(r)
                nrows = np.array([len(p) for p in per], np.int64)
                rows = np.zeros((nsinks, max(1, int(nrows.max()))), np.int64)
                for k, p in enumerate(per):
                    rows[k, : len(p)] = p
                pos[:] = 0
                next_epoch = now + epoch_s
            due = int((now - start) * dgram_rate) - sent
            if due < min_burst:  # ~2 ms at a time: several datagrams per sendmmsg
                time.sleep(0.0005)
                continue
            if due > max_burst:
                # Behind the rate (asked more than this machine sends): what is overdue is
                # skipped, not sent late, so a round stays short and the duration holds
                # (sending the whole backlog took 17-20 s of a 5 s run).
                sent += due - max_burst
                due = max_burst
            # The datagrams due, spread evenly over the switches (the remainder rotates).
            counts[:] = due // nsinks
            for j in range(due % nsinks):
                counts[(turn + j) % nsinks] += 1
            turn = (turn + due) % nsinks
            taken += _send_round(bufs, lens, rows, nrows, pos, seqs, fds, counts, v2, mm, iov,
                                 flows, sends)  # fmt: skip
            sent += due
    finally:
        global LAST_CPU_S, LAST_ELAPSED_S
        LAST_CPU_S = time.process_time() - cpu0
        LAST_ELAPSED_S = time.perf_counter() - start
        for sk in socks:
            sk.close()
    return taken * per_datagram


def warm() -> None:
    """Compile the sender into numba's cache (or load it), with the argument types `send`
    gives it and nothing to send: `int-collector compile`, and `send` before its clock."""
    _send_round(np.zeros((1, SLOT), np.uint8), np.zeros(1, np.int64), np.zeros((1, 1), np.int64),
                np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(1, np.int64),
                np.zeros(1, np.int32), np.zeros(1, np.int64), True, np.zeros((256, 8), np.int64),
                np.zeros((256, 2), np.int64), 0, np.zeros(1, np.int64))  # fmt: skip
