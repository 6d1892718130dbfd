"""A synthetic leaf-spine fabric that emits valid telemetry reports (load tests, demo).

Queues follow bounded random walks, so link state changes over time; hop latency follows
the queue. Reports are built with the same encoder the tests use (`wire`). To reach high
rates in Python, each refresh (every `epoch_s`) encodes a ring of datagrams from the
current fabric state, and sending only patches each datagram's sequence number.
"""

from __future__ import annotations

import random
import socket
import struct
import time
from dataclasses import dataclass

from .wire import REPORT_V2, Flow, Hop, int_md_v2, report_v1_onos, report_v2, udp_int_packet

# Node ID, L1 ports, hop latency, queue, ingress and egress timestamps, tx utilisation.
V2_BITMAP = 0xFD00
# What ONOS's INT app typically asks bmv2 for: switch ID, ports, hop latency, queue.
V1_BITMAP = 0xF000
INT_UDP_PORT = 5000
# ONOS's int.p4 pushes the sink's hop onto the report's clone: its egress port is the
# mirror port towards the collector.
V1_MIRROR_PORT = 255


@dataclass
class _Link:
    queue: float
    util: float


class SyntheticFabric:
    """`switches` nodes: a quarter spines (at least one), the rest leaves with hosts."""

    def __init__(self, switches: int, seed: int = 0, family: str = "v2") -> None:
        if switches < 2:
            raise ValueError("switches: need at least 2 (one spine, one leaf)")
        self.rng = random.Random(seed)
        self.family = family
        n_spine = max(1, switches // 4)
        self.spines = list(range(1, n_spine + 1))
        self.leaves = list(range(n_spine + 1, switches + 1))
        # Leaf port p (1..n_spine) goes to spine p; port 100+ to hosts. Spine port = leaf index.
        self.links: dict[tuple[int, int], _Link] = {}
        for leaf in self.leaves:
            for sp in self.spines:
                self.links[(leaf, sp)] = _Link(self.rng.uniform(0, 50), self.rng.uniform(0.1, 0.6))
                self.links[(sp, leaf)] = _Link(self.rng.uniform(0, 50), self.rng.uniform(0.1, 0.6))
            self.links[(leaf, 100)] = _Link(0, self.rng.uniform(0.1, 0.4))
        self.clock_ns = 1_000_000_000
        self.seq: dict[int, int] = {leaf: 0 for leaf in self.leaves}

    def step(self, dt_s: float) -> None:
        """Advance time: every queue and utilisation takes a bounded random step."""
        self.clock_ns += int(dt_s * 1e9)
        g = self.rng.gauss
        for link in self.links.values():
            link.queue = min(500.0, max(0.0, link.queue + g(0, 8)))
            link.util = min(1.0, max(0.0, link.util + g(0, 0.03)))

    def _hop(self, node: int, in_port: int, out_port: int, peer: int) -> Hop:
        link = self.links[(node, peer if peer else out_port)]
        occ = int(link.queue)
        latency = 800 + occ * 120 + self.rng.randrange(200)  # ns: pipeline + queueing
        ingress = self.clock_ns + self.rng.randrange(1000)
        return Hop(
            node_id=node,
            ingress_port=in_port,
            egress_port=out_port,
            hop_latency=latency if self.family == "v2" else max(1, latency // 1000),
            queue_id=0,
            queue_occupancy=occ,
            ingress_ts=ingress,
            egress_ts=ingress + latency,
            tx_utilization=int(link.util * 1_000_000),
        )

    def random_report(self) -> tuple[int, bytes]:
        """(sink node, datagram) for a random flow between two hosts."""
        rng = self.rng
        src_leaf, dst_leaf = rng.choice(self.leaves), rng.choice(self.leaves)
        flow = Flow(
            bytes([10, 0, src_leaf % 256, rng.randrange(1, 8)]),
            bytes([10, 0, dst_leaf % 256, rng.randrange(1, 8)]),
            17,
            rng.randrange(1024, 65535),
            INT_UDP_PORT,
        )
        if src_leaf == dst_leaf:
            hops = [self._hop(src_leaf, 101, 100, 0)]
        else:
            spine = self.spines[flow.sport % len(self.spines)]
            s_port = self.leaves.index(src_leaf) + 1
            d_port = self.leaves.index(dst_leaf) + 1
            hops = [
                self._hop(dst_leaf, spine, 100, 0),
                self._hop(spine, s_port, d_port, dst_leaf),
                self._hop(src_leaf, 101, spine, spine),
            ]
        seq = self.seq[dst_leaf]
        self.seq[dst_leaf] = seq + 1
        if self.family == "v1":
            hops[0].egress_port = V1_MIRROR_PORT
            data = report_v1_onos(
                dst_leaf, flow, V1_BITMAP, hops, seq=seq, remaining_hop_count=5,
                ingress_ts=(hops[0].ingress_ts or 0) // 1000 & 0xFFFFFFFF,  # bmv2: us
            )  # fmt: skip
        else:
            inner = udp_int_packet(
                flow, int_md_v2(V2_BITMAP, hops, remaining_hop_count=8 - len(hops))
            )
            data = report_v2(dst_leaf, seq, inner)
        return dst_leaf, data


def _ring(
    fabric: SyntheticFabric, pool: int, per_datagram: int, sinks: list[int]
) -> list[tuple[int, bytearray]]:
    """Datagrams of `per_datagram` individual reports, each from one of `sinks`."""
    by_sink: dict[int, list[bytes]] = {s: [] for s in sinks}
    want = max(pool, per_datagram * len(sinks))
    guard = 0
    while sum(map(len, by_sink.values())) < want and guard < 50 * want:
        guard += 1
        sink, data = fabric.random_report()
        if sink in by_sink:
            by_sink[sink].append(data)
    out: list[tuple[int, bytearray]] = []
    for sink, datas in by_sink.items():
        if fabric.family == "v1" or per_datagram == 1:
            out.extend((sink, bytearray(d)) for d in datas)
            continue
        # Telemetry Report v2.0: one group header, then several individual reports.
        for k in range(0, len(datas) - per_datagram + 1, per_datagram):
            chunk = datas[k : k + per_datagram]
            out.append((sink, bytearray(chunk[0][:8] + b"".join(d[8:] for d in chunk))))
    random.Random(len(out)).shuffle(out)
    return out


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
