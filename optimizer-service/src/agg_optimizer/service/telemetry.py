"""Latest per-link INT state from InfluxDB (schema: docs/telemetry-schema.md), as the
optimizer's `Telemetry`.

The Flux query uses only functions present in Flux 0.65 (InfluxDB 1.8) and 2.x. The INT
switch id of an ONOS device comes from `int_switch_ids`; the port tag is the ONOS port of the
link's source.
A link whose newest point is older than `stale_s` is stale: left out of the snapshot, so the
model uses its documented no-data default (idle), and listed as stale.
The utilisation the model gets is the port's minus the share in-network aggregation takes
(`aggregation_share`): the placed jobs' own streams are not congestion to route them around
(the service re-places the jobs of a strategy together; the simulator's INT observer leaves
out the re-placed jobs' classes the same way).

A port may have several series: one per queue, and one per collector where several write the
bucket (tag `collector`, docs/collector.md "Several collectors"), each from the reports its
own sinks sent. They are merged per link: utilisation from byte counts
(`utilization_from_bytes`) is each series' share of the port's packets and adds up; the
switch's own tx utilisation, latency, queue and aggregation share are weighted by the hops
each series saw in the window. A series older than `stale_s` takes no part.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from influxdb_client import InfluxDBClient, Point, WritePrecision
from influxdb_client.client.write_api import SYNCHRONOUS

from agg_optimizer.model.documents import LinkTelemetry, Telemetry, Topology


class InfluxUnavailable(RuntimeError):
    pass


LINK_FIELDS = ("utilization", "latency_ns", "queue_occupancy", "aggregation_share")


def latest_links_flux(bucket: str, window_s: int) -> str:
    """The newest value of every field of every series, and each series' hops in the window
    (`_field` "hops_in_window", no `_time`)."""
    latest = " or ".join(f'r._field == "{f}"' for f in (*LINK_FIELDS, "utilization_from_bytes"))
    return (
        f'data = from(bucket: "{bucket}")\n'
        f"  |> range(start: -{int(window_s)}s)\n"
        '  |> filter(fn: (r) => r._measurement == "int_link")\n'
        f"latest = data\n  |> filter(fn: (r) => {latest})\n  |> last()\n"
        'hops = data\n  |> filter(fn: (r) => r._field == "samples")\n  |> sum()\n'
        '  |> map(fn: (r) => ({r with _field: "hops_in_window"}))\n'
        "union(tables: [latest, hops])\n"
        '  |> keep(columns: ["_time", "_field", "_value", "switch", "port", "queue",'
        ' "collector"])\n'
    )


def int_switch_ids(devices: Mapping[str, Any]) -> dict[str, str]:
    """INT switch id (decimal string) → ONOS device id.

    In order: a device annotation `intSwitchId`; the number of a `null:`/`of:` device id
    (hex); the `device_id=N` of a bmv2 management address when no other device shares it
    (each bmv2 has its own gRPC server, so N is often 1 everywhere and then means nothing).
    """
    out: dict[str, str] = {}
    by_mgmt: dict[str, list[str]] = {}
    for d in devices.get("devices", []):
        ann = d.get("annotations") or {}
        if ann.get("intSwitchId"):
            out[str(ann["intSwitchId"])] = d["id"]
            continue
        m = re.match(r"^(?:null|of):([0-9a-fA-F]+)$", str(d.get("id", "")))
        if m:
            out[str(int(m.group(1), 16))] = d["id"]
            continue
        m = re.search(r"device_id=(\d+)", str(ann.get("managementAddress", "")))
        if m:
            by_mgmt.setdefault(m.group(1), []).append(d["id"])
    for sid, ids in by_mgmt.items():
        if len(ids) == 1 and sid not in out:
            out[sid] = ids[0]
    return out


def _merge(series: list[dict[str, Any]]) -> dict[str, float]:
    """One link's fields from its series (queues, collectors): see the module docstring."""
    if len(series) == 1:
        return {k: v for k, v in series[0].items() if k in LINK_FIELDS}
    out: dict[str, float] = {}
    weight = [max(1.0, float(p.get("hops_in_window") or 0)) for p in series]
    partial = [p for p in series if p.get("utilization_from_bytes") and "utilization" in p]
    if partial:
        out["utilization"] = sum(float(p["utilization"]) for p in partial)
    for f in LINK_FIELDS:
        if f == "utilization" and partial:
            continue
        have = [(float(p[f]), w) for p, w in zip(series, weight, strict=True) if f in p]
        if have:
            out[f] = sum(v * w for v, w in have) / sum(w for _, w in have)
    return out


@dataclass
class Snapshot:
    telemetry: Telemetry
    stale: list[dict[str, Any]] = field(default_factory=list)
    unmapped: int = 0
    rows: int = 0


class TelemetryReader:
    def __init__(
        self, url: str, token: str, org: str, bucket: str, window_s: int, stale_s: float
    ) -> None:
        self.client = InfluxDBClient(url=url, token=token, org=org, timeout=5_000)
        self.org = org
        self.bucket = bucket
        self.window_s = window_s
        self.stale_s = stale_s

    def close(self) -> None:
        self.client.close()

    def ping(self) -> bool:
        try:
            return bool(self.client.ping())
        except Exception:
            return False

    def rows(self) -> list[dict[str, Any]]:
        try:
            tables = self.client.query_api().query(
                latest_links_flux(self.bucket, self.window_s), org=self.org
            )
        except Exception as e:
            raise InfluxUnavailable(f"InfluxDB query failed: {type(e).__name__}: {e}") from None
        return [rec.values for t in tables for rec in t.records]

    def snapshot(
        self, topo: Topology, devices: Mapping[str, Any], now: datetime | None = None
    ) -> Snapshot:
        now = now or datetime.now(UTC)
        by_int = int_switch_ids(devices)
        port_to_link: dict[tuple[str, str], str] = {}
        for ln in topo.links:
            if ln.src_port is not None:
                port_to_link[(ln.src, str(ln.src_port))] = ln.dst
            if ln.dst_port is not None:
                port_to_link[(ln.dst, str(ln.dst_port))] = ln.src
        # link -> (queue, collector) -> that series' newest fields, time, hops in the window
        parts: dict[tuple[str, str], dict[tuple[Any, Any], dict[str, Any]]] = {}
        rows = self.rows()
        unmapped = 0
        for r in rows:
            dev = by_int.get(str(r.get("switch")))
            peer = port_to_link.get((dev, str(r.get("port")))) if dev else None
            if peer is None:
                unmapped += 1
                continue
            p = parts.setdefault((dev, peer), {}).setdefault(
                (r.get("queue"), r.get("collector")), {"time": None}
            )
            p[r["_field"]] = r["_value"]
            if r.get("_time") is not None:
                p["time"] = r["_time"] if p["time"] is None else max(p["time"], r["_time"])
        links, stale = [], []
        for (src, dst), series in sorted(parts.items()):
            timed = [p for p in series.values() if p["time"] is not None]
            if not timed:
                continue
            newest = max(p["time"] for p in timed)
            age = (now - newest).total_seconds()
            if age > self.stale_s:
                stale.append({"src": src, "dst": dst, "age_s": round(age, 3)})
                continue
            m = _merge([p for p in timed if (now - p["time"]).total_seconds() <= self.stale_s])
            util = min(1.0, max(0.0, float(m.get("utilization", 0.0))))
            own = min(1.0, max(0.0, float(m.get("aggregation_share", 0.0))))
            links.append(
                LinkTelemetry(
                    src=src,
                    dst=dst,
                    utilization=util * (1.0 - own),
                    queue_bytes=max(0.0, float(m.get("queue_occupancy", 0.0))),
                    latency_us=max(0.0, float(m.get("latency_ns", 2000.0)) / 1000.0),
                )
            )
        return Snapshot(Telemetry(links=links), stale, unmapped, len(rows))

    def write_decision(
        self, bucket: str, job: str, strategy: str, switches: list[str], cct_s: float, why: str
    ) -> None:
        p = (
            Point("placement_decision")
            .tag("job", job)
            .tag("strategy", strategy)
            .tag("trigger", why)
            .field("switches", ",".join(switches))
            .field("aggregators", len(switches))
            .field("predicted_cct_s", float(cct_s))
            .time(datetime.now(UTC), WritePrecision.NS)
        )
        try:
            with self.client.write_api(write_options=SYNCHRONOUS) as w:
                w.write(bucket=bucket, org=self.org, record=p)
        except Exception as e:
            raise InfluxUnavailable(f"InfluxDB write failed: {type(e).__name__}") from None
