"""Derived state: smoothing, utilisation, change detection, bounded memory, report loss."""

from __future__ import annotations

import pytest

from int_collector.settings import load_settings
from int_collector.state import Fabric, SequenceTracker
from int_collector.wire import Decoder, Flow, Hop, int_md_v2, report_v2, udp_int_packet

FLOW = Flow(bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]), 17, 1000, 5000)


def report(node: int, seq: int, hops: list[Hop], bitmap: int = 0xF000, flow: Flow = FLOW):
    data = report_v2(node, seq, udp_int_packet(flow, int_md_v2(bitmap, hops)))
    (r,) = Decoder().decode(data)
    return r


def hop(node: int, port: int, latency: int, occ: int, **kw: int) -> Hop:
    return Hop(node_id=node, ingress_port=1, egress_port=port, hop_latency=latency,
               queue_id=0, queue_occupancy=occ, **kw)  # fmt: skip


def fabric(**kw: object) -> Fabric:
    return Fabric(load_settings(None, **kw))


def test_ewma_of_latency_and_queue() -> None:
    f = fabric(ewma_alpha=0.5)
    for i, lat in enumerate([1000, 3000, 3000]):
        f.observe(report(2, i, [hop(2, 7, lat, lat // 100)]), 1)
    link = f.links[(2, 7, 0)]
    assert link.latency == pytest.approx(2500.0)  # 1000 -> 2000 -> 2500
    assert link.queue_occupancy == pytest.approx(25.0)
    assert link.latency_max == 3000


def test_utilization_from_tx_field_and_from_bytes() -> None:
    f = fabric(ewma_alpha=1.0, tx_utilization_full_scale=1000)
    f.observe(report(1, 0, [hop(1, 2, 10, 0, tx_utilization=250)], bitmap=0xF100), 1)
    assert f.links[(1, 2, 0)].util == pytest.approx(0.25)

    # No tx field: bytes of reported packets over egress-timestamp time. Packets of 180 B
    # every 1 us on a 10 Gb/s link: 180*8 bits / 1 us = 1.44 Gb/s = 0.144 of line rate.
    g = fabric(ewma_alpha=1.0, link_speed_bps=10e9, utilization_window_ns=10_000)
    inner_len = len(udp_int_packet(FLOW, int_md_v2(0xF400, [hop(1, 2, 10, 0, egress_ts=0)])))
    for k in range(30):
        g.observe(report(1, k, [hop(1, 2, 10, 0, egress_ts=1000 * k)], bitmap=0xF400), 1)
    assert g.links[(1, 2, 0)].util == pytest.approx(inner_len * 8 / 1e-6 / 10e9, rel=0.01)


def test_flow_path_and_latency_in_a_capped_lru() -> None:
    f = fabric(max_flows=3, ewma_alpha=1.0)
    hops = [hop(3, 1, 300, 0), hop(2, 1, 200, 0), hop(1, 1, 100, 0)]
    for sport in range(5):
        fl = Flow(FLOW.src, FLOW.dst, 17, sport, 5000)
        f.observe(report(3, sport, hops, flow=fl), 1)
    assert len(f.flows) == 3 and [k.sport for k in f.flows] == [2, 3, 4]
    fs = f.flows[Flow(FLOW.src, FLOW.dst, 17, 4, 5000)]
    assert fs.path == (1, 2, 3) and fs.latency == 600 and fs.sink == 3


def test_links_are_bounded() -> None:
    f = fabric(max_links=2)
    for port in range(5):
        f.observe(report(1, port, [hop(1, port, 10, 0)]), 1)
    assert len(f.links) == 2 and f.links_full == 3


def test_change_detection_writes_on_change_and_keepalive_only() -> None:
    f = fabric(ewma_alpha=1.0, latency_threshold_ns=500, relative_threshold=0.0,
               queue_threshold=1000, keepalive_s=10)  # fmt: skip
    t = 1000.0
    f.observe(report(1, 0, [hop(1, 1, 1000, 0)]), 1)
    assert [p.measurement for p in f.due_points(t)] == ["int_link", "int_flow", "int_reports"]
    for i, lat in enumerate([1100, 1200, 1400, 1499]):  # all within 500 ns of 1000
        f.observe(report(1, i + 1, [hop(1, 1, lat, 0)]), 1)
        assert [p for p in f.due_points(t + i) if p.measurement == "int_link"] == []
    f.observe(report(1, 9, [hop(1, 1, 1600, 0)]), 1)
    (p,) = [p for p in f.due_points(t + 5) if p.measurement == "int_link"]
    assert p.fields["latency_ns"] == 1600.0 and p.fields["samples"] == 5
    assert p.tags == {"switch": "1", "port": "1", "queue": "0"}
    f.observe(report(1, 10, [hop(1, 1, 1600, 0)]), 1)
    assert [p for p in f.due_points(t + 6) if p.measurement == "int_link"] == []
    (p,) = [p for p in f.due_points(t + 15.1) if p.measurement == "int_link"]  # keep-alive
    assert p.fields["samples"] == 1


def test_point_times_are_unique_and_increasing() -> None:
    f = fabric()
    for port in range(10):
        f.observe(report(1, port, [hop(1, port, 10, 0)]), 5)  # same receive time
    times = [p.time_ns for p in f.due_points(1.0)]
    assert times == sorted(set(times))


def test_sequence_loss_late_repeat_restart_and_wrap() -> None:
    t = SequenceTracker(bits=22, window=16)
    for s in [0, 1, 2, 5, 6]:  # 3 and 4 missing
        t.observe(s)
    assert t.lost == 2
    t.observe(4)  # late: no longer lost
    assert (t.lost, t.late) == (1, 1)
    t.observe(6)
    assert t.repeated == 1
    t.observe(2**21 + 100)  # far behind the newest: the switch restarted
    assert t.restarts == 1 and t.last == 2**21 + 100 and t.lost == 1
    t.observe(2**22 - 2)  # a forward jump, counted as loss
    lost = t.lost
    t.observe(1)  # wraps past 0: 2**22 - 1 and 0 missing
    assert t.lost == lost + 2


def test_fabric_counts_loss_per_switch() -> None:
    f = fabric()
    for s in [0, 1, 4, 5]:
        f.observe(report(3, s, [hop(3, 1, 10, 0)]), 1)
    f.observe(report(4, 0, [hop(4, 1, 10, 0)]), 1)
    assert f.seq[(3, 0)].lost == 2 and f.seq[(4, 0)].lost == 0 and f.lost_total == 2


def test_reports_sharing_a_datagram_count_its_sequence_number_once() -> None:
    f = fabric()
    dec = Decoder()
    for seq in [0, 1, 3]:  # datagram 2 lost
        singles = [report_v2(5, seq, udp_int_packet(FLOW, int_md_v2(0xF000, [hop(5, p, 10, 0)])))
                   for p in range(4)]  # fmt: skip
        datagram = singles[0][:8] + b"".join(d[8:] for d in singles)
        f.observe_datagram(dec.decode(datagram), 1)
    tr = f.seq[(5, 0)]
    assert (tr.received, tr.lost, tr.repeated) == (3, 1, 0)
    assert all(f.links[(5, p, 0)].samples == 3 for p in range(4))
