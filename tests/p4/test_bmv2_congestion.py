"""Congestion feedback on bmv2 (p4/include/congestion.p4).

One simple_switch; port RX drains RATE packets/s. A burst of aggregation packets from
port 1 builds its queue: each packet must leave with agg.max_queue equal to the queue it
was enqueued behind (packets, saturating at 255), raised but never lowered by a hop;
acknowledgements pass unchanged; ECN-capable packets are marked CE exactly when that
queue reached the threshold the control plane set, and never when it is 0 (off).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

import pytest

from agg_agent import p4names as n
from agg_agent.protocol import FLAG_ACK, UDP_PORT, AggPacket

from . import bmv2
from .frames import udp_frame, udp_payload

REASON = bmv2.skip_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=str(REASON))

RX = 4
RATE, DEPTH = 100, 400  # packets/s and the queue's depth on port RX
BURST = 60


@pytest.fixture(scope="module")
def switch() -> Iterator[bmv2.Bmv2]:
    with bmv2.Bmv2([1, RX]) as sw:
        bmv2.bottleneck(sw, RX, RX, RATE, DEPTH)
        yield sw


def burst(sw: bmv2.Bmv2, packets: list[AggPacket], ecn: int) -> list[tuple[AggPacket, int]]:
    """Send `packets` from port 1 to RX at 10x RX's rate (back to back, bmv2's input drops
    some of a burst before any queue); return what arrives (in order) with each frame's ECN
    bits."""
    rx, tx = bmv2.RawPort(sw.host_if(RX)), bmv2.RawPort(sw.host_if(1))
    try:
        start = time.monotonic()
        for i, p in enumerate(packets):
            tx.send(udp_frame(1, RX, 40000, UDP_PORT, p.encode(), ecn=ecn))
            pause = start + (i + 1) / (10 * RATE) - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        out: list[tuple[AggPacket, int]] = []
        deadline = time.monotonic() + len(packets) / RATE + 3.0
        rx.sock.settimeout(0.2)
        while len(out) < len(packets) and time.monotonic() < deadline:
            try:
                frame = rx.sock.recv(4096)
            except TimeoutError:
                continue
            payload = udp_payload(frame, UDP_PORT)
            if payload is not None:
                out.append((AggPacket.decode(payload), frame[15] & 0x3))
        return out
    finally:
        rx.close()
        tx.close()


def data(seq: int, max_queue: int = 0, flags: int = 0) -> AggPacket:
    # job 77 has no agg_job entry: the aggregation block passes it through
    return AggPacket(77, seq % 64, 0, 2, seq, 1, flags, max_queue=max_queue)


def test_every_packet_carries_the_queue_it_waited_behind(switch: bmv2.Bmv2) -> None:
    switch.cli(f"table_set_default {n.ECN_TABLE} {n.ECN_SET_THRESHOLD} 0")
    got = burst(switch, [data(s) for s in range(BURST)], ecn=2)
    assert len(got) == BURST, f"{len(got)} of {BURST} arrived"
    queues = [p.max_queue for p, _ in got]
    assert [p.seq for p, _ in got] == list(range(BURST))
    # 10x the drain rate: the queue grows by about 0.9 per packet
    assert queues[0] <= 2 and max(queues) >= BURST // 2, queues
    assert all(b >= a - 1 for a, b in itertools.pairwise(queues)), queues
    assert {e for _, e in got} == {2}, "marking is off: ECT(0) passes unmarked"


def test_a_hop_raises_the_value_but_never_lowers_it(switch: bmv2.Bmv2) -> None:
    got = burst(switch, [data(0, max_queue=200), data(1, max_queue=255)], ecn=0)
    assert [p.max_queue for p, _ in got] == [200, 255]


def test_acknowledgements_pass_unchanged(switch: bmv2.Bmv2) -> None:
    pkts = [data(s, max_queue=7, flags=FLAG_ACK) for s in range(30)]
    got = burst(switch, pkts, ecn=0)
    assert len(got) == 30 and {p.max_queue for p, _ in got} == {7}


@pytest.mark.parametrize("threshold", [5, 20])
def test_ecn_marks_exactly_where_the_queue_reached_the_threshold(
    switch: bmv2.Bmv2, threshold: int
) -> None:
    switch.cli(f"table_set_default {n.ECN_TABLE} {n.ECN_SET_THRESHOLD} {threshold}")
    try:
        got = burst(switch, [data(s) for s in range(BURST)], ecn=2)
        not_ect = burst(switch, [data(s) for s in range(BURST)], ecn=0)
    finally:
        switch.cli(f"table_set_default {n.ECN_TABLE} {n.ECN_SET_THRESHOLD} 0")
    assert len(got) == BURST
    marked = [e == 3 for _, e in got]
    # one hop: max_queue is this queue, so CE iff it reached the threshold
    assert marked == [p.max_queue >= threshold for p, _ in got]
    assert any(marked) and not all(marked)
    assert {e for _, e in not_ect} == {0}, "a packet that is not ECN-capable is never marked"
