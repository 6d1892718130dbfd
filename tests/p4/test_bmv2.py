"""Packet tests of the committed pipeline (p4/build/innet_agg.json) on bmv2 simple_switch.

One switch, host-side veths: ports 1-3 workers 10.0.0.1-3, port 4 the parameter server
10.0.0.4, port 5 the INT collector, port 255 the CPU port (ONOS's packet I/O).
Skipped where bmv2 is not installed (CI machines), with the reason.
"""

from __future__ import annotations

import dataclasses
import struct
import time
from collections.abc import Iterator

import pytest

from agg_agent import p4names as n
from agg_agent.protocol import (
    FLAG_AGGREGATED,
    FLAG_JOIN,
    FLAG_RETRANSMIT,
    LANES,
    UDP_PORT,
    AggPacket,
)
from agg_agent.switch_model import JobConfig, SwitchModel, Verdict
from int_collector.wire import Decoder

from . import bmv2
from .frames import mac, udp_frame, udp_payload

REASON = bmv2.skip_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=str(REASON))

PS, COLLECTOR = 4, 5
ANY = "0&&&0"


def fwd_to(ip_last: int, port: int) -> str:
    key = [ANY] * 5 + [f"0x0a0000{ip_last:02x}&&&0xffffffff"] + [ANY] * 3
    return f"table_add {n.FWD_TABLE} {n.FWD_SET_EGRESS_PORT} {' '.join(key)} => {port} 10"


@pytest.fixture(scope="module")
def switch() -> Iterator[bmv2.Bmv2]:
    with bmv2.Bmv2([1, 2, 3, 4, 5, n.CPU_PORT]) as sw:
        sw.cli(
            *(fwd_to(i, i) for i in range(1, 5)),
            # ARP to the controller, as ONOS's host discovery installs it.
            f"table_add {n.FWD_TABLE} {n.FWD_SEND_TO_CPU} {ANY} {ANY} {ANY} "
            f"0x0806&&&0xffff {ANY} {ANY} {ANY} {ANY} {ANY} => 20",
            f"table_add {n.AGG_JOB_TABLE} {n.AGG_SET_JOB} 7 => 100 8 3 {PS}",
            f"table_add {n.AGG_JOB_TABLE} {n.AGG_SET_JOB} 8 => 200 8 3 {PS}",
            f"table_set_default {n.INT_SWITCH_TABLE} {n.INT_SET_SWITCH} 1",
            f"table_set_default {n.REPORT_TABLE} {n.REPORT_SET_COLLECTOR} "
            f"00:00:00:00:00:fe 00:00:00:00:00:05 10.0.9.254 10.0.9.1 32766",
            f"mirroring_add {n.REPORT_CLONE_SESSION} {COLLECTOR}",
        )
        yield sw


@pytest.fixture(scope="module")
def ports(switch: bmv2.Bmv2) -> Iterator[dict[int, bmv2.RawPort]]:
    p = {i: bmv2.RawPort(switch.host_if(i)) for i in switch.ports}
    yield p
    for r in p.values():
        r.close()


def contribution(worker: int, job: int, seq: int, flags: int = 0) -> bytes:
    values = tuple((worker + 1) * (lane + 1) * (-1) ** lane for lane in range(LANES))
    pkt = AggPacket(job, seq % 8, worker, 3, seq, 1 << worker, flags, values)
    return udp_frame(worker + 1, PS, 40000 + worker, UDP_PORT, pkt.encode())


def at_ps(ports: dict[int, bmv2.RawPort], timeout: float = 0.5) -> list[AggPacket]:
    out = []
    for f in ports[PS].frames(timeout):
        payload = udp_payload(f, UDP_PORT)
        if payload is not None:
            out.append(AggPacket.decode(payload))
    return out


def test_forwarding_table_outputs_and_drops(ports: dict[int, bmv2.RawPort]) -> None:
    frame = udp_frame(1, 3, 1234, 5678, b"hello")
    ports[1].send(frame)
    assert ports[3].frames(0.5, want=1) == [frame]
    ports[1].send(udp_frame(1, 99, 1234, 5678, b"no route"))
    assert ports[PS].frames(0.3) == [] and ports[2].frames(0.05) == []


def test_packet_in_and_packet_out_through_the_cpu_port(ports: dict[int, bmv2.RawPort]) -> None:
    arp = b"\xff" * 6 + mac(2) + b"\x08\x06" + bytes(28)
    ports[2].send(arp)
    got = ports[n.CPU_PORT].frames(0.5, want=1)
    # packet_in: 9-bit ingress port + 7 bits of padding, then the frame as received.
    assert got and struct.unpack("!H", got[0][:2])[0] >> 7 == 2 and got[0][2:] == arp
    lldp = b"\x01\x80\xc2\x00\x00\x0e" + mac(0xFE) + b"\x88\xcc" + bytes(30)
    ports[n.CPU_PORT].send(struct.pack("!H", 3 << 7) + lldp)
    assert ports[3].frames(0.5, want=1) == [lldp]


def test_configured_job_one_aggregate_with_the_sum(ports: dict[int, bmv2.RawPort]) -> None:
    seq = 0
    ports[1].send(contribution(0, 7, seq))
    ports[2].send(contribution(1, 7, seq))
    ports[1].send(contribution(0, 7, seq))  # a duplicate: must not count twice
    assert at_ps(ports, 0.3) == []  # partial sums stay in the switch
    ports[3].send(contribution(2, 7, seq))
    got = at_ps(ports)
    assert len(got) == 1
    agg = got[0]
    assert agg.flags & FLAG_AGGREGATED and agg.contributors == 0b111
    assert agg.values == tuple(6 * (lane + 1) * (-1) ** lane for lane in range(LANES))


def test_a_chunk_of_another_size_passes_untouched_and_leaves_the_slot_alone(
    ports: dict[int, bmv2.RawPort],
) -> None:
    """A job whose PS makes every sum may send 64 values a packet: the switch forwards each
    as it came (its slot untouched); a 32-value chunk on the same slot then sums as usual."""
    seq, wide = 502, 2 * LANES
    sent = []
    for w in range(3):
        pkt = AggPacket(8, seq % 8, w, 3, seq, 1 << w, 0, tuple(range(w, w + wide)))
        sent.append(pkt)
        ports[w + 1].send(udp_frame(w + 1, PS, 40000 + w, UDP_PORT, pkt.encode()))
    got = sorted(at_ps(ports), key=lambda p: p.worker_id)
    # three packets as sent, nothing summed, nothing held; only Max queue may have risen, as
    # on every packet (congestion.p4: three at once queue behind each other at the PS port)
    assert [dataclasses.replace(p, max_queue=0) for p in got] == sent
    for w in range(3):
        ports[w + 1].send(contribution(w, 8, seq + 8))  # the same slot, the usual size
    (agg,) = at_ps(ports)
    assert agg.flags & FLAG_AGGREGATED and agg.contributors == 0b111
    assert agg.values == tuple(6 * (lane + 1) * (-1) ** lane for lane in range(LANES))


def test_slot_is_freed_and_reused_by_the_next_chunk(ports: dict[int, bmv2.RawPort]) -> None:
    for seq in (1, 9):  # both map to slot 1 of the pool
        for w in range(3):
            ports[w + 1].send(contribution(w, 7, seq))
        got = at_ps(ports)
        assert [(p.seq, p.contributors) for p in got] == [(seq, 0b111)]
        assert got[0].values[0] == 6


def test_late_retransmission_after_completion_passes_through(
    ports: dict[int, bmv2.RawPort],
) -> None:
    for w in range(3):
        ports[w + 1].send(contribution(w, 7, 2))
    assert len(at_ps(ports)) == 1
    ports[2].send(contribution(1, 7, 2, FLAG_RETRANSMIT))
    got = at_ps(ports)
    assert [(p.contributors, p.flags) for p in got] == [(0b10, FLAG_RETRANSMIT)]


def in_order(ports: dict[int, bmv2.RawPort], *sends: tuple[int, bytes]) -> None:
    """Send each (port, frame) after the previous one: frames entering bmv2 through
    different ports at once may be handled in either order."""
    for port, frame in sends:
        ports[port].send(frame)
        time.sleep(0.05)


def test_retransmission_of_a_summed_contributor_flushes_the_slot(
    ports: dict[int, bmv2.RawPort],
) -> None:
    in_order(
        ports,
        (1, contribution(0, 7, 3)),
        (2, contribution(1, 7, 3)),
        (1, contribution(0, 7, 3, FLAG_RETRANSMIT)),
    )
    got = at_ps(ports)
    assert [(p.seq, p.contributors, p.flags) for p in got] == [
        (3, 0b11, FLAG_AGGREGATED | FLAG_RETRANSMIT)
    ]
    assert got[0].values == tuple(3 * (lane + 1) * (-1) ** lane for lane in range(LANES))
    ports[3].send(contribution(2, 7, 3))  # the slot is free: the straggler goes up raw
    assert [(p.contributors, p.flags) for p in at_ps(ports)] == [(0b100, 0)]


def test_newer_chunk_reclaims_a_stale_slot_and_older_passes(
    ports: dict[int, bmv2.RawPort],
) -> None:
    # chunk 4 never completes here; then the same slot, 8 chunks later
    in_order(ports, (1, contribution(0, 7, 4)), (2, contribution(1, 7, 12)))
    assert at_ps(ports, 0.3) == []
    ports[3].send(contribution(2, 7, 4))  # older than the slot's chunk: up, unchanged
    assert [(p.seq, p.contributors) for p in at_ps(ports)] == [(4, 0b100)]
    in_order(ports, (1, contribution(0, 7, 12)), (3, contribution(2, 7, 12)))
    got = at_ps(ports)
    assert [(p.seq, p.contributors) for p in got] == [(12, 0b111)]
    assert got[0].values[:2] == (6, -12)  # nothing of chunk 4 left in the sum


def test_pipeline_and_reference_model_agree_packet_by_packet(
    ports: dict[int, bmv2.RawPort],
) -> None:
    """Random contributions, duplicates, retransmissions and slot reuse through bmv2 and
    through agg_agent.switch_model (kept branch for branch): the same packets reach the PS."""
    import random

    rng = random.Random(11)
    model = SwitchModel({8: JobConfig(pool_base=200, pool_size=8, fan_in=3)})
    sent: list[AggPacket] = []
    for _ in range(240):
        w = rng.randrange(3)
        seq = rng.choice([5, 6]) + 8 * rng.randrange(4)
        flags = FLAG_RETRANSMIT if rng.random() < 0.3 else 0
        values = tuple(rng.randrange(-(2**31), 2**31) for _ in range(LANES))
        sent.append(AggPacket(8, seq % 8, w, 3, seq, 1 << w, flags, values))
    for _ in range(120):  # then runs change under the slots (docs/protocols.md, "Runs")
        w, run = rng.randrange(3), rng.choice([0, 0, 1, 2])
        seq = rng.choice([5, 6]) + 8 * rng.randrange(4)
        flags = FLAG_RETRANSMIT if rng.random() < 0.3 else 0
        values = tuple(rng.randrange(-(2**31), 2**31) for _ in range(LANES))
        sent.append(AggPacket(8, seq % 8, w, 3, seq, 1 << w, flags, values, run=run))
    expected = []
    verdicts = set()
    for p in sent:
        q = AggPacket.decode(p.encode())
        verdicts.add(v := model.process(q))
        if v in (Verdict.FORWARD, Verdict.EMIT, Verdict.FLUSH):
            expected.append(q)
    assert verdicts == set(Verdict)  # every branch taken
    for p in sent:  # one port: bmv2 handles them in order; paced, as bursts get dropped
        ports[1].send(udp_frame(1, PS, 40000, UDP_PORT, p.encode()))
        time.sleep(0.003)
    got = at_ps(ports, 2.0)
    while len(got) < len(expected):
        more = at_ps(ports, 1.0)
        if not more:
            break
        got += more
    assert [(p.seq, p.contributors, p.flags, p.run) for p in got] == [
        (p.seq, p.contributors, p.flags, p.run) for p in expected
    ]
    assert [p.values for p in got] == [p.values for p in expected]


def test_a_restarted_run_never_adds_to_what_its_killed_run_left_on_bmv2(
    ports: dict[int, bmv2.RawPort],
) -> None:
    """The model's test on the compiled pipeline: run 0xA of job 7 is killed after worker 0
    sent chunk 4005 (its slot keeps the partial sum); run 0xB's chunk 4005 reaches the PS as
    run B's three workers' sum with nothing of A's. A JOIN passes unchanged."""

    def frame(worker: int, value: int, run: int, flags: int = 0, seq: int = 4005) -> bytes:
        pkt = AggPacket(7, seq % 8, worker, 3, seq, 1 << worker, flags, (value,) * LANES,
                        run=run)  # fmt: skip
        return udp_frame(worker + 1, PS, 40000 + worker, UDP_PORT, pkt.encode())

    ports[1].send(frame(0, 1000, run=0xA))
    assert at_ps(ports, 0.3) == []  # held in the slot
    for w, v in ((1, 20), (2, 30), (0, 10)):
        ports[w + 1].send(frame(w, v, run=0xB))
    got = at_ps(ports)
    assert [(p.contributors, p.values[0], p.run) for p in got] == [(0b111, 60, 0xB)]
    ports[1].send(frame(0, 0, run=0, flags=FLAG_JOIN, seq=0))
    got = at_ps(ports)
    assert [(p.flags & FLAG_JOIN, p.seq, p.contributors) for p in got] == [(FLAG_JOIN, 0, 1)]


def unstamped(frame: bytes) -> bytes:
    """The frame without what congestion.p4 writes into a packet that waited behind
    others: agg.max_queue (byte 49: 14 Ethernet + 20 IPv4 + 8 UDP + 7) and the UDP
    checksum it then zeroes (bytes 40-41)."""
    return frame[:40] + b"\0\0" + frame[42:49] + b"\0" + frame[50:]


def test_unconfigured_job_passes_through_unchanged(ports: dict[int, bmv2.RawPort]) -> None:
    sent = [contribution(w, 9, 0) for w in range(3)]
    for w, f in enumerate(sent):
        ports[w + 1].send(f)
    got = ports[PS].frames(0.5, want=3)
    assert sorted(map(unstamped, got)) == sorted(map(unstamped, sent))


def test_int_source_and_sink_report_decodes_and_packet_is_restored(
    switch: bmv2.Bmv2, ports: dict[int, bmv2.RawPort]
) -> None:
    switch.cli(
        f"table_add {n.INT_WATCHLIST_TABLE} {n.INT_SOURCE} {ANY} 0x0a000004&&&0xffffffff "
        f"17&&&0xff {ANY} 5000&&&0xffff => 8 0xfd00 10",
        f"table_add {n.INT_SINK_TABLE} {n.INT_SET_SINK} {PS} =>",
    )
    frame = udp_frame(1, PS, 1234, 5000, b"monitored", dscp=10)
    ports[1].send(frame)
    # This switch is source and sink: the host gets the packet exactly as sent.
    assert ports[PS].frames(0.5, want=1) == [frame]
    reports = [udp_payload(f, 32766) for f in ports[COLLECTOR].frames(0.5, want=1)]
    assert len(reports) == 1 and reports[0] is not None
    (r,) = Decoder().decode(reports[0])
    assert (r.node_id, r.flow.dport, r.instruction_bitmap, r.hop_count) == (1, 5000, 0xFD00, 1)
    (hop,) = r.hops()
    assert (hop.node_id, hop.ingress_port, hop.egress_port) == (1, 1, PS)
    assert hop.egress_ts >= hop.ingress_ts > 0
    assert hop.hop_latency is not None and hop.hop_latency < 10**9  # ns, from one switch
    assert hop.tx_utilization is not None


def test_int_across_two_switches_source_transit_sink() -> None:
    """Switch A (node 10) is source, switch B (node 20) transit and sink: B's report holds
    both hops, newest first; the host behind B gets the packet as A's host sent it."""
    pre = f"ic{bmv2.os.getpid() % 10000}"
    bmv2.veth_link(f"{pre}xa", f"{pre}xb")
    try:
        with (
            bmv2.Bmv2([1, 2], prefix=f"{pre}a", links={2: f"{pre}xa"}) as a,
            bmv2.Bmv2([1, 2, 3], prefix=f"{pre}b", links={1: f"{pre}xb"}) as b,
        ):
            to_port2 = fwd_to(2, 2)
            a.cli(
                to_port2,
                f"table_set_default {n.INT_SWITCH_TABLE} {n.INT_SET_SWITCH} 10",
                f"table_add {n.INT_WATCHLIST_TABLE} {n.INT_SOURCE} {ANY} {ANY} 17&&&0xff "
                f"{ANY} 5000&&&0xffff => 8 0xf000 10",
            )
            b.cli(
                to_port2,
                f"table_set_default {n.INT_SWITCH_TABLE} {n.INT_SET_SWITCH} 20",
                f"table_add {n.INT_SINK_TABLE} {n.INT_SET_SINK} 2 =>",
                f"table_set_default {n.REPORT_TABLE} {n.REPORT_SET_COLLECTOR} "
                f"00:00:00:00:00:fe 00:00:00:00:00:05 10.0.9.254 10.0.9.1 32766",
                f"mirroring_add {n.REPORT_CLONE_SESSION} 3",
            )
            sender, host, collector = (
                bmv2.RawPort(a.host_if(1)),
                bmv2.RawPort(b.host_if(2)),
                bmv2.RawPort(b.host_if(3)),
            )
            try:
                frame = udp_frame(1, 2, 1234, 5000, b"two hops", dscp=3)
                sender.send(frame)
                assert host.frames(1.0, want=1) == [frame]
                got = collector.frames(1.0, want=1)
            finally:
                for r in (sender, host, collector):
                    r.close()
    finally:
        bmv2.subprocess.run(["ip", "link", "del", f"{pre}xa"], capture_output=True)
    payload = udp_payload(got[0], 32766) if got else None
    assert payload is not None, "no report from the sink"
    (r,) = Decoder().decode(payload)
    assert (r.node_id, r.hop_count, r.remaining_hop_count) == (20, 2, 6)
    assert [(h.node_id, h.ingress_port, h.egress_port) for h in r.hops()] == [
        (20, 1, 2),
        (10, 1, 2),
    ]
