"""Grafana's provisioning (int-collector/grafana/) and its dashboard: the datasource reaches
the compose InfluxDB with the same organisation, bucket and token as the services; Grafana
finds the dashboard where compose mounts it; and every panel's Flux query runs, with
Grafana's macros replaced as Grafana does, on a real InfluxDB 1.8.10 holding points the
real collector wrote from UDP reports and decisions the optimizer's own writer wrote.

Not run here: Grafana itself (no engine, no image) and InfluxDB 2.7, whose Flux is newer
than 1.8.10's 0.65; the queries use only functions both have.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from influxdb_client import InfluxDBClient

from agg_optimizer.service.telemetry import TelemetryReader
from int_collector.generator import generate
from int_collector.influxd import InfluxServer
from int_collector.service import Collector
from int_collector.settings import load_settings
from int_collector.wire import Flow, Hop, int_md_v2, report_v2, udp_int_packet

from .conftest import REPO

GRAFANA = REPO / "int-collector" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "innet-agg.json"
GAP_SWITCH = 77  # sends sequence numbers with gaps


def provisioning(kind: str) -> list[dict[str, Any]]:
    docs = []
    for f in sorted((GRAFANA / "provisioning" / kind).glob("*.yaml")):
        docs.append(yaml.safe_load(f.read_text()))
    assert docs, kind
    return docs


def datasource() -> dict[str, Any]:
    (ds,) = [d for doc in provisioning("datasources") for d in doc["datasources"]]
    return ds


def expand(value: str, env: dict[str, str]) -> str:
    """Grafana's provisioning replaces $VAR and ${VAR} from its environment."""
    return re.sub(r"\$\{?(\w+)\}?", lambda m: env[m.group(1)], value)


def panels() -> list[dict[str, Any]]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def test_provisioning_is_mounted_where_grafana_reads_it(model: dict[str, Any]) -> None:
    mounts = {
        v["target"]: Path(v["source"])
        for v in model["services"]["grafana"]["volumes"]
        if v["type"] == "bind"
    }
    assert mounts["/etc/grafana/provisioning"] == GRAFANA / "provisioning"  # Grafana's default
    (provider,) = [p for doc in provisioning("dashboards") for p in doc["providers"]]
    assert mounts[provider["options"]["path"]] == DASHBOARD.parent
    home = model["services"]["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert Path(home).parent == Path(provider["options"]["path"])
    assert (DASHBOARD.parent / Path(home).name).is_file()


def test_datasource_reaches_influxdb_as_the_services_do(model: dict[str, Any]) -> None:
    ds = datasource()
    env = model["services"]["grafana"]["environment"]
    used = re.findall(r"\$\{?(\w+)\}?", json.dumps(ds))
    assert used and all(v in env for v in used), f"unset in grafana's environment: {used}"
    url = urlsplit(ds["url"])
    influx = model["services"]["influxdb"]
    assert url.hostname == "influxdb"
    assert url.port in {p["target"] for p in influx["ports"]}
    init = influx["environment"]
    assert ds["type"] == "influxdb" and ds["jsonData"]["version"] == "Flux"
    assert expand(ds["jsonData"]["organization"], env) == init["DOCKER_INFLUXDB_INIT_ORG"]
    assert expand(ds["jsonData"]["defaultBucket"], env) == init["DOCKER_INFLUXDB_INIT_BUCKET"]
    assert expand(ds["secureJsonData"]["token"], env) == init["DOCKER_INFLUXDB_INIT_ADMIN_TOKEN"]


def test_every_panel_queries_the_provisioned_datasource_in_flux() -> None:
    uid = datasource()["uid"]
    ps = panels()
    assert {p["title"] for p in ps} >= {
        "Link utilisation",
        "Hop latency",
        "Queue occupancy",
        "Reports lost per switch",
        "Report loss per switch",
        "Predicted completion time per job",
        "Placement decisions",
    }
    ids = [p["id"] for p in json.loads(DASHBOARD.read_text())["panels"]]
    assert len(ids) == len(set(ids))
    for p in ps:
        assert p["datasource"]["uid"] == uid, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == uid
            assert "from(bucket: v.defaultBucket)" in t["query"], p["title"]
            assert "range(start: v.timeRangeStart, stop: v.timeRangeStop)" in t["query"]


def go_duration(seconds: float) -> str:
    """time.Duration.String() for the windows used here (what Grafana puts for
    v.windowPeriod): 100ms, 1s, 1m0s."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    if seconds < 60:
        return f"{seconds:g}s"
    return f"{int(seconds // 60)}m{seconds % 60:g}s"


def grafana_flux(
    query: str, bucket: str, org: str, start: datetime, stop: datetime, window_s: float
) -> str:
    """Grafana's Flux macros (pkg/tsdb/influxdb/flux/macros.go): times as RFC 3339 in UTC,
    the window as a Go duration, bucket and organisation as string literals."""
    fmt = "%Y-%m-%dT%H:%M:%S.%fZ"
    return (
        query.replace("v.timeRangeStart", start.astimezone(UTC).strftime(fmt))
        .replace("v.timeRangeStop", stop.astimezone(UTC).strftime(fmt))
        .replace("v.windowPeriod", go_duration(window_s))
        .replace("v.defaultBucket", json.dumps(bucket))
        .replace("v.organization", json.dumps(org))
    )


def _send_gapped(port: int, seqs: list[int]) -> None:
    flow = Flow(bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]), 17, 1000, 5000)
    hop = Hop(node_id=GAP_SWITCH, ingress_port=1, egress_port=2, hop_latency=900, queue_id=0)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for seq in seqs:
            s.sendto(
                report_v2(GAP_SWITCH, seq, udp_int_packet(flow, int_md_v2(0xF000, [hop]))),
                ("127.0.0.1", port),
            )


def _until(cond: Any, what: str, timeout_s: float = 120.0) -> Any:
    """Poll `cond` until it returns something true; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not (value := cond()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.02)
    return value


def _lost_points(influx: InfluxServer, bucket: str) -> list[datetime]:
    """Times of switch 77's points that carry a loss, as InfluxDB holds them."""
    q = (
        f'from(bucket: "{bucket}") |> range(start: 0) |> filter(fn: (r) =>'
        f' r._measurement == "int_reports" and r._field == "lost" and r.switch == "{GAP_SWITCH}"'
        " and r._value > 0)"
    )
    with InfluxDBClient(url=influx.url, token="", org="-") as c:
        return [r.get_time() for tb in c.query_api().query(q, org="-") for r in tb.records]


@pytest.fixture(scope="module")
def telemetry(influx: InfluxServer) -> dict[str, Any]:
    """A database filled by the collector (UDP reports from its own generator, plus one
    switch losing reports in two steps) and by the optimizer's decision writer."""
    db = "g" + uuid.uuid4().hex[:10]
    influx.query_v1(f'CREATE DATABASE "{db}"')
    bucket = f"{db}/autogen"
    s = load_settings(
        None, listen_host="127.0.0.1", listen_port=0, http_port=0, flush_interval_s=0.1,
        tick_s=0.05, influx_url=influx.url, influx_bucket=bucket,
    )  # fmt: skip
    start = datetime.now(UTC) - timedelta(minutes=5)
    collector = Collector(s)
    t = threading.Thread(target=collector.run, daemon=True)
    t.start()
    try:
        # A count, not a duration: on a loaded machine a 0.5 s burst sent too few datagrams
        # per switch for any link to become a series (a CI run saw switch 77 alone).
        n = generate(("127.0.0.1", collector.port), rate=2000, switches=4, count=1000, seed=1)
        _send_gapped(collector.port, [0, 1, 2, 5])  # 2 lost
        _until(lambda: collector.decoded >= n + 4, "the collector to decode every report")
        # A point with lost = 2 in InfluxDB, then a window later the next two losses.
        written = _until(lambda: _lost_points(influx, bucket), "switch 77's first loss point")
        _until(
            lambda: datetime.now(UTC) > max(written) + timedelta(seconds=0.15),
            "a 100 ms window past that point",
        )
        _send_gapped(collector.port, [6, 9])  # 2 more lost
        _until(lambda: collector.decoded >= n + 6, "the last reports")
    finally:
        collector.stop()
        t.join(30)
        collector.close(timeout_s=30)
    writer = TelemetryReader(influx.url, "", "-", bucket, 300, 60)
    writer.write_decision(bucket, "job-a", "agg", ["s1", "s2"], 0.42, "api")
    writer.write_decision(bucket, "job-b", "ps", ["s3"], 1.5, "periodic")
    writer.close()
    stop = datetime.now(UTC) + timedelta(seconds=5)
    return {"server": influx, "bucket": bucket, "start": start, "stop": stop}


def run_panel(tel: dict[str, Any], title: str, window_s: float = 1.0) -> list[dict[str, Any]]:
    (panel,) = [p for p in panels() if p["title"] == title]
    rows = []
    with InfluxDBClient(url=tel["server"].url, token="", org="-", timeout=20_000) as c:
        for t in panel["targets"]:
            q = grafana_flux(t["query"], tel["bucket"], "-", tel["start"], tel["stop"], window_s)
            rows += [r.values for table in c.query_api().query(q, org="-") for r in table.records]
    return rows


@pytest.mark.parametrize(
    ("title", "field"),
    [
        ("Link utilisation", "utilization"),
        ("Hop latency", "latency_ns"),
        ("Queue occupancy", "queue_occupancy"),
    ],
)
def test_link_panels_show_a_series_per_link(
    telemetry: dict[str, Any], title: str, field: str
) -> None:
    rows = run_panel(telemetry, title)
    assert rows and {r["_field"] for r in rows} == {field}
    links = {(r["switch"], r["port"]) for r in rows}
    assert len(links) >= 4, links  # the generator's leaf-spine has more links than switches
    assert all(isinstance(r["_value"], float) for r in rows)
    if field == "utilization":
        assert all(0.0 <= r["_value"] <= 1.0 for r in rows)


def test_report_loss_table_gives_the_lost_fraction_per_switch(telemetry: dict[str, Any]) -> None:
    rows = {r["switch"]: r for r in run_panel(telemetry, "Report loss per switch")}
    gap = rows[str(GAP_SWITCH)]
    assert (gap["received"], gap["lost"]) == (6, 4)
    assert gap["loss"] == pytest.approx(4 / 10)
    others = [r for k, r in rows.items() if k != str(GAP_SWITCH)]
    assert others and all(r["lost"] == 0 and r["loss"] == 0.0 for r in others)
    losses = [r["loss"] for r in run_panel(telemetry, "Report loss per switch")]
    assert losses == sorted(losses, reverse=True)


def test_reports_lost_per_interval_add_up_to_the_count(telemetry: dict[str, Any]) -> None:
    rows = run_panel(telemetry, "Reports lost per switch", window_s=0.1)
    gap = [r["_value"] for r in rows if r["switch"] == str(GAP_SWITCH)]
    assert gap and all(v >= 0 for v in gap)
    # The increases after the switch's first point add up to its last count (4 lost).
    q = (
        f'from(bucket: "{telemetry["bucket"]}") |> range(start: 0)'
        f' |> filter(fn: (r) => r._measurement == "int_reports" and r._field == "lost"'
        f' and r.switch == "{GAP_SWITCH}") |> first()'
    )
    with InfluxDBClient(url=telemetry["server"].url, token="", org="-") as c:
        (first,) = [r.get_value() for t in c.query_api().query(q, org="-") for r in t.records]
    assert sum(gap) == 4 - first


def test_decision_panels_show_each_applied_placement(telemetry: dict[str, Any]) -> None:
    table = run_panel(telemetry, "Placement decisions")
    assert [r["job"] for r in table] == ["job-b", "job-a"]  # newest first
    a = table[1]
    assert (a["strategy"], a["trigger"], a["aggregators"], a["switches"]) == (
        "agg",
        "api",
        2,
        "s1,s2",
    )
    assert a["predicted_cct_s"] == 0.42
    series = run_panel(telemetry, "Predicted completion time per job")
    assert {(r["job"], r["_value"]) for r in series} == {("job-a", 0.42), ("job-b", 1.5)}
