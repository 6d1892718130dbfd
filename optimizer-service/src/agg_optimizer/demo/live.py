"""A simulated fabric that behaves, to the rest of the system, like the real one: the fabric
`make demo` closes the loop on where ONOS and bmv2 are missing.

- **Northbound = ONOS's REST API** (`onos_rest.OnosRest`, the subset the service uses,
  parity-checked against a real ONOS 2.7): devices, links and hosts of a leaf-spine; the
  service's intents and the aggregation app's resource. What the service applies there is
  what the fabric does: each worker's stream follows its intent's waypoints, and the
  switches the aggregation resource names sum the job's streams.
- **Data plane = the flow-level simulator** (`core.Simulator`, max-min fair sharing) running
  in wall-clock time, with the training jobs of `training.Cluster` (iterations of compute
  then streaming aggregation with slot pools). A placement change takes effect at the job's
  next iteration, as a real job would pick it up.
- **Telemetry = real INT reports over UDP** (Telemetry Report v2.0 carrying INT-MD v2.1,
  encoded by `int_collector.wire`) sent to a collector every `report_interval_s`: for each
  switch egress port, `samples` single-hop reports, as a switch sampling packets would send,
  with the port's tx utilisation, an M/M/1 queue estimate (`observe.py`) and the hop latency
  it implies. The sampled packets are drawn in proportion to the bytes of each traffic class
  on the port (stratified), so the fraction of reports whose flow uses the aggregation
  protocol's UDP port estimates the share of the port that aggregation traffic takes.
- **Congestion = background flows** (`add_hotspot`): long flows between hosts pinned through
  one link, as another tenant's bulk transfer would be.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agg_optimizer.demo.onos_rest import OnosRest
from agg_optimizer.model.documents import Instance, JobPlacement, Link, Node, Placement, Topology
from agg_optimizer.model.topology import from_onos
from agg_optimizer.sim.core import AGGREGATION, BACKGROUND, Flow, Simulator
from agg_optimizer.sim.fabric import Fabric
from agg_optimizer.sim.observe import BUFFER_BYTES, MAX_UTIL_FOR_QUEUE, PACKET_BYTES, IntObserver
from agg_optimizer.sim.training import Cluster, IterationRecord, JobSpec

log = logging.getLogger(__name__)

AGG_UDP_PORT = 48879  # the aggregation protocol's port (p4/include/defines.p4, agg_agent)
BACKGROUND_UDP_PORT = 5001
# What each hop carries: node id, ports, hop latency, queue, ingress and egress timestamps,
# tx utilisation (INT-MD v2.1 instruction bits 0-5 and 7).
INT_BITMAP = 0xFD00


def _mac(n: int) -> str:
    return ":".join(f"{b:02x}" for b in n.to_bytes(6, "big"))


def host_ips(topo: Topology) -> dict[str, str]:
    """Host node id -> the IP `onos_json` gives it: the id if it is an IPv4 address, else
    10.<n / 65536>.<n / 256 % 256>.<n % 256>, n its position among the hosts (from 1)."""
    out = {}
    for n, h in enumerate((x.id for x in topo.nodes if x.kind == "host"), 1):
        ip4 = re.fullmatch(r"\d+\.\d+\.\d+\.\d+", h)
        out[h] = h if ip4 else f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}"
    return out


def onos_json(topo: Topology) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """ONOS's `/devices`, `/links` and `/hosts` for a topology document: switch `x` is
    `device:x` with INT switch id = its position (annotation `intSwitchId`), ports numbered
    from 1 in link order; host number n (position among hosts, from 1) has MAC n and IP
    10.<n / 65536>.<n / 256 % 256>.<n % 256> unless the node id is already an IPv4 address."""
    kind = {n.id: n.kind for n in topo.nodes}
    switches = [n.id for n in topo.nodes if n.kind == "switch"]
    dev = {s: f"device:{s}" for s in switches}
    next_port = dict.fromkeys(switches, 1)

    def port(s: str) -> str:
        p = next_port[s]
        next_port[s] = p + 1
        return str(p)

    devices = [
        {"id": dev[s], "type": "SWITCH", "available": True, "role": "MASTER", "driver": "bmv2",
         "annotations": {"name": s, "intSwitchId": str(i)}}
        for i, s in enumerate(switches, start=1)
    ]  # fmt: skip
    links, hosts = [], []
    ips = host_ips(topo)
    host_no = {h: i for i, h in enumerate(ips, 1)}
    for ln in topo.links:
        a, b = ln.src, ln.dst
        if kind[a] == "host" or kind[b] == "host":
            h, s = (a, b) if kind[a] == "host" else (b, a)
            n = host_no[h]
            mac = _mac(n).upper()
            ip = ips[h]
            hosts.append(
                {"id": f"{mac}/None", "mac": mac, "vlan": "None", "ipAddresses": [ip],
                 "locations": [{"elementId": dev[s], "port": port(s)}]}
            )  # fmt: skip
            continue
        pa, pb = port(a), port(b)
        for (x, px), (y, py) in (((a, pa), (b, pb)), ((b, pb), (a, pa))):
            links.append(
                {"src": {"device": dev[x], "port": px}, "dst": {"device": dev[y], "port": py},
                 "type": "DIRECT", "state": "ACTIVE"}
            )  # fmt: skip
    return {"devices": devices}, {"links": links}, {"hosts": hosts}


@dataclass
class LeafSpine:
    """A leaf-spine whose ONOS JSON names spines `device:s<i>` and leaves `device:l<i>`
    (from 1), and host j of leaf i `10.0.<i>.<j>`; the spines come first, so spine i has
    INT switch id i."""

    spines: int = 2
    leaves: int = 4
    hosts_per_leaf: int = 2

    def topology(self) -> Topology:
        nodes = [Node(id=f"s{i}", kind="switch") for i in range(1, self.spines + 1)]
        links = []
        for li in range(1, self.leaves + 1):
            nodes.append(Node(id=f"l{li}", kind="switch"))
            links += [Link(src=f"l{li}", dst=f"s{si}") for si in range(1, self.spines + 1)]
            for j in range(1, self.hosts_per_leaf + 1):
                nodes.append(Node(id=f"10.0.{li}.{j}", kind="host"))
                links.append(Link(src=f"10.0.{li}.{j}", dst=f"l{li}"))
        return Topology(nodes=nodes, links=links)

    def json(self) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        return onos_json(self.topology())


@dataclass
class Change:
    """Something the service applied through the southbound API, when it arrived."""

    t: float  # seconds since the fabric started
    job: str
    aggregators: list[str]
    kind: str = "aggregation"


@dataclass
class Hotspot:
    link: tuple[str, str]
    start_s: float
    end_s: float | None = None
    flows: list[Flow] = field(default_factory=list)


class LiveFabric:
    def __init__(
        self,
        shape: LeafSpine | None = None,
        *,
        collector: tuple[str, int] = ("127.0.0.1", 32766),
        capacity_gbps: float = 10.0,
        report_interval_s: float = 0.1,
        samples: int = 10,
        slots: int = 512,
        pool_slots: int = 64,
        tick_s: float = 0.01,
        seed: int = 0,
    ) -> None:
        self.shape = shape or LeafSpine()
        devices, links, hosts = self.shape.json()
        self.rest = OnosRest(devices, links, hosts, aggregation=True, on_change=self._changed)
        self.topology: Topology = from_onos(devices, links, hosts, capacity_gbps=capacity_gbps)
        self.fabric = Fabric.from_topology(self.topology)
        self.sim = Simulator(self.fabric, n_classes=2)
        self.observer = IntObserver(self.sim)
        self.cluster = Cluster(
            self.sim, self.observer, self._applied, slots=slots, pool_slots=pool_slots,
            replace_every=1, scheduler=self._classes,
        )  # fmt: skip
        self.int_id = {d["id"]: int(d["annotations"]["intSwitchId"]) for d in devices["devices"]}
        self.port: dict[tuple[str, str], int] = {}
        for ln in self.topology.links:
            if ln.src_port is not None:
                self.port[(ln.src, ln.dst)] = ln.src_port
            if ln.dst_port is not None:
                self.port[(ln.dst, ln.src)] = ln.dst_port
        self.ips = {h["id"]: h["ipAddresses"][0] for h in hosts["hosts"]}
        self.by_mac = {h["mac"].lower(): h["id"] for h in hosts["hosts"]}
        self.collector = collector
        self.report_interval = report_interval_s
        self.samples = max(1, samples)
        self.tick = tick_s
        self.rng = np.random.default_rng(seed)
        self.lock = threading.RLock()
        self.specs: dict[str, JobSpec] = {}
        self.started: set[str] = set()
        self.aggregation: dict[str, list[str]] = {}
        self.classes: dict[str, int] = {}  # job -> traffic class, from the app's resource
        self.class_log: list[tuple[float, str, int | None]] = []  # (t, job, class or None)
        self.changes: list[Change] = []
        self.hotspots: list[Hotspot] = []
        self.link_log: list[tuple[float, dict[tuple[str, str], tuple[float, float]]]] = []
        self.listeners: list[Callable[[str, Any], None]] = []
        self._t0 = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._seq = itertools.count()
        self._last_bytes = np.zeros_like(self.sim.link_bytes)
        self._last_report = 0.0
        self.reports_sent = 0

    # --- lifecycle ----------------------------------------------------------------------

    @property
    def onos_url(self) -> str:
        return self.rest.url

    def now(self) -> float:
        return time.monotonic() - self._t0

    def _catch_up(self) -> float:
        """Run the simulator up to the wall clock and return that time. Every event
        (congestion, placement, class) is stamped with it and takes effect in the simulator
        at it: one clock, even when the simulator thread lags on a loaded machine (it
        stamped the wall clock and started flows at the simulator's earlier time before)."""
        with self.lock:
            t = max(self.sim.t, self.now())
            self.sim.run(until=t)
            return self.sim.t

    def start(self) -> LiveFabric:
        from agg_optimizer.sim.fairshare import warm

        warm()  # compiled (or loaded) before the clock starts, never mid-run
        self.rest.start()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="live-fabric", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(5)
        self.rest.stop()
        if self._sock:
            self._sock.close()

    def _emit(self, kind: str, what: Any) -> None:
        for fn in self.listeners:
            fn(kind, what)

    # --- jobs ---------------------------------------------------------------------------

    def add_job(self, spec: JobSpec) -> None:
        """A job that starts iterating once the service has applied its placement."""
        with self.lock:
            self.specs[spec.id] = spec

    def records(self) -> list[IterationRecord]:
        with self.lock:
            return list(self.cluster.records)

    def _classes(self, cluster: Cluster) -> dict[str, int]:
        """The switches' strict priority: each running job's class as the service last
        wrote it (0, with the background, until it does)."""
        return {jid: self.classes.get(jid, 0) for jid in cluster.jobs}

    def _changed(self, kind: str, key: str, body: Any) -> None:
        if kind == "priority":
            with self.lock:
                if body is None:
                    self.classes.pop(key, None)
                else:
                    self.classes[key] = int(body["priority_class"])
                t = self._catch_up()
                self.cluster.reprioritise()  # flows in flight move at once, as queues do
                self.class_log.append((t, key, self.classes.get(key)))
            self._emit("priority", self.class_log[-1])
            return
        if kind != "aggregation":
            return
        with self.lock:
            t = self._catch_up()
            if body is None:
                self.aggregation.pop(key, None)
                self.changes.append(Change(t, key, [], "removed"))
                return
            aggs = [a["switch"] for jp in body.get("jobs", []) for a in jp.get("aggregators", [])]
            self.aggregation[key] = aggs
            self.changes.append(Change(t, key, aggs))
            spec = self.specs.get(key)
            if spec is not None and key not in self.started:
                self.started.add(key)
                spec.arrival_s = self.sim.t
                self.cluster.submit([spec])
        self._emit("placement", self.changes[-1])

    def _paths(self, job: str, ps: str) -> dict[str, list[str]]:
        """Each worker's path from the job's intents (worker → PS, waypoints = every switch)."""
        out = {}
        with self.rest.lock:
            intents = list(self.rest.intents.values())
        for body in intents:
            key = str(body.get("key", ""))
            if not key.startswith(f"ia-{job}-") or key.endswith("-ack"):
                continue
            macs = {c["type"]: c["mac"].lower() for c in body["selector"]["criteria"]}
            worker = self.by_mac.get(macs.get("ETH_SRC", ""))
            if worker is None or self.by_mac.get(macs.get("ETH_DST", "")) != ps:
                continue
            way = [w for c in body.get("constraints", []) for w in c.get("waypoints", [])]
            out[worker] = [worker, *way, ps]
        return out

    def _applied(self, inst: Instance) -> Placement:
        """The `Cluster`'s placer: what the service applied, read from the southbound state."""
        jobs = []
        for j in inst.jobs:
            paths = self._paths(j.id, j.ps)
            for w in j.workers:  # no intent (yet): the fabric's default route
                if w not in paths:
                    paths[w] = self.fabric.ecmp_path(w, j.ps, self.rng)
            aggs = [a for a in self.aggregation.get(j.id, []) if a in self.cluster.free]
            jobs.append(
                JobPlacement.model_construct(
                    job_id=j.id,
                    aggregators=[_Agg(a) for a in aggs],
                    worker_paths=paths,
                    ps_fan_in=0,
                    predicted_cct_s=0.0,
                    surrogate_s=0.0,
                )
            )
        return Placement.model_construct(strategy="applied", jobs=jobs)

    # --- congestion ---------------------------------------------------------------------

    def add_hotspot(self, link: tuple[str, str], flows: int = 4) -> Hotspot:
        """`flows` long background flows pinned through the directed switch link `link`,
        each from a host of the link's source side to a host of its destination side."""
        with self.lock:
            a, b = link
            src = self._host_behind(a, avoid=b)
            dst = self._host_behind(b, avoid=a)
            path = [src, *self._switch_path(src, a), *self._switch_path(dst, b)[::-1], dst]
            path = list(dict.fromkeys(path))
            idx = np.array(self.fabric.path_links(path))
            hs = Hotspot(link, self._catch_up())
            for _ in range(flows):
                f = Flow(idx, np.ones(len(idx)), float("inf"), BACKGROUND)
                hs.flows.append(self.sim.add(f))
            self.hotspots.append(hs)
        self._emit("hotspot", hs)
        return hs

    def end_hotspot(self, hs: Hotspot) -> None:
        with self.lock:
            hs.end_s = self._catch_up()
            for f in hs.flows:
                self.sim.remove(f)
        self._emit("hotspot-end", hs)

    def _host_behind(self, switch: str, avoid: str) -> str:
        """A host whose switch path to `switch` does not cross `avoid`: one of its own, or
        one on a leaf reached without `avoid`."""
        racks = self.fabric.racks()
        if racks.get(switch):
            return racks[switch][-1]
        for leaf, hosts in racks.items():
            if leaf != avoid and self.fabric.switch_graph.has_edge(leaf, switch):
                return hosts[-1]
        raise ValueError(f"hotspot: no host behind {switch}")

    def _switch_path(self, host: str, switch: str) -> list[str]:
        leaf = self.fabric.attach[host]
        return [leaf] if leaf == switch else [leaf, switch]

    # --- the clock and INT --------------------------------------------------------------

    def _run(self) -> None:
        next_report = self.report_interval
        while not self._stop.is_set():
            now = self.now()
            with self.lock:
                self.sim.run(until=now)
            if now >= next_report:
                self._report(now)
                next_report = now + self.report_interval
            self._stop.wait(self.tick)

    def link_state(self) -> dict[tuple[str, str], tuple[float, float]]:
        """Utilisation and aggregation share per directed switch egress over the last
        report interval."""
        return self.link_log[-1][1] if self.link_log else {}

    def _report(self, now: float) -> None:
        with self.lock:
            moved = self.sim.link_bytes - self._last_bytes
            self._last_bytes = self.sim.link_bytes.copy()
            span = max(1e-6, now - self._last_report)
            self._last_report = now
        total = moved.sum(axis=0)
        util = np.clip(total * 8.0 / (self.sim.capacity * span), 0.0, 1.0)
        state = {}
        datagrams = []
        for i, (u, v) in enumerate(self.fabric.links):
            if u not in self.int_id:
                continue  # a host's uplink: no switch egress reports it
            share = float(moved[AGGREGATION, i] / total[i]) if total[i] > 0 else 0.0
            state[(u, v)] = (float(util[i]), share)
            datagrams += self._datagrams(u, v, float(util[i]), share)
        self.link_log.append((now, state))
        assert self._sock is not None
        for d in datagrams:
            # The collector not up yet: the report is lost, as on a wire.
            with contextlib.suppress(OSError):
                self._sock.sendto(d, self.collector)
        self.reports_sent += len(datagrams)

    def _datagrams(self, u: str, v: str, util: float, share: float) -> list[bytes]:
        from int_collector.wire import Flow as IntFlow
        from int_collector.wire import Hop, int_md_v2, report_v2, udp_int_packet

        node = self.int_id[u]
        cap = self.sim.capacity[self.fabric.index[(u, v)]]
        q = min(PACKET_BYTES * min(util, MAX_UTIL_FOR_QUEUE) / (1 - min(util, MAX_UTIL_FOR_QUEUE)),
                BUFFER_BYTES)  # fmt: skip
        latency = int(800 + q * 8 / cap * 1e9)
        clock = time.time_ns()
        n_agg = round(self.samples * share)
        out = []
        for k in range(self.samples):
            agg = k < n_agg
            hop = Hop(
                node_id=node,
                ingress_port=1,
                egress_port=self.port[(u, v)],
                hop_latency=latency,
                queue_id=0,
                queue_occupancy=int(q),
                ingress_ts=clock,
                egress_ts=clock + latency,
                tx_utilization=int(util * 1_000_000),
            )
            flow = IntFlow(
                bytes([10, 0, node, 1]),
                bytes([10, 0, node, 2]),
                17,
                40000 + k,
                AGG_UDP_PORT if agg else BACKGROUND_UDP_PORT,
            )
            inner = udp_int_packet(flow, int_md_v2(INT_BITMAP, [hop], remaining_hop_count=7))
            out.append(report_v2(node, next(self._seq), inner))
        return out


@dataclass
class _Agg:
    """The one field of `Aggregator` the cluster reads."""

    switch: str
