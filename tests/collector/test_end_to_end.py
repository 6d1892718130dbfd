"""Real sockets, a real InfluxDB 1.8.10, Flux read back through influxdb-client."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from int_collector import children
from int_collector.generator import generate
from int_collector.influxd import free_port
from int_collector.wire import Flow, Hop, int_md_v2, report_v1_onos, report_v2, udp_int_packet

from .conftest import Db, Running, settings_for

FLOW = Flow(bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]), 17, 1000, 5000)


# Deadlines for a cold first run on a loaded 2-core machine (each wait ends as soon as its
# condition holds): what takes milliseconds idle took tens of seconds at a load of 20.
DEADLINE_S = 120.0
# A collector's start: the fork server loads the compiled receive path (compiles it, on a
# cache `int-collector compile` did not fill).
START_S = 600.0


def wait_for(cond, timeout: float = DEADLINE_S, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def send(port: int, datagrams: list[bytes]) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for d in datagrams:
            s.sendto(d, ("127.0.0.1", port))


def metrics(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.mark.parametrize("fast_path", [True, False], ids=["compiled", "python"])
def test_udp_to_influxdb_to_flux(db: Db, running: list[Running], fast_path: bool) -> None:
    r = Running(
        settings_for(
            db, ewma_alpha=1.0, latency_threshold_ns=0, relative_threshold=0, fast_path=fast_path
        )
    )
    running.append(r)
    hops = [
        Hop(
            node_id=3,
            ingress_port=1,
            egress_port=2,
            hop_latency=1500,
            queue_id=0,
            queue_occupancy=40,
        ),
        Hop(
            node_id=1, ingress_port=5, egress_port=1, hop_latency=700, queue_id=0, queue_occupancy=3
        ),
    ]
    send(r.c.port, [report_v2(3, 0, udp_int_packet(FLOW, int_md_v2(0xF000, hops)))])
    wait_for(lambda: r.c.writer.written >= 3, what="points written")

    rows = db.flux('|> filter(fn: (r) => r._measurement == "int_link")')
    got = {(x["switch"], x["port"], x["queue"], x["_field"]): x["_value"] for x in rows}
    assert got[("3", "2", "0", "latency_ns")] == 1500.0
    assert got[("3", "2", "0", "queue_occupancy")] == 40.0
    assert got[("1", "1", "0", "latency_ns")] == 700.0
    assert got[("1", "1", "0", "samples")] == 1

    flow = db.flux('|> filter(fn: (r) => r._measurement == "int_flow")')
    by_field = {x["_field"]: x["_value"] for x in flow}
    assert by_field["path"] == "1,3" and by_field["latency_ns"] == 2200.0
    assert by_field["flow"] == "10.0.0.1:1000>10.0.0.2:5000/17"
    # Flow identity is a field, never a tag: the only tags are bounded ones.
    tag_keys = {
        k for x in rows + flow for k in x if not k.startswith("_") and k not in ("result", "table")
    }
    assert tag_keys == {"switch", "port", "queue"}


def test_onos_v1_reports_end_to_end(db: Db, running: list[Running]) -> None:
    """ONOS 2.7's INT app configured with the level 2 port IDs (bitmap 0xFF00): it sets Hop
    ML to the number of bits (8) while each hop holds 9 words (L2 ports take two), and the
    shim length counts the 9. Issue 15.7: these were all dropped as `hop_length`. The
    sink's own hop (switch 3) is pushed onto the report's clone, its egress port the mirror
    port towards the collector (255 here): it is on the flow's path but on no link."""
    r = Running(settings_for(db, ewma_alpha=1.0, latency_threshold_ns=0, relative_threshold=0))
    running.append(r)

    def hop(node: int, in_port: int, out_port: int, latency: int) -> Hop:
        return Hop(node_id=node, ingress_port=in_port, egress_port=out_port,
                   hop_latency=latency, queue_id=0, queue_occupancy=5, ingress_ts=100,
                   egress_ts=100 + latency, l2_ingress_port=in_port, l2_egress_port=out_port,
                   tx_utilization=0)  # fmt: skip

    hops = [hop(3, 1, 255, 40), hop(2, 4, 1, 20), hop(1, 3, 4, 10)]
    report = report_v1_onos(3, FLOW, 0xFF00, hops)
    assert report[14 + 16 + 20 + 8 + 4 + 2] == 8  # Hop ML as ONOS sets it
    send(r.c.port, [report])
    wait_for(lambda: r.c.writer.written >= 4, what="points written")
    rows = db.flux(
        '|> filter(fn: (r) => r._measurement == "int_link" and r._field == "latency_ns")'
    )
    # bmv2 counts microseconds
    assert sorted((x["switch"], x["port"], x["_value"]) for x in rows) == [
        ("1", "4", 10_000.0), ("2", "1", 20_000.0)
    ]  # fmt: skip
    flow = {
        x["_field"]: x["_value"]
        for x in db.flux('|> filter(fn: (r) => r._measurement == "int_flow")')
    }
    assert flow["path"] == "1,2,3" and flow["latency_ns"] == 30_000.0
    m = metrics(r.c.http_port)
    assert m[("int_collector_reports_decoded_total", ())] == 1
    assert m[("int_collector_hops_unattributed_total", ())] == 1


def test_storage_grows_with_change_not_packet_rate(db: Db, running: list[Running]) -> None:
    r = Running(settings_for(db, tick_s=0.05))
    running.append(r)
    n = generate(("127.0.0.1", r.c.port), rate=20_000, switches=8, duration_s=1.5, seed=1)
    wait_for(lambda: r.c.decoded >= n * 0.99, what="reports decoded")
    r.stop()
    link_points = db.flux(
        '|> filter(fn: (r) => r._measurement == "int_link" and r._field == "samples") |> count()'
    )
    total = sum(x["_value"] for x in link_points)
    sums = db.flux(
        '|> filter(fn: (r) => r._measurement == "int_link" and r._field == "samples") |> sum()'
    )
    hops_seen = sum(x["_value"] for x in sums)
    assert hops_seen >= 2 * n  # every hop counted in some point's `samples`
    assert 0 < total < n / 20  # yet far fewer points than reports


def test_metrics_and_health(db: Db, running: list[Running]) -> None:
    r = Running(settings_for(db))
    running.append(r)
    good = [
        report_v2(7, s, udp_int_packet(FLOW, int_md_v2(0x8000, [Hop(node_id=7)])))
        for s in (0, 1, 2, 5)
    ]
    bad = [b"", b"\x30" * 20, good[0][:30]]
    send(r.c.port, good + bad)
    wait_for(lambda: r.c.received == 7, what="datagrams received")
    m = metrics(r.c.http_port)
    assert m[("int_collector_datagrams_received_total", ())] == 7
    assert m[("int_collector_reports_decoded_total", ())] == 4
    assert m[("int_collector_reports_dropped_total", (("reason", "truncated"),))] == 2
    assert m[("int_collector_reports_dropped_total", (("reason", "unknown_version"),))] == 1
    assert m[("int_collector_reports_lost_total", (("switch", "7"),))] == 2
    wait_for(lambda: metrics(r.c.http_port)[("int_collector_points_written_total", ())] > 0)
    with urllib.request.urlopen(f"http://127.0.0.1:{r.c.http_port}/healthz", timeout=5) as resp:
        assert resp.status == 200 and json.load(resp)["status"] == "ok"


def test_health_says_when_influxdb_is_unreachable(running: list[Running]) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    r = Running(settings_for(None, influx_url=dead, retry_initial_s=0.05, retry_max_s=0.1))
    running.append(r)
    send(r.c.port, [report_v2(7, 0, udp_int_packet(FLOW, int_md_v2(0x8000, [Hop(node_id=7)])))])
    wait_for(lambda: r.c.writer.failures > 0, what="a failed write")
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{r.c.http_port}/healthz", timeout=5)
        raise AssertionError("healthz should fail")
    except urllib.error.HTTPError as e:
        body = json.load(e)
        assert (
            e.code == 503 and body["influxdb"].startswith("failing") and body["buffered_points"] > 0
        )
    assert metrics(r.c.http_port)[("int_collector_influxdb_up", ())] == 0


def test_cli_serve_flushes_on_sigterm(db: Db) -> None:
    port, http = free_port(), free_port()
    env = {
        **os.environ,
        "INT_COLLECTOR_INFLUX_URL": db.server.url,
        "INT_COLLECTOR_INFLUX_BUCKET": db.bucket,
        "INT_COLLECTOR_HTTP_PORT": str(http),
        "INT_COLLECTOR_FLUSH_INTERVAL_S": "60",  # nothing is written before SIGTERM ...
        "INT_COLLECTOR_TICK_S": "60",
    }
    proc = children.spawn(
        [sys.executable, "-m", "int_collector", "serve", "--listen", f"127.0.0.1:{port}"],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: _healthz(http), START_S, "collector up")
        hops = [
            Hop(
                node_id=4,
                ingress_port=1,
                egress_port=9,
                hop_latency=100,
                queue_id=0,
                queue_occupancy=1,
            )
        ]
        # Five datagrams: with link_min_reports 3, three confirm the switch and its third,
        # fourth and fifth its link (test_plausibility.py).
        send(port, [report_v2(4, s, udp_int_packet(FLOW, int_md_v2(0xF000, hops)))
                    for s in range(5)])  # fmt: skip
        wait_for(lambda: _metric(http, "int_collector_reports_decoded_total") == 5)
        assert db.flux("") == []
        proc.send_signal(signal.SIGTERM)  # ... so what arrives was flushed by SIGTERM
        assert proc.wait(DEADLINE_S) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        children.stop(proc)
    rows = db.flux(
        '|> filter(fn: (r) => r._measurement == "int_link" and r._field == "latency_ns")'
    )
    assert [(x["switch"], x["port"], x["_value"]) for x in rows] == [("4", "9", 100.0)]


def _healthz(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
            return True
    except (urllib.error.URLError, OSError):  # refused, or accepted and not yet answered
        return False


def _metric(port: int, name: str) -> float:
    return metrics(port).get((name, ()), -1)


def test_sigterm_writes_every_hop_observed_after_quiet_ticks(db: Db) -> None:
    """Issue 15.1 through the real service: steady reports, ticks that write nothing (no
    threshold crossed, keep-alive far away), then SIGTERM. What InfluxDB holds accounts for
    every hop: per link, the points' `samples` add up to the reports that crossed it."""
    port, http = free_port(), free_port()
    env = {
        **os.environ,
        "INT_COLLECTOR_INFLUX_URL": db.server.url,
        "INT_COLLECTOR_INFLUX_BUCKET": db.bucket,
        "INT_COLLECTOR_HTTP_PORT": str(http),
        "INT_COLLECTOR_TICK_S": "0.05",
        "INT_COLLECTOR_KEEPALIVE_S": "600",
    }
    proc = children.spawn(
        [sys.executable, "-m", "int_collector", "serve", "--listen", f"127.0.0.1:{port}"],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    hops = [
        Hop(node_id=n, ingress_port=1, egress_port=p, hop_latency=900, queue_id=0,
            queue_occupancy=3)
        for n, p in ((5, 2), (4, 7), (3, 1))
    ]  # fmt: skip
    n = 500
    try:
        wait_for(lambda: _healthz(http), START_S, "collector up")
        for k in range(0, n, 50):
            send(port, [report_v2(5, s, udp_int_packet(FLOW, int_md_v2(0xF000, hops)))
                        for s in range(k, k + 50)])  # fmt: skip
            time.sleep(0.06)  # a tick between batches
        wait_for(lambda: _metric(http, "int_collector_reports_decoded_total") == n)
        time.sleep(0.3)  # quiet ticks after the last report
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(DEADLINE_S) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        children.stop(proc)
    rows = db.flux(
        '|> filter(fn: (r) => r._measurement == "int_link" and r._field == "samples") |> sum()'
    )
    assert {(x["switch"], x["port"]): x["_value"] for x in rows} == {
        ("5", "2"): n,
        ("4", "7"): n,
        ("3", "1"): n,
    }


def test_hops_of_domain_specific_metadata_only_are_kept_not_internal(
    db: Db, running: list[Running]
) -> None:
    """Issue 15.2: instruction bitmap 0 with Hop ML 2 (INT-MD v2.1 allows hops that carry
    only domain-specific metadata). The report is decoded and counted, its hops are counted
    as not attributable to a link, the reporting node's own metadata (RepMd) still makes its
    link, and nothing is dropped as `internal`."""
    r = Running(settings_for(db, ewma_alpha=1.0))
    running.append(r)
    shim = struct.pack(">BBH", 0x10, 3 + 3 * 2, 0)
    md = struct.pack(">IHHHH", (2 << 28) | (2 << 8) | 5, 0x0000, 0x1234, 0xC000, 0)
    stack = bytes(range(24))  # three hops of two words of domain-specific metadata
    inner = udp_int_packet(FLOW, shim + md + stack)
    local = Hop(ingress_port=1, egress_port=6, hop_latency=400, queue_id=0, queue_occupancy=2)
    send(r.c.port, [report_v2(8, 0, inner, md_bits=0x7000, local=local)])
    wait_for(lambda: r.c.received == 1, what="datagram received")
    m = metrics(r.c.http_port)
    assert m[("int_collector_reports_decoded_total", ())] == 1
    assert not [k for k in m if k[0] == "int_collector_reports_dropped_total"]
    assert m[("int_collector_hops_unattributed_total", ())] == 3
    wait_for(lambda: r.c.writer.written >= 2, what="points written")
    rows = db.flux('|> filter(fn: (r) => r._measurement == "int_link")')
    assert {(x["switch"], x["port"]) for x in rows} == {("8", "6")}


@pytest.mark.parametrize("fast_path", [True, False], ids=["compiled", "python"])
def test_datagrams_queued_when_stopped_are_read_not_dropped(db: Db, fast_path: bool) -> None:
    """SIGTERM stops the loop; what the socket already holds was sent to us and is read and
    counted before the socket closes (7-9 thousand were dropped uncounted before)."""
    from int_collector.service import Collector

    c = Collector(settings_for(db, fast_path=fast_path))
    n = 2000
    send(c.port, [
        report_v2(7, s, udp_int_packet(FLOW, int_md_v2(0x8000, [Hop(node_id=7)])))
        for s in range(n)
    ])  # fmt: skip
    c.stop()  # before the loop ever ran: everything is still queued
    try:
        c.run()
        assert c.received == n and c.decoded == n
    finally:
        c.close()
