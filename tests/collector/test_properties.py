"""Encoder/decoder round trips (hypothesis) and the decoder fuzzed: only DecodeError escapes."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from int_collector.generator import SyntheticFabric
from int_collector.wire import (
    DecodeError,
    Decoder,
    Flow,
    Hop,
    int_md_v2,
    report_v1_onos,
    report_v2,
    udp_int_packet,
)

# Defined per-hop bits (0-8) and the checksum complement (15); v1 has no buffer (bit 8) in
# ONOS but the format allows it.
DEFINED_BITS = [0, 1, 2, 3, 4, 5, 6, 7, 8, 15]

u8, u16, u24 = st.integers(0, 0xFF), st.integers(0, 0xFFFF), st.integers(0, 0xFFFFFE)
u32 = st.integers(0, 0xFFFFFFFE)  # 0xFFFFFFFF means "invalid" and decodes to None
u64 = st.integers(0, 2**64 - 2)


def hops(ts: st.SearchStrategy[int]) -> st.SearchStrategy[Hop]:
    return st.builds(
        Hop,
        node_id=u32,
        ingress_port=st.integers(0, 0xFFFE),
        egress_port=st.integers(0, 0xFFFE),
        hop_latency=u32,
        queue_id=u8,
        queue_occupancy=u24,
        ingress_ts=ts,
        egress_ts=ts,
        l2_ingress_port=u32,
        l2_egress_port=u32,
        tx_utilization=u32,
        buffer_id=u8,
        buffer_occupancy=u24,
        checksum_complement=u32,
    )


def bitmaps() -> st.SearchStrategy[int]:
    return st.sets(st.sampled_from(DEFINED_BITS), min_size=1).map(
        lambda bits: sum(0x8000 >> b for b in bits)
    )


def expected(hop: Hop, bitmap: int) -> Hop:
    """What survives a trip through `bitmap`: requested fields only."""
    keep = {
        0: ("node_id",),
        1: ("ingress_port", "egress_port"),
        2: ("hop_latency",),
        3: ("queue_id", "queue_occupancy"),
        4: ("ingress_ts",),
        5: ("egress_ts",),
        6: ("l2_ingress_port", "l2_egress_port"),
        7: ("tx_utilization",),
        8: ("buffer_id", "buffer_occupancy"),
        15: ("checksum_complement",),
    }
    out = Hop()
    for bit, names in keep.items():
        if bitmap & (0x8000 >> bit):
            for n in names:
                setattr(out, n, getattr(hop, n))
    return out


flows = st.builds(
    Flow,
    src=st.binary(min_size=4, max_size=4),
    dst=st.binary(min_size=4, max_size=4),
    proto=st.just(17),
    sport=u16,
    dport=u16,
)


@settings(max_examples=300, deadline=None)
@given(
    bitmap=bitmaps(),
    stack=st.lists(hops(u64), min_size=0, max_size=8),
    extra_words=st.integers(0, 3),
    node=u32,
    seq=st.integers(0, 2**22 - 1),
    hw=st.integers(0, 63),
    flow=flows,
    rhc=u8,
)
def test_v2_round_trip(
    bitmap: int,
    stack: list[Hop],
    extra_words: int,
    node: int,
    seq: int,
    hw: int,
    flow: Flow,
    rhc: int,
) -> None:
    from int_collector.wire import hop_words

    ml = hop_words("v2", bitmap) + extra_words  # domain-specific words, skipped
    if ml > 31:
        ml = hop_words("v2", bitmap)
    data = report_v2(
        node,
        seq,
        udp_int_packet(flow, int_md_v2(bitmap, stack, hop_ml=ml, remaining_hop_count=rhc)),
        hw_id=hw,
    )
    (r,) = Decoder().decode(data)
    assert (r.node_id, r.seq, r.hw_id, r.flow) == (node, seq, hw, flow)
    assert (r.instruction_bitmap, r.hop_ml, r.remaining_hop_count) == (bitmap, ml, rhc)
    assert r.hops() == [expected(x, bitmap) for x in stack]


@settings(max_examples=200, deadline=None)
@given(
    bitmap=st.sets(st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7]), min_size=1).map(
        lambda bits: sum(0x8000 >> b for b in bits)
    ),
    stack=st.lists(hops(u32), min_size=1, max_size=6),
    node=u32,
    seq=u32,
    flow=flows,
)
def test_v1_onos_round_trip(bitmap: int, stack: list[Hop], node: int, seq: int, flow: Flow) -> None:
    (r,) = Decoder().decode(report_v1_onos(node, flow, bitmap, stack, seq=seq))
    assert (r.family, r.node_id, r.seq, r.flow, r.partial_stack) == ("v1", node, seq, flow, False)
    assert r.hops() == [expected(x, bitmap) for x in stack]


def _decode_only_decode_errors(data: bytes) -> None:
    try:
        Decoder().decode(data)
    except DecodeError as e:
        assert e.reason in {"truncated", "malformed", "unknown_version", "hop_length"}


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=600))
def test_random_bytes_never_escape(data: bytes) -> None:
    _decode_only_decode_errors(data)


@settings(max_examples=1500, deadline=None)
@given(st.sampled_from([b"\x20", b"\x14", b"\x10", b"\x2f"]), st.binary(max_size=300))
def test_random_bytes_behind_a_known_version_never_escape(first: bytes, rest: bytes) -> None:
    _decode_only_decode_errors(first + rest)


def test_mutated_valid_reports_never_escape() -> None:
    """Bit flips, byte overwrites, cuts and insertions of real generator output."""
    rng = random.Random(4)
    seeds = [
        SyntheticFabric(8, seed=s, family=f).random_report()[1]
        for s in range(20)
        for f in ("v1", "v2")
    ]
    outcomes = {"ok": 0, "error": 0}
    for i in range(40_000):
        data = bytearray(rng.choice(seeds))
        kind = i % 4
        if kind == 0:
            for _ in range(rng.randint(1, 4)):
                pos = rng.randrange(len(data))
                data[pos] ^= 1 << rng.randrange(8)
        elif kind == 1:
            pos = rng.randrange(len(data))
            data[pos] = rng.choice([0, 0xFF, rng.randrange(256)])
        elif kind == 2:
            data = data[: rng.randrange(len(data))]
        else:
            pos = rng.randrange(len(data))
            data[pos:pos] = rng.randbytes(rng.randint(1, 8))
        try:
            Decoder().decode(bytes(data))
            outcomes["ok"] += 1
        except DecodeError:
            outcomes["error"] += 1
    # Both outcomes occur: the mutations reach past the first check.
    assert outcomes["ok"] > 1000 and outcomes["error"] > 1000


def _outcome(dec: Decoder, data: bytes) -> object:
    try:
        return dec.decode(data)
    except DecodeError as e:
        return e.reason


def test_fast_path_decodes_exactly_as_the_general_path() -> None:
    """The one-read fast path for common v2 reports, on valid, batched and mutated input."""
    rng = random.Random(7)
    fab = SyntheticFabric(8, seed=3, family="v2")
    singles = [fab.random_report()[1] for _ in range(50)]
    batched = [singles[i][:8] + b"".join(d[8:] for d in singles[i : i + 5]) for i in range(40)]
    fast, general = Decoder(), Decoder(fast=False)
    fast_used = 0
    for i in range(10_000):
        data = bytearray(rng.choice(singles + batched))
        if i % 2:
            for _ in range(rng.randint(1, 3)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        a, b = _outcome(fast, bytes(data)), _outcome(general, bytes(data))
        assert a == b, data.hex()
        fast_used += isinstance(a, list) and len(a) > 0
    assert fast_used > 5000
    assert fast.skipped == general.skipped
