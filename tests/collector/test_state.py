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
    kw.setdefault("link_min_reports", 1)  # what one report makes (plausibility: elsewhere)
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
               queue_threshold=1000, keepalive_s=10, max_unwritten_s=10)  # fmt: skip
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


def _both(compiled: bool, **kw: object) -> Fabric:
    if not compiled:
        return fabric(**kw)
    from int_collector.fast import FastFabric

    kw.setdefault("link_min_reports", 1)
    return FastFabric(load_settings(None, **kw))  # type: ignore[return-value]


@pytest.mark.parametrize("compiled", [False, True], ids=["reference", "compiled"])
def test_counts_are_written_within_max_unwritten_s_whatever_the_thresholds(
    compiled: bool,
) -> None:
    """A steady link (nothing past a threshold) still has its hops written each tick, so a
    SIGKILL loses at most a tick of them; before, up to keepalive_s (30 s)."""
    f = _both(
        compiled, ewma_alpha=1.0, latency_threshold_ns=500, relative_threshold=0.0,
        queue_threshold=1000, tick_s=0.2,
    )  # fmt: skip
    assert f.s.max_unwritten_s == 0.2 and f.s.keepalive_s == 30
    t = 1000.0
    written = {"int_link": 0, "int_reports": 0}
    for i in range(50):
        f.observe(report(1, i, [hop(1, 1, 1000, 0)]), 1)
        t += 0.2 - 1e-6  # ticks a hair early on the wall clock still write
        pts = f.due_points(t)
        for p in pts:
            if p.measurement == "int_link":
                assert p.fields["samples"] == 1
                written["int_link"] += 1
            elif p.measurement == "int_reports":
                assert p.fields["received"] == i + 1
                written["int_reports"] += 1
        assert f.due_points(t) == []  # nothing left unwritten after a tick
    assert written == {"int_link": 50, "int_reports": 50}


@pytest.mark.parametrize("compiled", [False, True], ids=["reference", "compiled"])
def test_flow_points_per_tick_are_bounded_and_evictions_counted(compiled: bool) -> None:
    """More new flows than max_flows, each one report: at most max_flow_points int_flow
    points a tick (oldest news first), the evicted ones counted, unwritten or not."""
    f = _both(compiled, max_flows=100, max_flow_points=30)
    t = 1000.0
    for k in range(250):
        fl = Flow(bytes([10, 0, k // 256, k % 256]), bytes([10, 1, 0, 1]), 17, 1000 + k, 5000)
        f.observe(report(1, k, [hop(1, 1, 1000, 0)], flow=fl), 1)
    flows = [p for p in f.due_points(t) if p.measurement == "int_flow"]
    assert len(flows) == 30
    assert flows[0].fields["flow"] == "10.0.0.150:1150>10.1.0.1:5000/17"  # the oldest kept
    assert f.flows_evicted == 150 and f.flows_evicted_unwritten == 150
    assert len([p for p in f.due_points(t + 0.2) if p.measurement == "int_flow"]) == 30
    rest = [p for p in f.due_points(t + 0.4, force=True) if p.measurement == "int_flow"]
    assert len(rest) == 40  # force (shutdown) writes every flow with news


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


def test_aggregation_share_of_a_port_from_the_reported_flows() -> None:
    """The share of a port's reported packets that use the aggregation protocol's UDP port:
    the optimizer subtracts it from the port's utilisation (its jobs' own streams)."""
    agg_flow = FLOW._replace(dport=48879)
    f = fabric(ewma_alpha=0.5)
    for k, flow in enumerate([agg_flow, agg_flow, FLOW, agg_flow]):
        f.observe(report(3, k, [hop(3, 4, 10, 0)], flow=flow), 1)
    # 1 -> 1 -> 0.5 -> 0.75
    assert f.links[(3, 4, 0)].agg_share == pytest.approx(0.75)
    (point,) = [p for p in f.due_points(force=True) if p.measurement == "int_link"]
    assert point.fields["aggregation_share"] == pytest.approx(0.75)

    # Only other traffic: 0. The setting unset: not kept, not written.
    g = fabric()
    g.observe(report(3, 0, [hop(3, 4, 10, 0)]), 1)
    assert g.links[(3, 4, 0)].agg_share == 0.0
    h = fabric(aggregation_udp_port=None)
    h.observe(report(3, 0, [hop(3, 4, 10, 0)], flow=agg_flow), 1)
    assert h.links[(3, 4, 0)].agg_share is None
    assert "aggregation_share" not in h.due_points(force=True)[0].fields


def test_every_observation_is_written_once_when_forced_after_quiet_ticks() -> None:
    """Issue 15.1: a tick that writes nothing must not forget what it saw. Steady reports
    (nothing moves past a threshold) with ticks between them and one after the last, then
    shutdown's forced flush: per link, the points' `samples` add up to the hops observed,
    for both families."""
    from int_collector.wire import report_v1_onos

    f = fabric(keepalive_s=1000)
    dec = Decoder()
    v2_hops = [hop(2, 7, 1000, 5), hop(1, 3, 1000, 5)]
    v1_hops = [hop(9, 4, 1, 5), hop(8, 2, 1, 5)]
    t = 1000.0
    points = []
    for k in range(500):
        f.observe(report(2, k, v2_hops), 1)
        f.observe_datagram(dec.decode(report_v1_onos(9, FLOW, 0xF000, v1_hops, seq=k)), 1)
        if k % 50 == 0:
            points += f.due_points(t + k / 100)
    points += f.due_points(t + 5.5)  # a quiet tick after the last report
    points += f.due_points(t + 6, force=True)  # shutdown
    assert f.due_points(t + 7, force=True) == []  # nothing left with news
    written: dict[tuple[int, int], int] = {}
    for p in points:
        if p.measurement == "int_link":
            key = (int(p.tags["switch"]), int(p.tags["port"]))
            written[key] = written.get(key, 0) + int(p.fields["samples"])
    assert {(2, 7), (1, 3), (8, 2)} <= set(written)
    assert all(n == 500 for n in written.values()), written
    reports = [p for p in points if p.measurement == "int_reports"]
    assert {p.tags["switch"]: p.fields["received"] for p in reports[-2:]} == {"2": 500, "9": 500}


def test_onos_sink_hop_on_the_mirror_port_is_on_the_path_but_no_link() -> None:
    from int_collector.wire import report_v1_onos

    dec = Decoder()
    hops = [hop(3, 255, 40, 1), hop(1, 2, 10, 4)]
    f = fabric(ewma_alpha=1.0)
    f.observe_datagram(dec.decode(report_v1_onos(3, FLOW, 0xF000, hops)), 1)
    assert set(f.links) == {(1, 2, 0)} and f.hops_unattributed == 1
    (fs,) = f.flows.values()
    assert fs.path == (1, 3) and fs.latency == 10_000
    # A newest hop of another node is not the sink's clone hop: attributed as usual.
    g = fabric()
    g.observe_datagram(dec.decode(report_v1_onos(3, FLOW, 0xF000, hops[1:])), 1)
    assert set(g.links) == {(1, 2, 0)} and g.hops_unattributed == 0
    # Off for v1 senders other than ONOS's pipeline.
    h = fabric(v1_sink_hop_is_mirror=False)
    h.observe_datagram(dec.decode(report_v1_onos(3, FLOW, 0xF000, hops)), 1)
    assert set(h.links) == {(1, 2, 0), (3, 255, 0)}
