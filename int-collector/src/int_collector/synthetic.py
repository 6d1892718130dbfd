"""A synthetic leaf-spine fabric whose state gives valid telemetry reports (load tests,
demo): what `generator` (Python) and `blast` (compiled, `sendmmsg`) both send.

Queues follow bounded random walks, so link state changes over time; hop latency follows
the queue. Reports are built with the same encoder the tests use (`wire`). To reach high
rates, each refresh (every `epoch_s`) encodes a ring of datagrams from the current fabric
state (`_ring`), and sending only patches each datagram's sequence number.
"""

import random
from dataclasses import dataclass

from .wire import Flow, Hop, int_md_v2, report_v1_onos, report_v2, udp_int_packet

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
