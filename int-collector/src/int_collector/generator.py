"""Sends the synthetic fabric's telemetry reports (`synthetic`) at a rate: from Python, or
with `fast` from compiled code (`blast`).
"""

from __future__ import annotations

import socket
import struct
import time

from .synthetic import SyntheticFabric, _ring
from .wire import REPORT_V2

__all__ = ["SyntheticFabric", "generate"]


def generate(
    target: tuple[str, int],
    rate: float,
    switches: int,
    duration_s: float | None = None,
    count: int | None = None,
    seed: int = 0,
    family: str = "v2",
    epoch_s: float = 0.5,
    pool: int = 512,
    per_datagram: int = 1,
    processes: int = 1,
    fast: bool = False,
    flows: int = 0,
) -> int:
    """Send reports at `rate` per second until `duration_s` or `count`; returns reports sent.

    `fast`: send with `sendmmsg` from compiled code (`blast.py`; needs `duration_s`, one
    process), for rates the Python sender cannot offer; `flows` > 0 makes its datagrams
    carry that many distinct flows (v2).

    Every reporting switch sends from a socket of its own (its own source port), as
    separate switches would, so SO_REUSEPORT spreads switches over the collector's workers.
    `per_datagram` > 1 packs that many individual reports of one switch into each
    Telemetry Report v2.0 datagram (one sequence number per datagram). `processes` > 1
    splits the switches and the rate over that many sender processes.
    """
    if per_datagram < 1 or (family == "v1" and per_datagram > 1):
        raise ValueError(
            f"per_datagram: {per_datagram} (v1 carries one report per datagram; v2 needs >= 1)"
        )
    if processes < 1:
        raise ValueError(f"processes: must be >= 1, got {processes}")
    if fast:
        if duration_s is None or count is not None or processes != 1:
            raise ValueError("fast: sends for a duration, from one process")
        from .blast import send

        return send(target, rate, switches, duration_s, seed, family, epoch_s, pool,
                    per_datagram, flows)  # fmt: skip
    if processes == 1:
        return _send(target, rate, switches, duration_s, count, seed, family, epoch_s, pool,
                     per_datagram, 0, 1)  # fmt: skip
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    with ctx.Pool(processes) as p:
        args = [
            (target, rate / processes, switches, duration_s,
             None if count is None else count // processes + (i < count % processes),
             seed, family, epoch_s, pool, per_datagram, i, processes)
            for i in range(processes)
        ]  # fmt: skip
        return sum(p.starmap(_send, args))


def _send(
    target: tuple[str, int],
    rate: float,
    switches: int,
    duration_s: float | None,
    count: int | None,
    seed: int,
    family: str,
    epoch_s: float,
    pool: int,
    per_datagram: int,
    part: int,
    parts: int,
) -> int:
    fabric = SyntheticFabric(switches, seed, family)
    sinks = [leaf for i, leaf in enumerate(fabric.leaves) if i % parts == part]
    if not sinks:
        return 0
    af = socket.AF_INET6 if ":" in target[0] else socket.AF_INET
    socks: dict[int, socket.socket] = {}
    for sink in sinks:
        sk = socket.socket(af, socket.SOCK_DGRAM)
        sk.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1024 * 1024)
        sk.connect(target)
        socks[sink] = sk
    sends = {sink: sk.send for sink, sk in socks.items()}
    seq_word = struct.Struct(">I")
    pack_into = seq_word.pack_into
    seqs = dict.fromkeys(sinks, 0)
    v2 = family == "v2"
    dgram_rate = rate / per_datagram
    # The first epoch's datagrams are built before the clock starts: on a loaded machine
    # building them took longer than a short `duration_s`, and the run sent one datagram.
    fabric.step(epoch_s)
    ring = _ring(fabric, pool, per_datagram, sinks)
    n_ring = len(ring)
    start = time.perf_counter()
    sent = 0  # datagrams
    next_epoch = start + epoch_s
    burst = max(1, int(dgram_rate / 1000))  # rate control by ~1 ms batches
    limit = None if count is None else -(-count // per_datagram)
    while True:
        now = time.perf_counter()
        if duration_s is not None and now - start >= duration_s:
            break
        if limit is not None and sent >= limit:
            break
        if now >= next_epoch:
            fabric.step(epoch_s)
            ring = _ring(fabric, pool, per_datagram, sinks)
            n_ring = len(ring)
            next_epoch = now + epoch_s
        due = int((now - start) * dgram_rate) + 1 - sent
        if due <= 0:
            time.sleep(min(0.001, (sent + 1 - (now - start) * dgram_rate) / dgram_rate))
            continue
        due = min(due, burst * 4)
        if limit is not None:
            due = min(due, limit - sent)
        for i in range(sent, sent + due):
            sink, data = ring[i % n_ring]
            seq = seqs[sink]
            seqs[sink] = seq + 1
            if v2:
                pack_into(data, 0, (REPORT_V2 << 28) | (seq & 0x3FFFFF))
            else:
                pack_into(data, 8, seq & 0xFFFFFFFF)
            try:  # noqa: SIM105 - hot loop; contextlib.suppress costs a call per datagram
                sends[sink](data)
            except (BlockingIOError, ConnectionRefusedError):
                pass  # nobody listening yet, or the kernel queue is full: the report is lost
        sent += due
    for sk in socks.values():
        sk.close()
    return sent * per_datagram
