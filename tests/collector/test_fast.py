"""The compiled receive path (int_collector.fast) against the reference: the Python
decoder field by field, and `state.Fabric` point by point, on generated reports of both
families (single and batched), the specifications' vectors and the fuzz corpus."""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import pytest

from int_collector import fast
from int_collector.generator import SyntheticFabric
from int_collector.settings import load_settings
from int_collector.state import Fabric, Point, Rejected
from int_collector.wire import DecodeError, Decoder, Flow, Hop

from . import test_vectors as tv
from .test_plausibility import _mutated


def _generated(n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    out: list[bytes] = []
    fabs = [SyntheticFabric(12, seed=seed + k, family=f) for k in range(3) for f in ("v2", "v1")]
    singles: list[bytes] = []
    for i in range(n):
        fab = fabs[i % len(fabs)]
        if i % 97 == 0:
            for f in fabs:
                f.step(0.5)
        _sink, data = fab.random_report()
        out.append(data)
        if fab.family == "v2":
            singles.append(data)
        if len(singles) >= 8 and rng.random() < 0.05:  # 8 individual reports, one header
            chunk, singles = singles[:8], []
            out.append(chunk[0][:8] + b"".join(d[8:] for d in chunk))
    return out


VECTORS = [
    tv.SPEC_TR_TCP, tv.SPEC_TR_BASELINE, tv.ONOS_V1, tv._wrapped(tv.SPEC_SOURCE_ONLY_MD),
    tv._wrapped(tv.TWELVE_BYTES_SOURCE_ONLY),
]  # fmt: skip


def corpus(seed: int = 1, n: int = 6000) -> list[bytes]:
    gen = _generated(n, seed)
    rng = random.Random(seed)
    return gen + VECTORS + _mutated(gen[:200] + VECTORS, n, rng)


def _as_array(data: bytes) -> np.ndarray:
    return np.frombuffer(data, np.uint8)


def _expected_hop(h: Hop) -> tuple:
    return (h.node_id, h.ingress_port, h.egress_port, h.hop_latency, h.queue_id,
            h.queue_occupancy, h.egress_ts, h.tx_utilization)  # fmt: skip


def _hop_of(row: np.ndarray, has: np.ndarray, ts_invalid: int) -> tuple:
    def val(col: int, invalid: int) -> int | None:
        if not has[col] or int(row[col]) == invalid:
            return None
        return int(row[col])

    ports: tuple[int | None, int | None] = (None, None)
    if has[fast.H_INPORT] and not (row[fast.H_INPORT] == 0xFFFF and row[fast.H_EGPORT] == 0xFFFF):
        ports = (int(row[fast.H_INPORT]), int(row[fast.H_EGPORT]))
    q = val(fast.H_QUEUE, 0xFFFFFFFF)
    return (val(fast.H_NODE, 0xFFFFFFFF), *ports, val(fast.H_LAT, 0xFFFFFFFF),
            None if q is None else q >> 24, None if q is None else q & 0xFFFFFF,
            val(fast.H_ETS, ts_invalid), val(fast.H_TX, 0xFFFFFFFF))  # fmt: skip


def test_compiled_decode_agrees_field_by_field() -> None:
    """Every datagram the compiled path takes, the Python decoder decodes to the same
    reports, field by field; what it leaves, the Python decoder decides."""
    settings = load_settings(None)
    ff = fast.FastFabric(settings)
    ref = Decoder(fast=False)
    H = np.zeros((4096, 7), np.uint64)
    out = np.zeros((64, 25), np.int64)
    taken = left = 0
    for data in corpus():
        n = fast.decode_common(_as_array(data), len(data), ff.udp_ports, ff.pi, H, out)
        if n < 0:
            left += 1
            continue
        taken += 1
        reports = ref.decode(data)  # raises if the compiled path took something broken
        assert len(reports) == n, data.hex()
        for k, r in enumerate(reports):
            o = out[k]
            flow = fast._flow_of(o[3:8])
            meta, has, row = o[9:15], o[15:22].astype(bool), int(o[22])
            assert (r.node_id, r.hw_id, r.seq, r.flow) == (int(o[0]), int(o[1]), int(o[2]), flow)
            assert r.flow.dport == o[8] and r.packet_length == meta[1]
            assert (r.hop_count, r.instruction_bitmap, r.hop_ml, r.remaining_hop_count) == tuple(
                int(x) for x in meta[[0, 2, 3, 4]]
            )
            flags = int(meta[5])
            assert (r.dropped, r.congested, r.tracked, r.intermediate) == tuple(
                bool(flags & b) for b in (0x80, 0x40, 0x20, 0x10)
            )
            assert r.local is None and r.family == ("v2" if o[23] == 2 else "v1")
            if r.family == "v1":
                assert r.ingress_ts == o[24] and not r.partial_stack
            ts_invalid = 0xFFFFFFFFFFFFFFFF if r.family == "v2" else 0xFFFFFFFF
            got = [_hop_of(H[row + h], has, ts_invalid) for h in range(r.hop_count)]
            assert got == [_expected_hop(h) for h in r.hops()], data.hex()
    assert taken > 5000 and left > 2000  # both paths are exercised


def _feed_reference(f: Fabric, dec: Decoder, data: bytes, now: int, dropped: dict) -> None:
    try:
        f.observe_datagram(dec.decode(data), now)
    except (DecodeError, Rejected) as e:
        dropped[e.reason] = dropped.get(e.reason, 0) + 1


def _comparable(points: list[Point]) -> list[tuple]:
    return sorted(
        (p.measurement, tuple(sorted(p.tags.items())), tuple(sorted(p.fields.items())))
        for p in points
    )


def _batches(data: list[bytes], rng: random.Random) -> Iterator[list[bytes]]:
    i = 0
    while i < len(data):
        k = rng.choice([1, 1, 3, 17, 64, 256])
        yield data[i : i + k]
        i += k


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"link_min_reports": 1, "ewma_alpha": 0.5},
        {"max_links": 40, "max_pending_links": 25, "max_flows": 30},
        {"allowed_switches": [3, 4, 5, 6, 7, 8, 9, 10]},
        {"int_udp_ports": [5000], "int_dscp": None, "aggregation_udp_port": 5000},
        {"tx_utilization_full_scale": 7.0, "v1_sink_hop_is_mirror": False, "keepalive_s": 0.35},
        {"max_flows": 50, "max_flow_points": 3, "max_unwritten_s": 1.0},
    ],
    ids=[
        "defaults",
        "no-filter",
        "small-tables",
        "allow-list",
        "udp-marking",
        "units",
        "flow-budget",
    ],
)
def test_compiled_state_gives_the_reference_points(overrides: dict) -> None:
    """The same datagrams, in batches, through the compiled path (with the Python decoder
    for what it leaves) and through Decoder + Fabric: the same points at every tick, the
    same counters and drop reasons."""
    settings = load_settings(None, **overrides)
    rng = random.Random(3)
    data = corpus(seed=2, n=4000)
    rng.shuffle(data[len(data) // 2 :])  # fuzz among the real reports
    ref, ref_dec, ref_dropped = Fabric(settings), Decoder(**_decoder_kw(settings)), {}
    ff, ff_dec, ff_dropped = fast.FastFabric(settings), Decoder(**_decoder_kw(settings)), {}
    bufs = np.zeros((256, fast.SLOT), np.uint8)
    lens = np.zeros(256, np.int64)
    now, t = 1_000_000, 1000.0
    compiled = 0

    def slow(d: bytes, now_ns: int) -> None:
        _feed_reference_fast(ff, ff_dec, d, now_ns, ff_dropped)

    for batch in _batches(data, rng):
        for k, d in enumerate(batch):
            bufs[k, : len(d)] = _as_array(d)
            lens[k] = len(d)
            _feed_reference(ref, ref_dec, d, now, ref_dropped)
        done, _decoded, rejected = ff.ingest(bufs, lens, len(batch), now, slow)
        compiled += done
        if rejected:
            ff_dropped["switch_not_allowed"] = ff_dropped.get("switch_not_allowed", 0) + rejected
        now += 1000
        if rng.random() < 0.2:
            t += rng.choice([0.01, 0.1, 0.4])
            assert _comparable(ff.due_points(t)) == _comparable(ref.due_points(t))
    assert _comparable(ff.due_points(t + 1, force=True)) == _comparable(
        ref.due_points(t + 1, force=True)
    )
    assert compiled > 1000
    assert ff_dropped == ref_dropped and ff_dec.skipped == ref_dec.skipped
    for name in ("hops_unattributed", "hops_implausible", "links_full", "lost_total",
                 "flows_evicted", "flows_evicted_unwritten"):  # fmt: skip
        assert getattr(ff, name) == getattr(ref, name), name
    assert ff.counts() == ref.counts() and ff.link_keys() == ref.link_keys()
    assert ff.lost_per_switch() == ref.lost_per_switch()


def _feed_reference_fast(
    f: fast.FastFabric, dec: Decoder, data: bytes, now: int, dropped: dict
) -> None:
    try:
        f.observe_datagram(dec.decode(data), now)
    except (DecodeError, Rejected) as e:
        dropped[e.reason] = dropped.get(e.reason, 0) + 1


def _decoder_kw(settings) -> dict:
    from int_collector.wire import IntMarking

    return {
        "marking": IntMarking(settings.int_dscp, settings.int_dscp_mask,
                              frozenset(settings.int_udp_ports)),
        "source_only": settings.source_only_metadata,
    }  # fmt: skip


def test_flow_words_round_trip() -> None:
    for f in (
        Flow(bytes([10, 0, 0, 1]), bytes([255, 255, 255, 255]), 17, 65535, 0),
        Flow(bytes(range(16)), bytes([0xFF] * 16), 6, 1, 2),
    ):
        assert fast._flow_of(np.array(fast._flow_words(f), np.int64)) == f


def test_lost_per_switch_survives_the_receive_loop_writing_meanwhile() -> None:
    """The receive loop runs compiled without the GIL while the snapshot thread reads the
    loss counters: np.nonzero on the live column raised (issue 29), which killed the
    snapshot thread and froze /metrics. A nogil writer flips the column here meanwhile."""
    import threading

    import numba

    ff = fast.FastFabric(load_settings(None))
    ti = ff.ti

    @numba.njit(nogil=True, cache=False)
    def flip(ti: np.ndarray, col: int, rounds: int) -> None:
        for k in range(rounds):
            for r in range(ti.shape[0]):
                ti[r, col] = (r + k) % 2

    flip(ti, fast.T_USED, 1)  # compiled before the race
    t = threading.Thread(target=lambda: flip(ti, fast.T_USED, 20_000), daemon=True)
    t.start()
    calls = 0
    while t.is_alive() and calls < 20_000:
        ff.lost_per_switch()
        calls += 1
    t.join(120)
    assert calls > 10


@pytest.mark.parametrize("reports", [64, 65, 200, 1000])
def test_many_reports_in_a_datagram_stay_on_the_compiled_path(reports: int) -> None:
    """A 65th report used to send the whole datagram to the Python decoder (issue 29: 37%
    lost at 65 a datagram)."""
    import struct

    from int_collector.wire import individual_report_v2, int_md_v2, udp_int_packet

    flow = Flow(bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]), 17, 1000, 5000)
    one = individual_report_v2(udp_int_packet(flow, int_md_v2(0x8000, [Hop(node_id=7)])))
    data = struct.pack(">II", (2 << 28) | 5, 7) + one * reports
    assert len(data) <= 65507, len(data)
    ff = fast.FastFabric(load_settings(None))
    H = np.zeros((4096, 7), np.uint64)
    out = np.zeros((reports, 25), np.int64)
    assert fast.decode_common(_as_array(data), len(data), ff.udp_ports, ff.pi, H, out) == reports
    assert Decoder(fast=False).decode(data) and len(Decoder(fast=False).decode(data)) == reports
