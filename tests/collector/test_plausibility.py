"""Issue 15.5: what bad input on the report port can create. Fuzzed datagrams used to make
a link series of every node ID and port they happened to hold (2,074 link and 771 report
series from 60k), bounded only by max_links. Now a link, and a reporting switch, becomes a
series only once `link_min_reports` distinct datagrams showed it, or, with
`allowed_switches`, only those nodes count at all."""

from __future__ import annotations

import random

from int_collector.generator import SyntheticFabric
from int_collector.settings import load_settings
from int_collector.state import Fabric
from int_collector.wire import DecodeError, Decoder, Flow, Hop, int_md_v2, report_v2, udp_int_packet

from .conftest import Db, Running, settings_for
from .test_end_to_end import metrics, send, wait_for

FLOW = Flow(bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]), 17, 1000, 5000)


def _mutated(seeds: list[bytes], n: int, rng: random.Random) -> list[bytes]:
    """Bit flips, byte overwrites, cuts and insertions, as the decoder's fuzz test does."""
    out = []
    for i in range(n):
        data = bytearray(rng.choice(seeds))
        kind = i % 4
        if kind == 0:
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif kind == 1:
            data[rng.randrange(len(data))] = rng.choice([0, 0xFF, rng.randrange(256)])
        elif kind == 2:
            data = data[: rng.randrange(len(data))]
        else:
            pos = rng.randrange(len(data))
            data[pos:pos] = rng.randbytes(rng.randint(1, 8))
        out.append(bytes(data))
    return out


def _series(f: Fabric) -> dict[str, set[tuple[str, ...]]]:
    out: dict[str, set[tuple[str, ...]]] = {
        "int_link": set(),
        "int_flow": set(),
        "int_reports": set(),
    }
    for p in f.due_points(1e9, force=True):
        out[p.measurement].add(tuple(sorted(p.tags.items())))
    return out


def test_fuzzed_datagrams_create_no_series_beyond_the_real_fabric() -> None:
    rng = random.Random(15)
    dec = Decoder()
    # The real fabric: valid reports of both families, every datagram numbered anew.
    valid = [SyntheticFabric(8, seed=s, family=fam) for s in range(3) for fam in ("v1", "v2")]
    stream = [fab.random_report()[1] for _ in range(300) for fab in valid]
    truth = Fabric(load_settings(None, link_min_reports=1))
    for d in stream:
        truth.observe_datagram(dec.decode(d), 1)
    real = _series(truth)
    assert len(real["int_link"]) > 20

    seeds = [SyntheticFabric(8, seed=s, family=f).random_report()[1]
             for s in range(20) for f in ("v1", "v2")]  # fmt: skip
    fuzz = _mutated(seeds, 60_000, rng)
    fabric = Fabric(load_settings(None))  # the defaults
    chaff = Fabric(load_settings(None, link_min_reports=1))  # without the filter
    for i, d in enumerate(fuzz):
        try:
            reports = dec.decode(d)
        except DecodeError:
            continue
        fabric.observe_datagram(reports, 1)
        chaff.observe_datagram(reports, 1)
        if i % 100 == 0:  # the real fabric keeps reporting meanwhile
            for v in stream[i // 100 * 3 : i // 100 * 3 + 3]:
                fabric.observe_datagram(dec.decode(v), 1)
    got = _series(fabric)
    unfiltered = _series(chaff)
    # What the filter is for: unfiltered, the fuzz makes hundreds of series.
    assert len(unfiltered["int_link"]) > 5 * len(real["int_link"])
    for measurement in ("int_link", "int_flow", "int_reports"):
        assert got[measurement] <= real[measurement], (
            measurement, got[measurement] - real[measurement]
        )  # fmt: skip
    assert got["int_link"] and got["int_reports"]
    assert len(fabric.pending) <= fabric.s.max_pending_links
    assert fabric.hops_implausible > 0


def _report(node: int, seq: int, hops: list[Hop]) -> bytes:
    return report_v2(node, seq, udp_int_packet(FLOW, int_md_v2(0xF000, hops)))


def _hop(node: int, port: int) -> Hop:
    return Hop(node_id=node, ingress_port=1, egress_port=port, hop_latency=100, queue_id=0,
               queue_occupancy=1)  # fmt: skip


def test_a_link_is_born_after_distinct_datagrams_not_copies() -> None:
    """A sender is confirmed by `link_min_reports` (3) datagrams that move it forward and
    carry its own metadata; from then on, its next 3 such datagrams confirm a link. Copies
    of a datagram add nothing."""
    dec = Decoder()
    f = Fabric(load_settings(None, link_min_reports=3))
    copy = dec.decode(_report(4, 7, [_hop(4, 2)]))
    for _ in range(10):  # one datagram, replayed
        f.observe_datagram(copy, 1)
    assert f.links == {} and set(f.pending) == {(4, 2, 0)} and f.switches == set()
    assert f.due_points(1.0, force=True) == []
    f.observe_datagram(dec.decode(_report(4, 8, [_hop(4, 2)])), 1)
    f.observe_datagram(dec.decode(_report(4, 9, [_hop(4, 2)])), 1)
    assert f.switches == {4} and f.links == {}  # the sender is, the link not yet
    f.observe_datagram(dec.decode(_report(4, 10, [_hop(4, 2)])), 1)
    assert f.links == {}
    f.observe_datagram(dec.decode(_report(4, 11, [_hop(4, 2)])), 1)
    assert set(f.links) == {(4, 2, 0)} and f.pending == {}
    points = f.due_points(2.0, force=True)
    (link,) = [p for p in points if p.measurement == "int_link"]
    assert link.fields["samples"] == 14  # what it saw while pending is not lost
    assert {p.measurement for p in points} == {"int_link", "int_flow", "int_reports"}
    # A garbled header (the node ID of no hop in its own report) confirms nothing.
    g = Fabric(load_settings(None, link_min_reports=3))
    for s in range(10):
        g.observe_datagram(dec.decode(_report(250, s, [_hop(4, 2)])), 1)
    assert g.switches == set() and g.links == {}


def test_pending_links_are_bounded_and_counted_when_dropped() -> None:
    dec = Decoder()
    f = Fabric(load_settings(None, max_pending_links=50))
    for k in range(1000):  # every datagram a new (node, port): nothing repeats
        f.observe_datagram(dec.decode(_report(1000 + k, k, [_hop(1000 + k, k % 7)])), 1)
    assert len(f.pending) == 50 and f.links == {}
    assert f.hops_implausible == 950
    assert len(f.seq) <= 50 and f.due_points(1.0, force=True) == []


def test_allowed_switches_turn_others_away_with_a_reason(db: Db, running: list[Running]) -> None:
    r = Running(settings_for(db, allowed_switches=[3, 4], link_min_reports=3))
    running.append(r)
    # From an allowed switch, a hop of a node that is not: no link for it.
    send(r.c.port, [_report(3, 0, [_hop(3, 1), _hop(99, 2), _hop(4, 5)])])
    send(r.c.port, [_report(77, s, [_hop(77, 1)]) for s in range(5)])  # not allowed
    wait_for(lambda: r.c.received == 6, what="datagrams received")
    m = metrics(r.c.http_port)
    assert m[("int_collector_reports_dropped_total", (("reason", "switch_not_allowed"),))] == 5
    assert m[("int_collector_hops_implausible_total", ())] == 1
    assert m[("int_collector_reports_decoded_total", ())] == 1
    # An allow-list makes its nodes plausible at once: their links are series now.
    assert r.c.fabric.link_keys() == {(3, 1, 0), (4, 5, 0)}
    wait_for(lambda: r.c.writer.written >= 4, what="points written")
    rows = db.flux('|> filter(fn: (r) => r._measurement == "int_link")')
    assert {(x["switch"], x["port"]) for x in rows} == {("3", "1"), ("4", "5")}
