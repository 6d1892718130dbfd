"""Known vectors: the specifications' examples and ONOS's bmv2 layout, written out byte by byte.

Field values the examples leave open (node IDs, occupancies, addresses, ports) are ours and
named in each comment; the structure is the example's. The same vectors are in
docs/protocols.md.
"""

from __future__ import annotations

import struct

import pytest

from int_collector.wire import (
    DecodeError,
    Decoder,
    Flow,
    Hop,
    IntMarking,
    encode_stack,
    int_md_v2,
    report_v1_onos,
    report_v2,
    udp_int_packet,
)


def h(text: str) -> bytes:
    return bytes.fromhex("".join(text.split()))


# Telemetry Report v2.0 §5.3 "Example with Embedded INT-MD in a TCP Packet" (the INT packet
# of INT v2.1 §6.3): Switch3 (node 3) reports with its queue occupancy (0x30) in the report
# header; the truncated packet holds IPv4, the UDP header the INT source inserted (dport
# 5000 is our INT_TBD), the shim (INT-MD, NPT=2, Length=7, IP proto 6), the INT-MD header
# (HopML=2, RemainingHopCnt=6, bitmap 0x9000: node ID + queue), two hops (node 2 with
# occupancy 16, node 1 with 8), then the original TCP header 1234 -> 80.
SPEC_TR_TCP = h(
    """
    20000001 00000003
    14 17 01 20   1000 0000   0000 0000   00000030
    4500 00b4 0000 4000 4011 0000 0a000001 0a000002
    3039 1388 00a0 0000
    18 07 00 06
    20000206 9000 0000 0000 0000
    00000002 00000010 00000001 00000008
    04d2 0050 00000000 00000000 5010 ffff 0000 0000
    """
)


def test_telemetry_report_spec_example_embedded_int_md() -> None:
    (r,) = Decoder(IntMarking(dscp_value=None, udp_ports=frozenset({5000}))).decode(SPEC_TR_TCP)
    assert (r.family, r.node_id, r.hw_id, r.seq) == ("v2", 3, 0, 1)
    assert r.tracked and not (r.dropped or r.congested or r.intermediate)
    assert r.local is not None and (r.local.queue_id, r.local.queue_occupancy) == (0, 0x30)
    assert (r.instruction_bitmap, r.hop_ml, r.remaining_hop_count) == (0x9000, 2, 6)
    assert [(x.node_id, x.queue_occupancy) for x in r.hops()] == [(2, 16), (1, 8)]
    # NPT=2: the flow's ports are the original TCP header's, after the stack.
    assert r.flow == Flow(bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]), 6, 1234, 80)
    assert r.packet_length == 180


def test_encoder_reproduces_the_spec_int_md_bytes() -> None:
    hops = [
        Hop(node_id=2, queue_id=0, queue_occupancy=16),
        Hop(node_id=1, queue_id=0, queue_occupancy=8),
    ]
    got = int_md_v2(0x9000, hops, remaining_hop_count=6, shim_npt=2, shim_field=6)
    start = SPEC_TR_TCP.index(h("18 07 00 06"))
    assert got == SPEC_TR_TCP[start : start + 32]


# INT v2.1 §6.1 "Example with INT-MD over TCP": DSCP 0x17 marks INT after the TCP header;
# shim Type=1, NPT=0, Length=7, original DSCP 0 in the last byte. Wrapped by us in a
# Telemetry Report v2.0 with no report metadata (RepMdBits 0, MD Length 0) from node 3.
SPEC_INT_TCP_PACKET = h(
    """
    455c 0044 0000 4000 4006 0000 0a000001 0a000002
    04d2 0050 00000000 00000000 5010 ffff 0000 0000
    10 07 00 00
    20000206 9000 0000 0000 0000
    00000002 00000010 00000001 00000008
    """
)


def test_int_spec_example_over_tcp_marked_by_dscp() -> None:
    words = 2 + len(SPEC_INT_TCP_PACKET) // 4
    datagram = (
        h(f"20000007 00000003 14 {words:02x} 00 20 0000 0000 0000 0000") + SPEC_INT_TCP_PACKET
    )
    (r,) = Decoder().decode(datagram)  # default marking: DSCP 0x17
    assert r.seq == 7 and r.local is None
    assert r.flow == Flow(bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]), 6, 1234, 80)
    assert [(x.node_id, x.queue_occupancy) for x in r.hops()] == [(2, 16), (1, 8)]


# Telemetry Report v2.0 §5.1 "Example with Baseline Metadata and Truncated IPv4": RepMdBits
# 0x5000 (level 1 ports + queue), MD Length 2, Report Length 14, IPv4 + TCP, no INT inside.
# Ours: node 9, ports 3 -> 4, queue 1 with occupancy 0x000200.
SPEC_TR_BASELINE = h(
    """
    20000000 00000009
    14 0e 02 20   5000 0000   0000 0000   0003 0004   01000200
    4500 0028 0000 4000 4006 0000 0a000001 0a000002
    04d2 0050 00000000 00000000 5010 ffff 0000 0000
    """
)


def test_telemetry_report_spec_example_baseline_metadata() -> None:
    (r,) = Decoder().decode(SPEC_TR_BASELINE)
    assert r.local is not None
    assert (r.local.ingress_port, r.local.egress_port) == (3, 4)
    assert (r.local.queue_id, r.local.queue_occupancy) == (1, 0x200)
    assert r.hop_count == 0 and r.flow is not None and r.flow.proto == 6


# ONOS 2.x bmv2 int.p4 (pipelines/basic): report_fixed_header_t (ver=1, len=4, nproto=0,
# f=1, hw_id=1, sw_id, seq_no=0, ingress_tstamp), the packet from Ethernet on with DSCP
# 0x17, intl4_shim_t (int_type=1, len counts shim + header + stack), int_header_t (ver=0
# as int_source.p4 writes it, hop_metadata_len=4, remaining_hop_cnt=6, mask 0xF000:
# switch ID, L1 ports, hop latency, queue), two hops newest first (sink 3: ports 1 -> 2,
# 10 us, occupancy 5; source 1: 3 -> 1, 20 us, occupancy 2). Addresses and ports are ours.
ONOS_V1 = h(
    """
    14001001 00000003 00000000 0000abcd
    000000000002 000000000001 0800
    455c 0048 0000 4000 4011 0000 0a000001 0a000002
    04d2 1388 0034 0000
    01 00 0b 00
    00000406 f000 0000
    00000003 0001 0002 0000000a 00000005
    00000001 0003 0001 00000014 00000002
    """
)


def test_onos_bmv2_report() -> None:
    (r,) = Decoder().decode(ONOS_V1)
    assert (r.family, r.node_id, r.hw_id, r.seq, r.ingress_ts) == ("v1", 3, 1, 0, 0xABCD)
    assert r.tracked and (r.hop_ml, r.remaining_hop_count) == (4, 6)
    assert [(x.node_id, x.ingress_port, x.egress_port, x.hop_latency, x.queue_occupancy)
            for x in r.hops()] == [(3, 1, 2, 10, 5), (1, 3, 1, 20, 2)]  # fmt: skip
    assert r.flow == Flow(bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]), 17, 1234, 5000)


def test_onos_encoder_matches_vector() -> None:
    hops = [
        Hop(
            node_id=3, ingress_port=1, egress_port=2, hop_latency=10, queue_id=0, queue_occupancy=5
        ),
        Hop(
            node_id=1, ingress_port=3, egress_port=1, hop_latency=20, queue_id=0, queue_occupancy=2
        ),
    ]
    flow = Flow(bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]), 17, 1234, 5000)
    got = report_v1_onos(3, flow, 0xF000, hops, ingress_ts=0xABCD, remaining_hop_count=6)
    # Equal but for the IPv4 checksum, which the encoder fills in and the vector leaves 0.
    assert got[:40] == ONOS_V1[:40] and got[42:] == ONOS_V1[42:]


def test_onos_tcp_report_is_cut_short_and_read_partially() -> None:
    """int_report.p4 sizes the report for an inner UDP header: behind TCP, 12 B of the stack
    are cut off. The whole hops that arrived are read and the report says it is partial."""
    hops = [Hop(node_id=n, ingress_port=1, egress_port=2, hop_latency=n, queue_id=0,
                queue_occupancy=n) for n in (3, 2, 1)]  # fmt: skip
    flow = Flow(bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]), 6, 1234, 80)
    (r,) = Decoder().decode(report_v1_onos(3, flow, 0xF000, hops, l4="tcp"))
    assert r.partial_stack and [x.node_id for x in r.hops()] == [3, 2]


def test_several_individual_reports_and_length_to_end() -> None:
    flow = Flow(bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]), 17, 1, 2)
    inner = udp_int_packet(flow, int_md_v2(0x8000, [Hop(node_id=5)]))
    one = report_v2(5, 1, inner)
    second = bytearray(one[8:])
    second[1] = 0xFF  # Report Length 0xFF: to the end of the datagram
    rs = Decoder().decode(one + bytes(second))
    assert [x.hops()[0].node_id for x in rs] == [5, 5]


def test_invalid_all_ones_values_and_domain_specific_padding() -> None:
    # Hop ML 4 words for bitmap 0xA000 (node ID + latency = 2 words): 2 words of
    # domain-specific metadata per hop, skipped; an all-ones latency means "not available".
    stack = encode_stack("v2", 0xA000, [Hop(node_id=7, hop_latency=None)], hop_ml=4)
    assert stack == h("00000007 ffffffff 00000000 00000000")
    flow = Flow(bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]), 17, 1, 2)
    shim = struct.pack(">BBH", 0x10, 3 + 4, 0)
    md = struct.pack(">IHHHH", (2 << 28) | (4 << 8) | 7, 0xA000, 0, 0, 0)
    (r,) = Decoder().decode(report_v2(1, 0, udp_int_packet(flow, shim + md + stack)))
    assert r.hops()[0].node_id == 7 and r.hops()[0].hop_latency is None


def test_unsupported_report_type_is_skipped_and_counted() -> None:
    d = Decoder()
    ioam = report_v2(1, 0, b"", rep_type=2, in_type=0)
    assert d.decode(ioam) == [] and d.skipped == {"unsupported_report_type": 1}


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "truncated"),
        (b"\x20\x00\x00\x01", "truncated"),
        (h("30000001 00000001 14000020"), "unknown_version"),
        (SPEC_TR_TCP[:-4], "truncated"),
        (SPEC_TR_BASELINE[:12] + h("ff00") + SPEC_TR_BASELINE[14:], "malformed"),
        (SPEC_TR_BASELINE[:28] + h("44") + SPEC_TR_BASELINE[29:], "malformed"),
        (ONOS_V1[:10], "truncated"),
        (h("14e01001") + ONOS_V1[4:], "malformed"),
    ],
    ids=["empty", "short", "version3", "cut", "md-bits>md-length", "ihl4", "v1-short", "v1-nproto"],
)
def test_bad_reports_raise_a_reason(data: bytes, reason: str) -> None:
    with pytest.raises(DecodeError) as e:
        Decoder().decode(data)
    assert e.value.reason == reason and e.value.detail


# INT v2.1 "Example with INT-MD including domain specific source-only metadata": Domain
# Specific ID 0x5453 ('TS'), DS Instruction bit 0 (source-only: host1's MAC), DS Flags bit
# 1; HopML 1 (node ID), RemainingHopCnt 5; node IDs of hop2, hop1 and the gateway (the INT
# source), then the MAC a6:1a:f6:b1:64:7d in two words. Ours: node IDs 2, 1 and 9, the
# packet IPv4/UDP to port 5000, wrapped in a Telemetry Report v2.0 from node 3.
SPEC_SOURCE_ONLY_MD = h(
    """
    10 08 00 00
    20000105 8000 5453 8000 4000
    00000002 00000001 00000009
    a61af6b1 647d0000
    """
)
# What the outside test sent: 12 bytes of source-only metadata (a MAC of
# 00:11:22:33:44:55, padded, and one more word) under Hop ML 1, which decoded as hops of
# nodes 0x00112233 and 0x44550000.
TWELVE_BYTES_SOURCE_ONLY = h(
    """
    10 09 00 00
    20000105 8000 5453 8000 4000
    00000002 00000001 00000009
    00112233 44550000 0000abcd
    """
)


def _wrapped(int_bytes: bytes) -> bytes:
    flow = Flow(bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]), 17, 1234, 5000)
    return report_v2(3, 0, udp_int_packet(flow, int_bytes))


@pytest.mark.parametrize(
    ("int_bytes", "words"),
    [(SPEC_SOURCE_ONLY_MD, 2), (TWELVE_BYTES_SOURCE_ONLY, 3)],
    ids=["spec-mac", "twelve-bytes"],
)
def test_source_only_metadata_is_not_read_as_hops(int_bytes: bytes, words: int) -> None:
    """Issue 15.4. Hop ML excludes the source-only metadata at the bottom of the stack, and
    its length is the domain's to define. Configured: exactly the three hops. Not
    configured: the DS Instruction asks for a DS word that Hop ML 1 (all node ID) has no room
    for, so some of the stack is source-only, of unknown length; no hop is read (and no
    phantom node appears), under a named reason, and the report still counts."""
    known = Decoder(source_only={0x5453: {0: words}})
    (r,) = known.decode(_wrapped(int_bytes))
    assert [x.node_id for x in r.hops()] == [2, 1, 9]
    assert (r.domain_id, r.ds_instruction) == (0x5453, 0x8000)

    unknown = Decoder()
    (r,) = unknown.decode(_wrapped(int_bytes))
    assert r.hops() == [] and r.flow is not None
    assert unknown.skipped == {"source_only_unknown": 1}

    # A configured length longer than the stack is malformed.
    with pytest.raises(DecodeError) as e:
        Decoder(source_only={0x5453: {0: 7}}).decode(_wrapped(int_bytes))
    assert e.value.reason == "malformed"


def test_per_hop_domain_specific_words_are_still_read_from_unknown_domains() -> None:
    """A DS Instruction that fits in the per-hop words Hop ML leaves (one bit, one spare
    word per hop) adds nothing at the bottom: the stack is whole hops, all read."""
    stack = encode_stack("v2", 0x8000, [Hop(node_id=n) for n in (4, 5)], hop_ml=2)
    md = struct.pack(">IHHHH", (2 << 28) | (2 << 8) | 6, 0x8000, 0x0042, 0x8000, 0)
    shim = struct.pack(">BBH", 0x10, 3 + len(stack) // 4, 0)
    (r,) = Decoder().decode(_wrapped(shim + md + stack))
    assert [x.node_id for x in r.hops()] == [4, 5]
    # Without any DS Instruction, a stack that is not whole hops is malformed (INT v2.1
    # §5.7: whole hops plus source-only metadata, and there is none).
    md0 = struct.pack(">IHHHH", (2 << 28) | (2 << 8) | 6, 0x8000, 0, 0, 0)
    odd = struct.pack(">BBH", 0x10, 3 + len(stack) // 4 + 1, 0) + md0 + stack + b"\0" * 4
    with pytest.raises(DecodeError) as e:
        Decoder().decode(_wrapped(odd))
    assert e.value.reason == "malformed"


def test_a_port_pair_is_invalid_only_when_the_whole_metadata_is_all_ones() -> None:
    """Issue 15.8. INT v2.1 §5.7: a value that is not available is written as all-ones over
    the whole metadata, 4 or 8 bytes; the level 1 ports are one 4-byte metadata, level 2 one
    8-byte metadata. So ingress 0xFFFF with egress 5 is port 65535 in, port 5 out (the node
    did provide the metadata); only 0xFFFFFFFF makes both unavailable. The collector
    attributes a hop to (node, egress port) the same way."""
    from int_collector.settings import load_settings
    from int_collector.state import Fabric

    flow = Flow(bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]), 17, 1, 2)
    shim = struct.pack(">BBH", 0x10, 3 + 3 * 2, 0)
    md = struct.pack(">IHHHH", (2 << 28) | (2 << 8) | 5, 0xC000, 0, 0, 0)
    stack = h("00000007 ffff0005  00000006 0003ffff  00000005 ffffffff")
    data = report_v2(7, 0, udp_int_packet(flow, shim + md + stack))
    (r,) = Decoder().decode(data)
    assert [(x.node_id, x.ingress_port, x.egress_port) for x in r.hops()] == [
        (7, 0xFFFF, 5), (6, 3, 0xFFFF), (5, None, None)
    ]  # fmt: skip
    (r2,) = Decoder(fast=False).decode(data)
    assert r2.hops() == r.hops()
    f = Fabric(load_settings(None, link_min_reports=1))
    f.observe(r, 1)
    assert set(f.links) == {(7, 5, None), (6, 0xFFFF, None)} and f.hops_unattributed == 1

    # Level 2: 8 bytes, the same rule over both 4-byte halves.
    l2 = encode_stack("v2", 0x0200, [Hop(l2_ingress_port=0xFFFFFFFF, l2_egress_port=9)])
    assert l2 == h("ffffffff 00000009")
    shim = struct.pack(">BBH", 0x10, 3 + 2, 0)
    md = struct.pack(">IHHHH", (2 << 28) | (2 << 8) | 5, 0x0200, 0, 0, 0)
    (r,) = Decoder().decode(report_v2(7, 0, udp_int_packet(flow, shim + md + l2)))
    (x,) = r.hops()
    assert (x.l2_ingress_port, x.l2_egress_port) == (0xFFFFFFFF, 9)
