"""Real sockets, a real InfluxDB 1.8.10, Flux read back through influxdb-client."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from int_collector.generator import generate
from int_collector.influxd import free_port
from int_collector.wire import Flow, Hop, int_md_v2, report_v1_onos, report_v2, udp_int_packet

from .conftest import Db, Running, settings_for

FLOW = Flow(bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]), 17, 1000, 5000)


def wait_for(cond, timeout: float = 20.0, what: str = "condition") -> None:
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


def test_udp_to_influxdb_to_flux(db: Db, running: list[Running]) -> None:
    r = Running(settings_for(db, ewma_alpha=1.0, latency_threshold_ns=0, relative_threshold=0))
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
    r = Running(settings_for(db, ewma_alpha=1.0))
    running.append(r)
    hops = [
        Hop(node_id=3, ingress_port=1, egress_port=2, hop_latency=10, queue_id=0, queue_occupancy=5)
    ]
    send(r.c.port, [report_v1_onos(3, FLOW, 0xF000, hops)])
    wait_for(lambda: r.c.writer.written >= 2, what="points written")
    rows = db.flux(
        '|> filter(fn: (r) => r._measurement == "int_link" and r._field == "latency_ns")'
    )
    assert [(x["switch"], x["_value"]) for x in rows] == [("3", 10_000.0)]  # bmv2 counts us


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
    proc = subprocess.Popen(
        [sys.executable, "-m", "int_collector", "serve", "--listen", f"127.0.0.1:{port}"],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: _healthz(http), what="collector up")
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
        send(port, [report_v2(4, 0, udp_int_packet(FLOW, int_md_v2(0xF000, hops)))])
        wait_for(lambda: _metric(http, "int_collector_reports_decoded_total") == 1)
        assert db.flux("") == []
        proc.send_signal(signal.SIGTERM)  # ... so what arrives was flushed by SIGTERM
        assert proc.wait(30) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    rows = db.flux(
        '|> filter(fn: (r) => r._measurement == "int_link" and r._field == "latency_ns")'
    )
    assert [(x["switch"], x["port"], x["_value"]) for x in rows] == [("4", "9", 100.0)]


def _healthz(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
            return True
    except (urllib.error.URLError, ConnectionError):
        return False


def _metric(port: int, name: str) -> float:
    return metrics(port).get((name, ()), -1)
