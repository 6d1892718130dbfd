"""Several collectors on one bucket (issue 33): three `int-collector serve` processes, each
receiving the reports of its own sink switches, against one `serve` receiving them all,
on one real InfluxDB; the service's view (`TelemetryReader`) of both buckets is compared.

INT-MD reports carry every hop of the path from the sink, so the links of a spine, and a
leaf's uplinks, are reported by sinks of every collector: each collector sees only part of
their packets. The stream is deterministic (a fixed cycle of flows, evenly spaced packets)
so that one collector's estimates and the merged ones of three can be compared tightly.
"""

from __future__ import annotations

import json
import random
import re
import socket
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime
from typing import Any

import pytest

from agg_optimizer.model.documents import Link, Node, Topology
from agg_optimizer.service.telemetry import TelemetryReader, _merge
from int_collector.influxd import InfluxServer
from int_collector.wire import Flow, Hop, int_md_v2, report_v2, udp_int_packet

from .conftest import Db
from .test_end_to_end import wait_for
from .test_workers import Serve

SPINES, LEAVES = (1, 2), (3, 4, 5, 6)
# Two fabrics in one stream: switch IDs +0 report egress timestamps (utilisation from the
# bytes of reported packets), +10 the switch's own tx utilisation.
BYTES_BITMAP, TX_BITMAP = 0xFC00, 0xFD00
FABRICS = ((0, BYTES_BITMAP), (10, TX_BITMAP))
# The collector each sink switch reports to (the address it is configured with).
OWNER = {3: "c0", 4: "c0", 5: "c1", 6: "c2"}
GAP_NS = 20_000  # one packet every 20 us per fabric
REPORTS = 20_000  # over both fabrics: 0.2 s of each fabric's time, 10 utilisation windows
LOSSY_SINK, LOSS_EVERY = 4, 97  # every 97th report of sink 4 is not sent (sequence loss)
ENV = {
    "INT_COLLECTOR_LINK_SPEED_BPS": "50e6",
    "INT_COLLECTOR_UTILIZATION_WINDOW_NS": "20e6",
}


class Stream:
    """Reports of two leaf-spine fabrics (spine port i: leaf i; leaf port i: spine i; leaf
    port 100: its host), every packet of a fixed cycle of flows reported by its sink."""

    def __init__(self, seed: int = 7) -> None:
        rng = random.Random(seed)
        self.rng = rng
        cycle = []
        for s in LEAVES:
            for d in LEAVES:
                if s != d:
                    # Uneven: links carry different rates.
                    cycle += [(s, d, SPINES[(s + d) % 2])] * (1 + (s * d) % 3)
                    cycle += [(s, d, SPINES[(s + d + 1) % 2])] * (1 + (s + d) % 2)
        rng.shuffle(cycle)
        self.cycle = cycle
        self.base_latency: dict[tuple[int, int], int] = {}
        self.base_queue: dict[tuple[int, int], int] = {}
        self.tx: dict[tuple[int, int], float] = {}
        for off, _ in FABRICS:
            for node in (*SPINES, *LEAVES):
                for port in (1, 2, 3, 4, 100):
                    k = (node + off, port)
                    self.base_latency[k] = rng.randrange(2_000, 20_000)
                    self.base_queue[k] = rng.randrange(5, 80)
                    self.tx[k] = rng.uniform(0.1, 0.7)

    def _hop(self, node: int, in_port: int, out_port: int, ets: int, tx: bool) -> Hop:
        k = (node, out_port)
        lat = self.base_latency[k] + self.rng.randrange(-200, 200)
        return Hop(
            node_id=node, ingress_port=in_port, egress_port=out_port, hop_latency=lat,
            queue_id=0, queue_occupancy=self.base_queue[k] + self.rng.randrange(4),
            ingress_ts=ets - lat, egress_ts=ets,
            tx_utilization=int(self.tx[k] * 1_000_000) if tx else None,
        )  # fmt: skip

    def datagrams(self, n: int) -> list[tuple[int, int, bytes]]:
        """(sink switch, its sequence number, datagram); sink 4's lost ones left out."""
        out = []
        seq: Counter[int] = Counter()
        for i in range(n):
            off, bitmap = FABRICS[i % 2]
            s, d, sp = self.cycle[(i // 2) % len(self.cycle)]
            t = 1_000_000_000 + (i // 2) * GAP_NS
            tx = bitmap == TX_BITMAP
            # Egress times per link in sending order: the fold measures utilisation over them.
            hops = [
                self._hop(d + off, sp, 100, t + 6_000, tx),
                self._hop(sp + off, LEAVES.index(s) + 1, LEAVES.index(d) + 1, t + 3_000, tx),
                self._hop(s + off, 100, sp, t, tx),
            ]
            flow = Flow(bytes([10, 0, s, 1 + i % 5]), bytes([10, 0, d, 1]), 17, 1024 + i % 40, 5000)
            sink = d + off
            inner = udp_int_packet(flow, int_md_v2(bitmap, hops, remaining_hop_count=5))
            k = seq[sink]
            seq[sink] += 1
            if d == LOSSY_SINK and k % LOSS_EVERY == LOSS_EVERY - 1:
                continue
            out.append((sink, k, report_v2(sink, k, inner)))
        return out


def _topology() -> tuple[Topology, dict[str, Any]]:
    nodes, links, devices = [], [], []
    for off, _ in FABRICS:
        for sp in SPINES:
            nodes.append(Node(id=f"s{sp + off}", kind="switch"))
            devices.append({"id": f"s{sp + off}", "annotations": {"intSwitchId": str(sp + off)}})
        for i, lf in enumerate(LEAVES):
            leaf, host = f"l{lf + off}", f"10.0.{lf + off}.1"
            nodes += [Node(id=leaf, kind="switch"), Node(id=host, kind="host")]
            devices.append({"id": leaf, "annotations": {"intSwitchId": str(lf + off)}})
            links.append(Link(src=host, dst=leaf, src_port=1, dst_port=100))
            for sp in SPINES:
                links.append(Link(src=leaf, dst=f"s{sp + off}", src_port=sp, dst_port=i + 1))
    return Topology(nodes=nodes, links=links), {"devices": devices}


def _view(influx: InfluxServer, bucket: str) -> tuple[dict[tuple[str, str], Any], int]:
    topo, devices = _topology()
    reader = TelemetryReader(influx.url, "", "-", bucket, 300, 300)
    try:
        snap = reader.snapshot(topo, devices)
    finally:
        reader.close()
    assert not snap.stale and not snap.unmapped, (snap.stale, snap.unmapped)
    return {(t.src, t.dst): t for t in snap.telemetry.links}, snap.rows


def _send(pairs: list[tuple[int, int, bytes]], ports: list[dict[int, int]], rate: float) -> None:
    """Each sink switch from a socket of its own, to the port `ports[i][sink]` of every
    target i, `rate` datagrams per second per target."""
    socks = {s: socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for s, _, _ in pairs}
    start = time.monotonic()
    try:
        for i, (sink, _, data) in enumerate(pairs):
            for target in ports:
                socks[sink].sendto(data, ("127.0.0.1", target[sink]))
            ahead = i / rate - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)
    finally:
        for s in socks.values():
            s.close()


def test_three_collectors_give_the_service_the_view_of_one(influx: InfluxServer) -> None:
    dbs = {}
    for name in ("one", "three"):
        db = f"sc_{name}_{int(time.time() * 1000)}"
        influx.query_v1(f'CREATE DATABASE "{db}"')
        dbs[name] = Db(influx, f"{db}/autogen")
    serves: dict[str, Serve] = {}
    try:
        # Default plausibility (link_min_reports 3): each collector confirms its own sinks.
        serves["one"] = Serve(1, dbs["one"], **ENV)
        for cid in ("c0", "c1", "c2"):
            serves[cid] = Serve(1, dbs["three"], INT_COLLECTOR_COLLECTOR_ID=cid, **ENV)
        pairs = Stream().datagrams(REPORTS)
        sinks = {s for s, _, _ in pairs}
        one = dict.fromkeys(sinks, serves["one"].port)
        split = {s: serves[OWNER[s % 10]].port for s in sinks}
        _send(pairs, [one, split], rate=5_000)
        sent = len(pairs)

        def decoded(names: tuple[str, ...]) -> float:
            return sum(serves[c].metric("int_collector_reports_decoded_total") for c in names)

        wait_for(
            lambda: decoded(("one",)) == sent and decoded(("c0", "c1", "c2")) == sent,
            60,
            "every report decoded",
        )
        counters = {}
        for name, svc in serves.items():
            counters[name] = {
                m: svc.metric(f"int_collector_{m}_total")
                for m in ("datagrams_received", "reports_decoded", "hops_unattributed",
                          "hops_implausible")
            }  # fmt: skip
            counters[name]["lost"] = _lost(svc)
        # SIGTERM and a clean exit: every series with news is written, the backlog flushed.
        # (kill() is SIGTERM and SIGKILL at once: a CI run lost a collector's last points.)
        codes = {name: svc.stop() for name, svc in serves.items()}
        assert all(c == 0 for c in codes.values()), codes
    finally:
        for svc in serves.values():
            svc.kill()
    threes = [counters[c] for c in ("c0", "c1", "c2")]
    for m in ("datagrams_received", "reports_decoded", "hops_unattributed", "hops_implausible"):
        assert sum(c[m] for c in threes) == counters["one"][m], m
    lost3: Counter[str] = Counter()
    for c in threes:
        lost3.update(c["lost"])
    assert +lost3 == +Counter(counters["one"]["lost"]) and lost3, (lost3, counters["one"])

    single, rows1 = _view(influx, dbs["one"].bucket)
    merged, rows3 = _view(influx, dbs["three"].bucket)
    assert single.keys() == merged.keys() and len(single) == 2 * (8 + 8 + 4)
    worst = {"utilization": 0.0, "latency_us": 0.0, "queue_bytes": 0.0}
    for k, a in single.items():
        b = merged[k]
        assert b.utilization == pytest.approx(a.utilization, rel=0.08), (k, a, b)
        assert b.latency_us == pytest.approx(a.latency_us, abs=0.3), (k, a, b)
        assert b.queue_bytes == pytest.approx(a.queue_bytes, abs=3), (k, a, b)
        worst["utilization"] = max(worst["utilization"], abs(b.utilization / a.utilization - 1))
        worst["latency_us"] = max(worst["latency_us"], abs(b.latency_us - a.latency_us))
        worst["queue_bytes"] = max(worst["queue_bytes"], abs(b.queue_bytes - a.queue_bytes))

    # Each series has one writer; each sink's own series (reports, flows) one collector.
    three = dbs["three"]
    series = _series(influx, three)
    assert series and all(re.search(r",collector=c[012](,|$)", k) for k in series), series
    for meas in ("int_reports", "int_flow"):
        writers = defaultdict(set)
        for r in three.flux(f'|> filter(fn: (r) => r._measurement == "{meas}")'
                            ' |> keep(columns: ["switch", "collector"]) |> group()'):  # fmt: skip
            writers[int(r["switch"])].add(r["collector"])
        assert writers == {s: {OWNER[s % 10]} for s in sinks}, (meas, writers)
    # Hops: a link's samples over its collectors add up to the single collector's.
    samples = {}
    for name in ("one", "three"):
        got: Counter[tuple[str, str]] = Counter()
        for r in dbs[name].flux('|> filter(fn: (r) => r._measurement == "int_link" and '
                                'r._field == "samples") |> group(columns: ["switch", "port"])'
                                ' |> sum()'):  # fmt: skip
            got[(r["switch"], r["port"])] += r["_value"]
        samples[name] = got
    assert samples["three"] == samples["one"]
    # Received and lost per switch: the owner's last int_reports point, as the single one's.
    last = {}
    for name in ("one", "three"):
        last[name] = {
            (r["switch"], r["_field"]): r["_value"]
            for r in dbs[name].flux(
                '|> filter(fn: (r) => r._measurement == "int_reports") |> last()'
            )
        }
    assert last["three"] == last["one"]

    # Without merging (the newest series of a link wins, as with one unnamed writer), a
    # leaf's uplink, whose packets go to the sinks of every collector, shows one
    # collector's share of its bytes; a spine's downlink has one sink and one writer.
    naive = _naive_utilisation(three)
    up = [(f"l{lf}", f"s{sp}") for sp in SPINES for lf in LEAVES]
    shares = sorted(naive[k] / single[k].utilization for k in up)
    print(
        f"\nsent {sent} datagrams; rows: one {rows1}, three {rows3}; worst difference: "
        f"utilisation {worst['utilization']:.1%}, latency {worst['latency_us']:.3f} us, "
        f"queue {worst['queue_bytes']:.2f}; unmerged uplink utilisation / single: "
        f"{shares[0]:.2f}-{shares[-1]:.2f}; counters {counters}"
    )
    assert shares[-1] < 0.9


def _series(influx: InfluxServer, db: Db) -> list[str]:
    name = db.bucket.split("/")[0]
    doc = json.loads(influx.query_v1(f'SHOW SERIES ON "{name}"'))
    return [v[0] for v in doc["results"][0]["series"][0]["values"]]


def _lost(svc: Serve) -> dict[str, float]:
    from .test_end_to_end import metrics

    return {
        dict(labels)["switch"]: v
        for (name, labels), v in metrics(svc.http).items()
        if name == "int_collector_reports_lost_total" and v
    }


def _naive_utilisation(db: Db) -> dict[tuple[str, str], float]:
    """Leaf l -> spine s: the utilisation of the newest point of any collector."""
    newest: dict[tuple[str, str], tuple[datetime, float]] = {}
    for r in db.flux('|> filter(fn: (r) => r._measurement == "int_link" and '
                     'r._field == "utilization") |> last()'):  # fmt: skip
        sw, port = int(r["switch"]), int(r["port"])
        if sw in LEAVES and port in SPINES:
            k = (f"l{sw}", f"s{port}")
            if k not in newest or r["_time"] > newest[k][0]:
                newest[k] = (r["_time"], r["_value"])
    return {k: v for k, (_, v) in newest.items()}


def test_merge_adds_partial_utilisation_and_weights_the_rest_by_hops() -> None:
    t = datetime.now(UTC)
    parts = [
        {"time": t, "utilization": 0.2, "utilization_from_bytes": True, "latency_ns": 1000.0,
         "queue_occupancy": 10.0, "aggregation_share": 0.5, "hops_in_window": 300},
        {"time": t, "utilization": 0.1, "utilization_from_bytes": True, "latency_ns": 4000.0,
         "queue_occupancy": 40.0, "aggregation_share": 0.0, "hops_in_window": 100},
    ]  # fmt: skip
    m = _merge(parts)
    assert m["utilization"] == pytest.approx(0.3)
    assert m["latency_ns"] == pytest.approx(1750.0)
    assert m["queue_occupancy"] == pytest.approx(17.5)
    assert m["aggregation_share"] == pytest.approx(0.375)
    # The switch's own tx utilisation is the whole port's in every series: weighted too.
    for p in parts:
        del p["utilization_from_bytes"]
    assert _merge(parts)["utilization"] == pytest.approx(0.175)
    fields = ("utilization", "latency_ns", "queue_occupancy", "aggregation_share")
    assert _merge(parts[:1]) == {k: parts[0][k] for k in fields}


def test_a_collector_id_tags_each_worker_as_a_writer_of_its_own() -> None:
    from int_collector.service import Collector
    from int_collector.settings import SettingsError, load_settings

    with pytest.raises(SettingsError, match="collector_id"):
        load_settings(None, collector_id="pod 1")
    kw = dict(listen_host="127.0.0.1", listen_port=0, http_port=0, fast_path=False)
    for cid, worker, workers, tag in (("", 0, 1, ""), ("pod1", 0, 1, "pod1"),
                                      ("pod1", 1, 2, "pod1/1")):  # fmt: skip
        c = Collector(load_settings(None, collector_id=cid, **kw), worker=worker, workers=workers)
        try:
            assert c.collector_tag == tag
        finally:
            c.close()
