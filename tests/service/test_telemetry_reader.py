"""The service's view of INT from a real InfluxDB: the utilisation the model gets leaves out
the share of in-network aggregation (the placed jobs' own streams)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from influxdb_client import InfluxDBClient, Point
from influxdb_client.client.write_api import SYNCHRONOUS

from agg_optimizer.demo.live import LeafSpine
from agg_optimizer.model.topology import from_onos
from agg_optimizer.service.telemetry import TelemetryReader
from int_collector.influxd import InfluxServer


def test_utilisation_minus_the_aggregation_share(influx: InfluxServer, bucket: str) -> None:
    devices, links, hosts = LeafSpine(2, 2, 1).json()
    topo = from_onos(devices, links, hosts)
    # s1 is INT switch 1; its port 2 goes to l2 (LeafSpine: spine port i -> leaf i).
    rows = [
        ("1", "2", {"utilization": 0.8, "aggregation_share": 0.25}),  # s1 -> l2
        ("1", "1", {"utilization": 0.6}),  # s1 -> l1: no flow in the reports, no share
    ]
    with InfluxDBClient(url=influx.url, token="", org="-") as c:
        w = c.write_api(write_options=SYNCHRONOUS)
        for switch, port, fields in rows:
            p = Point("int_link").tag("switch", switch).tag("port", port)
            for k, v in fields.items():
                p = p.field(k, v)
            w.write(bucket=bucket, org="-", record=p.time(datetime.now(UTC)))
    reader = TelemetryReader(influx.url, "", "-", bucket, 300, 60)
    try:
        snap = reader.snapshot(topo, devices)
    finally:
        reader.close()
    util = {(t.src, t.dst): t.utilization for t in snap.telemetry.links}
    assert util[("device:s1", "device:l2")] == pytest.approx(0.8 * 0.75)
    assert util[("device:s1", "device:l1")] == pytest.approx(0.6)
