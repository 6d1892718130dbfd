"""Traffic classes on bmv2 (p4/include/priority.p4): strict-priority egress queues.

One simple_switch with 8 queues per port (`--priority-queues 8`); port 4 (the receiver)
drains every queue at RATE packets/s and holds DEPTH packets per queue. A low-class flow
from port 1 offers 4x that rate, so its queue stays full; a sparse flow of aggregation
packets (job 9) from port 2 crosses the same port. With an entry that puts job 9 in
class 7 its packets are served before the backlog; without it they wait behind it.

bmv2 rate-limits each priority queue on its own (bm_sim/queueing.h, QueueingLogicPriRL):
the classes do not share one line rate, so what this shows is the ordering, the
high class overtaking the low one's queue, not a split of a port's capacity.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator

import pytest

from agg_agent import p4names as n
from agg_agent.protocol import LANES, UDP_PORT, AggPacket

from . import bmv2
from .frames import udp_frame, udp_payload

REASON = bmv2.skip_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=str(REASON))

RX, LOW_PORT = 4, 5001
RATE, DEPTH = 200, 40  # packets/s and packets per queue, on port RX
ANY = "0&&&0"


@pytest.fixture(scope="module")
def switch() -> Iterator[bmv2.Bmv2]:
    with bmv2.Bmv2([1, 2, RX], target_args=("--priority-queues", "8")) as sw:
        bmv2.bottleneck(sw, RX, RX, RATE, DEPTH)
        yield sw


def class_entry(cls: int, job: int | None = None, dscp: int | None = None) -> str:
    key = [ANY] * 8  # is_agg, agg_job_id, dscp, then the 5-tuple (p4names.TC_MATCH_FIELDS)
    if job is not None:
        key[:2] = ["1&&&1", f"{job}&&&0xffff"]
    if dscp is not None:
        key[2] = f"{dscp}&&&0x3f"
    return f"table_add {n.TC_TABLE} {n.TC_SET_CLASS} {' '.join(key)} => {cls} 100"


def episode(sw: bmv2.Bmv2, dscp: int = 0) -> tuple[list[float], int, int]:
    """Saturate port RX with the low flow, send 25 job-9 packets through it; return their
    one-way delays, how many of them arrived, and how many low packets arrived."""
    rx = bmv2.RawPort(sw.host_if(RX))
    low_tx, high_tx = bmv2.RawPort(sw.host_if(1)), bmv2.RawPort(sw.host_if(2))
    sent: dict[int, float] = {}
    got: dict[int, float] = {}
    low_got = 0
    stop = threading.Event()

    def receive() -> None:
        nonlocal low_got
        rx.sock.settimeout(0.05)
        while not stop.is_set():
            try:
                data = rx.sock.recv(4096)
            except TimeoutError:
                continue
            t = time.monotonic()
            payload = udp_payload(data, UDP_PORT)
            if payload is not None:
                got.setdefault(AggPacket.decode(payload).seq, t)
            elif udp_payload(data, LOW_PORT) is not None:
                low_got += 1

    def flood() -> None:
        frame = udp_frame(1, RX, 40000, LOW_PORT, bytes(100))
        start = time.monotonic()
        for i in range(int(4 * RATE * 2.0)):  # 4x the rate for 2 s
            low_tx.send(frame)
            pause = start + (i + 1) / (4 * RATE) - time.monotonic()
            if pause > 0:
                time.sleep(pause)

    threads = [threading.Thread(target=receive), threading.Thread(target=flood)]
    for t in threads:
        t.start()
    time.sleep(0.6)  # the low queue is full by now
    for seq in range(25):
        pkt = AggPacket(9, seq % 8, 0, 2, seq, 1, 0, (seq,) * LANES)
        sent[seq] = time.monotonic()
        high_tx.send(udp_frame(2, RX, 40001, UDP_PORT, pkt.encode(), dscp=dscp))
        time.sleep(0.04)
    threads[1].join()
    time.sleep(DEPTH / RATE + 0.3)  # drain
    stop.set()
    threads[0].join()
    for p in (rx, low_tx, high_tx):
        p.close()
    return [got[s] - sent[s] for s in sorted(got)], len(got), low_got


@pytest.mark.parametrize(
    ("entry", "dscp"),
    [(class_entry(7, job=9), 0), (class_entry(5, dscp=46), 46)],
    ids=["by-job-id", "by-dscp"],
)
def test_high_class_overtakes_a_saturating_low_class(
    switch: bmv2.Bmv2, entry: str, dscp: int
) -> None:
    switch.cli(entry)
    fast, fast_n, low_a = episode(switch, dscp)
    switch.cli(f"table_clear {n.TC_TABLE}")
    slow, slow_n, low_b = episode(switch, dscp)
    print(
        f"\nclassed: {fast_n}/25 through, median {statistics.median(fast) * 1e3:.1f} ms;"
        f" class 0: {slow_n}/25, median {statistics.median(slow) * 1e3:.1f} ms;"
        f" low flow through: {low_a}, {low_b}"
    )
    # The low flow was held to the port's rate in both episodes (its queue overflowed).
    for low in (low_a, low_b):
        assert low < 0.75 * 4 * RATE * 2.0, (low_a, low_b)
    # Class 7: every packet through, in about one service time; class 0: behind the
    # backlog of DEPTH packets (DEPTH / RATE = 0.2 s), and some dropped at the full queue.
    assert fast_n == 25
    wait = DEPTH / RATE
    assert statistics.median(fast) < wait / 4, fast
    assert slow and statistics.median(slow) > wait / 2, slow
    assert statistics.median(slow) > 4 * statistics.median(fast)
    assert slow_n < fast_n
