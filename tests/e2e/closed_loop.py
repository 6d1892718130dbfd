"""The closed loop on real parts: bmv2 switches under the real ONOS 2.7, INT reports to the
real `int-collector`, the real InfluxDB, the optimizer service (`agg-optimizer serve`, its
control loop on), and a training job of the host agent through the fabric.

Fabric (`TOPOLOGY`): two spines and three leaves of `simple_switch_grpc`; every egress queue
of every switch drains at `rate_pps` (`simple_switch_CLI set_queue_rate`), which is the
emulated line rate, and holds `QUEUE_DEPTH` packets. The job: workers on lf1 and lf2, PS on
lf3, so its tree meets at a spine, where it aggregates. Background traffic from lf1 to lf3,
pinned through a chosen spine by an intent of another application, congests that spine's
lf1 uplink and its lf3 downlink: both on the job's tree when the job uses that spine.

Telemetry: ONOS's INT app watches the background (UDP `BG_PORT`) with node ID, ports, hop
latency, queue occupancy and egress timestamps; the leaves' reports leave by a port of
their own (`intReportPort`) to the collector in the root namespace. The collector derives
utilisation from the reported bytes over egress-timestamp time at `link_speed_bps` = the
emulated line rate in bits. Why the job itself is not watched: docs/e2e.md.

`ClosedLoop.episode(spine)` congests `spine` and waits for the service to move the job;
`timeline()` gathers what happened from the workers, the service, InfluxDB and a sniffer on
the leaf uplinks (which spine carried the job's packets when).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import select
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from agg_optimizer.service import onosd
from agg_optimizer.service.onos import intent_key
from int_collector import children
from int_collector.influxd import InfluxServer
from p4 import bmv2

from .fabric import Fabric

TRAINER = str(Path(__file__).with_name("trainer.py"))
BIN = Path(sys.executable).parent
INT_APP = "org.onosproject.inbandtelemetry"
BG_APP = "org.innetagg.e2e.background"
GLOO_APP = "org.innetagg.e2e.gloo"  # the PyTorch job's own TCP between its workers
MASTER_PORT = 29500  # rank 0's torch.distributed store
AGENT = ["python", "-c", "from agg_agent.cli import main; main()"]
SERVICE_APP = "org.innetagg.e2e.loop"  # the service's intents, apart from other tests'
BG_PORT = 5001
AGG_PORT = 48879
REPORT_PORT = 9
QUEUE_DEPTH = 32
JOB = "e2e-loop"
SPINES = ("sp1", "sp2")
WORKERS = {1: "lf1", 2: "lf2"}  # host -> leaf
PS, BG_SRC, BG_DST = 3, 4, 5
TOPOLOGY = dict(
    switches=["sp1", "sp2", "lf1", "lf2", "lf3"],
    links=[
        (leaf, sp, spine, n)
        for n, leaf in enumerate(("lf1", "lf2", "lf3"), 1)
        for sp, spine in enumerate(SPINES, 1)
    ],
    hosts={1: ("lf1", 3), 2: ("lf2", 3), PS: ("lf3", 3), BG_SRC: ("lf1", 4), BG_DST: ("lf3", 4)},
    report_ports={leaf: REPORT_PORT for leaf in ("lf1", "lf2", "lf3")},
    annotations={leaf: {"intReportPort": str(REPORT_PORT)} for leaf in ("lf1", "lf2", "lf3")},
)
# IP total length of a background packet as the sink reports it: 20 IP + 8 UDP + payload,
# 16 of INT shim and header, and 3 hops of 6 words (node, ports, latency, queue, 2 of
# egress timestamp).
BG_PAYLOAD = 144
BG_REPORTED_BYTES = 20 + 8 + BG_PAYLOAD + 16 + 3 * 24
INT_METADATA = ["SWITCH_ID", "L1_PORT_ID", "HOP_LATENCY", "QUEUE_OCCUPANCY", "EGRESS_TIMESTAMP"]


@dataclass
class Params:
    rate_pps: int = 250  # emulated line rate of every port
    bg_factor: float = 1.5  # background offered at this multiple of the line rate
    loop_period_s: float = 0.1
    stale_s: float = 2.0
    utilization_threshold: float = 0.1
    size: int = 512  # tensor elements per iteration: 16 chunks
    window: int = 8
    timeout_ms: float = 300.0
    watch: str = "background"  # or "all": INT watches every UDP flow, the job's too
    collector_tick_s: float = 0.05
    collector_flush_s: float = 0.05
    collector_keepalive_s: float = 0.5
    utilization_window_ms: float = 20.0
    episodes: int = 8
    # The synthetic job trains from the start (`train_ddp` kills it and restarts the job on
    # its number); False: no job runs until `train_ddp`.
    synthetic: bool = True
    queue_depth: int = QUEUE_DEPTH


@dataclass
class Episode:
    spine: str
    t_start: float
    t_end: float = 0.0
    t_onos: float | None = None  # every intent of the job INSTALLED through another spine
    settle_s: float = 0.0


def running(
    onos: onosd.OnosServer, influx: InfluxServer, workdir: Path, p: Params, name: str
) -> Iterator[ClosedLoop]:
    """A started loop writing to a new InfluxDB database (`name` and a random suffix),
    stopped however its user ends (a module fixture's `yield from`); skipped, saying why,
    where bmv2's gRPC switch is missing."""
    import pytest

    why = bmv2.grpc_skip_reason()
    if why:
        pytest.skip(why)
    db = name + uuid.uuid4().hex[:12]
    influx.query_v1(f'CREATE DATABASE "{db}"')
    cl = ClosedLoop(onos, influx, f"{db}/autogen", workdir, p)
    cl.start()
    try:
        yield cl
    finally:
        cl.stop()


@dataclass
class DdpRun:
    """A PyTorch DDP job on the loop's worker hosts (`agg-agent train`: the digits MLP, its
    gradient buckets all-reduced by `AggregationHook` through the fabric), its parameter
    server (`agg-agent ps --iterations 0`: one iteration a step) on the loop's PS host."""

    ps: subprocess.Popen[str]
    workers: list[subprocess.Popen[str]]
    out: Path
    rows: list[dict[str, Any]] = field(default_factory=list)  # the PS's, "t": when read

    def finish(self, deadline_s: float) -> tuple[Any, list[dict[str, Any]]]:
        """Wait for every worker (a failed one ends the wait at once), then stop the PS;
        rank 0's result (`train_digits.Result`) and the PS's rows."""
        from agg_agent import train_digits as td

        deadline = time.monotonic() + deadline_s
        while any(p.poll() is None for p in self.workers):
            bad = [i for i, p in enumerate(self.workers) if p.poll() not in (None, 0)]
            assert not bad, f"rank {bad[0]} exited {self.workers[bad[0]].returncode}"
            assert time.monotonic() < deadline, f"the PyTorch job ran past {deadline_s:.0f} s"
            time.sleep(0.2)
        codes = [p.returncode for p in self.workers]
        assert codes == [0] * len(codes), codes
        children.stop(self.ps, timeout_s=30)
        return td.load(self.out), self.rows

    def stop(self) -> None:
        for p in (*self.workers, self.ps):
            children.stop(p, timeout_s=5)


@dataclass
class ClosedLoop:
    onos: onosd.OnosServer
    influx: InfluxServer
    bucket: str
    workdir: Path
    p: Params = field(default_factory=Params)

    def __post_init__(self) -> None:
        # INT node IDs of this run's own: the null providers' devices of the session's ONOS
        # claim the small numbers by their device ids (service/telemetry.py int_switch_ids),
        # and our app keeps the numbers of removed devices (its store), so fixed numbers are
        # taken from the second run on.
        base = random.randrange(1000, 60000, 10)
        ann = {
            sw: {**TOPOLOGY["annotations"].get(sw, {}), "intSwitchId": str(base + i)}  # type: ignore[attr-defined]
            for i, sw in enumerate(TOPOLOGY["switches"])  # type: ignore[arg-type]
        }
        self.fabric = Fabric(
            self.onos,
            prefix="e3",
            log_dir=self.workdir,
            **{**TOPOLOGY, "annotations": ann},  # type: ignore[arg-type]
        )
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.ddp: DdpRun | None = None
        self.iterations: list[dict[str, Any]] = []
        self.episodes: list[Episode] = []
        self.sniffer: Sniffer | None = None
        self.hosts: dict[int, dict] = {}
        self.service_url = ""
        self.collector_port = bmv2.free_port()
        self.t0 = time.time()

    # --- set-up -------------------------------------------------------------------------

    def start(self) -> None:
        try:
            self.onos.fast_readback()
            self.fabric.start()
            for sw in self.fabric.switches:
                self.fabric.cli(
                    sw, f"set_queue_rate {self.p.rate_pps}", f"set_queue_depth {self.p.queue_depth}"
                )
            self.hosts = self.fabric.announce_hosts()
            self._int()
            self._collector()
            self._service()
            self._place()
            if self.p.synthetic:
                self._train()
        except BaseException:
            self.stop()
            raise

    def _int(self) -> None:
        criteria = [{"type": "ETH_TYPE", "ethType": "0x800"}]
        if self.p.watch == "background":
            criteria.append({"type": "UDP_DST", "udpPort": BG_PORT})
        self.int_intent = {
            "selector": {"criteria": criteria},
            "metadataTypes": INT_METADATA,
            "headerType": "HOP_BY_HOP",
            "telemetryMode": "INBAND_TELEMETRY",
            "reportTypes": "TRACKED_FLOW",  # one string (docs/onos-int.md)
        }
        self.int_repairs = 0
        self._int_report(0)
        self._int_intent(self.int_intent)
        self.ensure_int(first=True)

    def _int_missing(self) -> list[str]:
        """The INT entries and groups the leaves should hold (ADDED) and do not; an ONOS
        that answers an error or not at all (seen under load: a 500 or no answer in 60 s
        to `GET /flows/{device}`) counts as all of them missing, for `ensure_int` to ask
        again until its deadline."""
        try:
            return self._int_missing_now()
        except requests.RequestException as e:
            return [f"ONOS did not answer: {e}"]

    def _int_missing_now(self) -> list[str]:
        leaves = [s.device for s in self.fabric.switches.values() if s.name.startswith("lf")]
        src = self.fabric.switches["lf1"].device

        def added(table: str, device: str) -> bool:
            return any(f["state"] == "ADDED" for f in self.onos.table_flows(table, device))

        def clone_group(device: str) -> bool:
            groups = self.onos.get(f"/groups/{device}").get("groups", [])
            return any(g["type"] == "CLONE" and g["state"] == "ADDED" for g in groups)

        out = [f"{n} on {d}" for d in leaves for n, ok in (
            ("clone group", clone_group(d)),
            ("report_collector", added(".report_collector", d)),
            ("int_sink", added(".int_sink", d)),
        ) if not ok]  # fmt: skip
        return out + ([] if added(".int_watchlist", src) else [f"int_watchlist on {src}"])

    def ensure_int(self, first: bool = False) -> None:
        """Under load ONOS 2.7's periodic mastership check gets no answer from a bmv2 in time
        ("Failed to assert role ... no response"), gives the role up and takes it again; a
        clone group or watchlist entry written in between is lost without a word, and the
        INT app does not retry (at start, and seen once mid-run: no report, no telemetry, no
        move). So every entry is checked, at start and before each episode, and asked for
        again while missing: a changed report config makes the INT app program every device
        again, and the watchlist is the INT intent's."""
        deadline = time.monotonic() + 300
        while True:
            try:
                onosd.wait_for(lambda: not self._int_missing(), 8 if first else 0.1, "INT")
                return
            except AssertionError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"INT still missing: {self._int_missing()}") from None
            first = True
            self.int_repairs += 1
            self._int_report(self.int_repairs)  # a new value: the INT app sees a change
            if any(m.startswith("int_watchlist") for m in self._int_missing()):
                self._int_intent(self.int_intent)

    def _int_intent(self, intent: dict[str, Any]) -> None:
        r = self.onos.request("GET", "/onos/int/intIntent")
        for old in r.json().get("IntIntents", []) if r.status_code == 200 else []:
            self.onos.request("DELETE", f"/onos/int/intIntent/{old['id']}")
        r = self.onos.request("POST", "/onos/int/intIntent", json=intent)
        assert r.status_code < 300, r.text

    def _int_report(self, variant: int) -> None:
        report = {
            "collectorIp": self.fabric.collector_ip,
            "collectorPort": self.collector_port,
            "minFlowHopLatencyChangeNs": variant,  # any change re-programs every device
        }
        r = self.onos.request(
            "POST", "/network/configuration", json={"apps": {INT_APP: {"report": report}}}
        )
        r.raise_for_status()

    def _collector(self) -> None:
        env = {
            **os.environ,
            "INT_COLLECTOR_LISTEN_PORT": str(self.collector_port),
            "INT_COLLECTOR_HTTP_PORT": "0",
            "INT_COLLECTOR_INFLUX_URL": self.influx.url,
            "INT_COLLECTOR_INFLUX_BUCKET": self.bucket,
            # utilisation from bytes over egress time, 100% = the emulated line rate
            "INT_COLLECTOR_LINK_SPEED_BPS": str(self.p.rate_pps * BG_REPORTED_BYTES * 8),
            "INT_COLLECTOR_UTILIZATION_WINDOW_NS": str(self.p.utilization_window_ms * 1e6),
            # points as soon as they change, written at once; a link with steady reports
            # still gets a point every keep-alive, so the service's staleness can be short
            "INT_COLLECTOR_TICK_S": str(self.p.collector_tick_s),
            "INT_COLLECTOR_FLUSH_INTERVAL_S": str(self.p.collector_flush_s),
            "INT_COLLECTOR_KEEPALIVE_S": str(self.p.collector_keepalive_s),
        }
        log = self.workdir / "collector.log"
        proc = self.procs["collector"] = children.spawn(
            [str(BIN / "int-collector"), "serve"], env=env, log=log
        )
        # The collector binds its socket at once but reads it only once its receive path is
        # loaded (compiled, on a numba cache `make sync` did not fill: 18 s idle, 40 s beside
        # ONOS and five bmv2). Reports wait in the socket meanwhile and are stamped when
        # read, so a loop started earlier saw its first congestion 20 s late. It logs
        # "listening" once every worker reads.
        children.wait_ready(
            lambda: "listening on udp" in log.read_text(), "int-collector reading its socket",
            timeout_s=900, proc=proc, log=log, say=print,
        )  # fmt: skip

    def _service(self) -> None:
        port = bmv2.free_port()
        env = {
            **os.environ,
            "AGG_OPTIMIZER_ONOS_URL": self.onos.url,
            "AGG_OPTIMIZER_ONOS_APP_ID": SERVICE_APP,
            "AGG_OPTIMIZER_INFLUX_URL": self.influx.url,
            "AGG_OPTIMIZER_INFLUX_BUCKET": self.bucket,
            "AGG_OPTIMIZER_DB_PATH": str(self.workdir / "service.sqlite"),
            "AGG_OPTIMIZER_REOPTIMIZE_PERIOD_S": str(self.p.loop_period_s),
            "AGG_OPTIMIZER_UTILIZATION_THRESHOLD": str(self.p.utilization_threshold),
            "AGG_OPTIMIZER_TELEMETRY_STALE_S": str(self.p.stale_s),
            "AGG_OPTIMIZER_TELEMETRY_WINDOW_S": "120",
            "AGG_OPTIMIZER_INTENT_WAIT_S": "30",
        }
        self.procs["service"] = children.spawn(
            [str(BIN / "agg-optimizer"), "serve", "--port", str(port)],
            env=env, log=self.workdir / "service.log",
        )  # fmt: skip
        self.service_url = f"http://127.0.0.1:{port}/api/v1"

        def ready() -> bool:
            assert self.procs["service"].poll() is None, "agg-optimizer serve exited"
            try:
                return requests.get(self.service_url + "/jobs", timeout=2).status_code == 200
            except requests.RequestException:
                return False

        onosd.wait_for(ready, 300, "the optimizer service answering")

    def api(self, method: str, path: str, **kw: Any) -> requests.Response:
        # JSON's content type even without a body: the service refuses body-less mutations
        # without it when no API token is set (a cross-site form cannot send it).
        headers = {"Content-Type": "application/json", **kw.pop("headers", {})}
        return requests.request(method, self.service_url + path, timeout=60, headers=headers, **kw)

    def _place(self) -> None:
        job = {
            "id": JOB,
            "workers": [self.hosts[h]["id"] for h in WORKERS],
            "ps": self.hosts[PS]["id"],
            "update_bytes": 10_000_000,
        }
        r = self.api("POST", "/jobs", json=job)
        assert r.status_code == 201, r.text
        res = self.api("POST", f"/jobs/{JOB}/placement").json()
        assert res["status"] == "applied" and res["aggregation"] == "applied", res
        doc = self.onos.get(f"/onos/innet-agg/aggregation/{JOB}")
        self.p4_job = int(doc["p4_job_id"])

    def _train(self) -> None:
        f = self.fabric
        self.procs["sink"] = f.run(BG_DST, ["python", TRAINER, "sink", "--port", str(BG_PORT)])
        common = ["--job", str(self.p4_job), "--size", str(self.p.size)]
        self.procs["ps"] = f.run(
            PS,
            ["python", TRAINER, "ps", *common]
            + [a for h in WORKERS for a in ("--worker-addr", f"10.0.0.{h}")],
            stdout=subprocess.DEVNULL,
            stderr=open(self.workdir / "ps.log", "w"),  # noqa: SIM115
        )
        onosd.wait_for(lambda: self._udp_listening(PS, AGG_PORT), 20, "the PS listening")
        self.sniffer = Sniffer(
            {spine: f.port_veth[("lf1", n)] for n, spine in enumerate(SPINES, 1)}, "10.0.0.1"
        )
        self.sniffer.start()
        for i, h in enumerate(WORKERS):
            p = f.run(
                h,
                [
                    *("python", TRAINER, "worker", *common, "--worker-id", str(i)),
                    *("--workers", str(len(WORKERS)), "--ps", f"10.0.0.{PS}"),
                    *("--bind", f"10.0.0.{h}", "--window", str(self.p.window)),
                    *("--timeout-ms", str(self.p.timeout_ms)),
                ],
                stdout=subprocess.PIPE,
                stderr=open(self.workdir / f"worker{i}.log", "w"),  # noqa: SIM115
            )
            self.procs[f"worker{i}"] = p
            threading.Thread(target=self._read_worker, args=(i, p), daemon=True).start()
        onosd.wait_for(lambda: len(self.iterations) >= 10, 60, "10 iterations of training")

    def stop_trainer(self) -> None:
        """The synthetic job's workers and PS; its placement, the fabric and the loop stay."""
        for name in ("worker0", "worker1", "ps"):
            p = self.procs.pop(name, None)
            if p is not None:
                children.stop(p, timeout_s=10)

    def train_ddp(self, steps: int, out: Path, lr: float = 0.1) -> DdpRun:
        """The job's processes become a PyTorch DDP job on the same hosts and placement:
        `steps` steps of the digits MLP at `lr` (rank 0's result to `out`), every gradient
        bucket through the job's aggregation tree, wherever the service has put it."""
        self.stop_trainer()
        if "sink" not in self.procs:  # the background's receiver (`_train` starts it too)
            self.procs["sink"] = self.fabric.run(
                BG_DST, ["python", TRAINER, "sink", "--port", str(BG_PORT)]
            )
        self._gloo_path()
        f, workers = self.fabric, list(WORKERS)
        ps = f.run(
            PS,
            [*AGENT, "ps", "--size", "0", "--job", str(self.p4_job),
             "--bind", f"10.0.0.{PS}:{AGG_PORT}",
             "--linger-s", str(3 * self.p.timeout_ms / 1000)]
            + [a for h in workers for a in ("--worker-addr", f"10.0.0.{h}:{AGG_PORT}")],
            stdout=subprocess.PIPE,
            stderr=open(self.workdir / "ddp-ps.log", "w"),  # noqa: SIM115
        )  # fmt: skip
        run = self.ddp = DdpRun(ps, [], out)

        def read() -> None:
            assert ps.stdout is not None
            for line in ps.stdout:
                if line.startswith("{"):
                    run.rows.append({"t": time.time(), **json.loads(line)})

        threading.Thread(target=read, daemon=True).start()
        try:
            onosd.wait_for(lambda: self._udp_listening(PS, AGG_PORT), 60, "the DDP job's PS")
            for rank, h in enumerate(workers):
                argv = [
                    *AGENT, "train", "--rank", str(rank), "--world", str(len(workers)),
                    "--master", f"10.0.0.{workers[0]}:{MASTER_PORT}", "--allreduce", "agg",
                    "--job", str(self.p4_job), "--ps", f"10.0.0.{PS}:{AGG_PORT}",
                    "--bind", f"10.0.0.{h}:{AGG_PORT}", "--window", str(self.p.window),
                    "--timeout-ms", str(self.p.timeout_ms), "--max-steps", str(steps),
                    "--epochs", "1000", "--lr", str(lr), "--out", str(out),
                ]  # fmt: skip
                log = open(self.workdir / f"ddp-rank{rank}.log", "w")  # noqa: SIM115
                run.workers.append(f.run(h, argv, stdout=log, stderr=log))
        except BaseException:
            run.stop()
            raise
        return run

    def _gloo_path(self) -> None:
        """DDP's process group (rank 0's store, the initial broadcast, the barrier at the
        end) is TCP between the workers: a host-to-host intent of its own gives it a path
        through the fabric; the gradients take the aggregation protocol's."""
        one, two = (self.hosts[h]["id"] for h in WORKERS)
        body = {"type": "HostToHostIntent", "appId": GLOO_APP, "key": "gloo",
                "priority": 40000, "one": one, "two": two}  # fmt: skip
        self.onos.request("POST", f"/applications/{GLOO_APP}/register").raise_for_status()
        r = self.onos.request("POST", "/intents", json=body)
        assert r.status_code == 201, r.text

        def installed() -> bool:
            r = self.onos.request("GET", f"/intents/{GLOO_APP}/gloo")
            return r.status_code == 200 and r.json().get("state") == "INSTALLED"

        onosd.wait_for(installed, 120, "the workers' host-to-host intent")

    def _udp_listening(self, host: int, port: int) -> bool:
        out = subprocess.run(
            ["ip", "netns", "exec", self.fabric.ns(host), "ss", "-Huln", f"sport = :{port}"],
            capture_output=True,
            text=True,
        ).stdout
        return bool(out.strip())

    def _read_worker(self, i: int, p: subprocess.Popen[str]) -> None:
        assert p.stdout is not None
        for line in p.stdout:
            self.iterations.append({"worker": i, **json.loads(line)})

    # --- the loop -----------------------------------------------------------------------

    def placement(self) -> dict[str, Any]:
        return self.api("GET", f"/jobs/{JOB}/placement").json()

    def spine_of(self, placement: dict[str, Any]) -> str:
        """The spine into the PS's leaf on the first worker's path: the one that carries the
        sum. INT-aware routing may also take a path through a leaf and both spines (a CI run
        recorded one in the placement history), so it is not always the only spine."""
        path = next(iter(placement["placement"]["worker_paths"].values()))
        return [s for s in map(self.fabric.name_of, path) if s in SPINES][-1]

    def pin_background(self, spine: str) -> None:
        """The background's intent (another application's), through `spine`."""
        dev = {s: sw.device for s, sw in self.fabric.switches.items()}
        src, dst = self.hosts[BG_SRC], self.hosts[BG_DST]
        body = {
            "type": "PointToPointIntent",
            "appId": BG_APP,
            "key": "background",
            "priority": 40000,
            "selector": {
                "criteria": [
                    {"type": "ETH_SRC", "mac": src["mac"]},
                    {"type": "ETH_DST", "mac": dst["mac"]},
                ]
            },
            "ingressPoint": {"device": dev["lf1"], "port": "4"},
            "egressPoint": {"device": dev["lf3"], "port": "4"},
            "constraints": [
                {"type": "WaypointConstraint", "waypoints": [dev["lf1"], dev[spine], dev["lf3"]]}
            ],
        }
        self.onos.request("POST", f"/applications/{BG_APP}/register").raise_for_status()
        r = self.onos.request("POST", "/intents", json=body)
        assert r.status_code == 201, r.text

        def pinned() -> bool:
            r = self.onos.request("GET", f"/intents/{BG_APP}/background")
            if r.status_code != 200 or r.json().get("state") != "INSTALLED":
                return False
            # the intent's rules on the spine (intents write ONOS's table 0, which our
            # pipeliner maps to table0): written, not only compiled
            flows = self.onos.get(f"/flows/{dev[spine]}")["flows"]
            return any(
                f["appId"] == "org.onosproject.net.intent"
                and f["state"] != "PENDING_REMOVE"
                and dst["mac"].lower() in json.dumps(f["selector"]).lower()
                for f in flows
            )

        onosd.wait_for(pinned, 120, f"the background's intent through {spine}")

    def _wait_moved(self, spine: str, timeout_s: float = 15.0) -> float | None:
        """When ONOS holds every intent of the job INSTALLED through another spine than
        `spine` (polled, not taken from the service: ONOS answers INSTALLED for the old
        version of an intent resubmitted under the same key until the new one is compiled).
        """
        keys = [
            intent_key(JOB, self.hosts[h]["mac"], ack) for h in WORKERS for ack in (False, True)
        ]
        old = self.fabric.switches[spine].device
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            moved = True
            for key in keys:
                try:
                    r = self.onos.request("GET", f"/intents/{SERVICE_APP}/{key}")
                except requests.RequestException:  # ONOS slow under load: not moved yet
                    moved = False
                    break
                body = r.json() if r.status_code == 200 else {}
                way = [w for c in body.get("constraints", []) for w in c.get("waypoints", [])]
                if body.get("state") != "INSTALLED" or not way or old in way:
                    moved = False
                    break
            if moved:
                return time.time()
            time.sleep(0.02)
        return None

    def episode(
        self, congest_s: float = 3.0, settle_s: float | None = None, pinned: str | None = None
    ) -> Episode:
        """Congest the spine the job uses now, until the service moves the job (or 15 s),
        then `congest_s` more; stop, and let the congested links' telemetry go stale.
        `pinned`: the spine the caller has already pinned the background to (its intent
        takes seconds to minutes under load, which a short job may not have)."""
        self.ensure_int()
        spine = self.spine_of(self.placement())
        if spine != pinned:
            self.pin_background(spine)
        ep = Episode(spine, time.time())
        self.episodes.append(ep)
        self.procs["background"] = self.fabric.run(
            BG_SRC,
            [
                *("python", TRAINER, "background", "--to", f"10.0.0.{BG_DST}:{BG_PORT}"),
                *("--pps", str(self.p.rate_pps * self.p.bg_factor), "--size", str(BG_PAYLOAD)),
            ],
        )
        ep.t_onos = self._wait_moved(spine)
        time.sleep(congest_s)
        bg = self.procs.pop("background")
        bg.terminate()
        bg.wait(10)
        ep.t_end = time.time()
        ep.settle_s = self.p.stale_s + 1.5 if settle_s is None else settle_s
        time.sleep(ep.settle_s)
        return ep

    # --- what happened --------------------------------------------------------------------

    def links(self) -> dict[tuple[str, str], str]:
        """(INT node ID, egress port) -> "from->to" for every link between switches."""
        ids = {
            name: self.onos.get(f"/devices/{sw.device}")["annotations"]["intSwitchId"]
            for name, sw in self.fabric.switches.items()
        }
        out = {}
        for a, pa, b, pb in self.fabric.links:
            out[(ids[a], str(pa))] = f"{a}->{b}"
            out[(ids[b], str(pb))] = f"{b}->{a}"
        return out

    def telemetry(self) -> list[dict[str, Any]]:
        db = self.bucket.split("/")[0]
        raw = self.influx.query_v1(
            f'SELECT * FROM "{db}"."autogen"."int_link" WHERE time > now() - 30m'
        )
        names = self.links()
        rows = []
        for series in json.loads(raw)["results"][0].get("series", []):
            cols = series["columns"]
            for v in series["values"]:
                r = dict(zip(cols, v, strict=True))
                link = names.get((str(r["switch"]), str(r["port"])))
                if link is None:
                    continue  # a host port
                rows.append(
                    {
                        "t": _epoch(r["time"]),
                        "link": link,
                        "utilization": r.get("utilization"),
                        "queue_occupancy": r.get("queue_occupancy"),
                        "latency_ns": r.get("latency_ns"),
                    }
                )
        return sorted(rows, key=lambda r: r["t"])

    def decisions(self) -> list[dict[str, Any]]:
        db = self.bucket.split("/")[0]
        raw = self.influx.query_v1(
            f'SELECT * FROM "{db}"."autogen"."placement_decision" WHERE time > now() - 30m'
        )
        out = []
        for series in json.loads(raw)["results"][0].get("series", []):
            cols = series["columns"]
            for v in series["values"]:
                r = dict(zip(cols, v, strict=True))
                out.append({"t": _epoch(r["time"]), "trigger": r["trigger"]})
        return out

    def placements(self) -> list[dict[str, Any]]:
        hist = self.api("GET", f"/jobs/{JOB}/placements", params={"limit": 1000}).json()
        out = []
        for h in sorted(hist, key=lambda h: h["created"]):
            out.append(
                {
                    "t": h["created"],
                    "status": h["status"],
                    "spine": self.spine_of(h),
                    "aggregators": [
                        self.fabric.name_of(a["switch"]) for a in h["placement"]["aggregators"]
                    ],
                }
            )
        return out

    def timeline(self) -> dict[str, Any]:
        tel = self.telemetry()
        placements = self.placements()
        decisions = self.decisions()
        for p in placements:  # the decision point written right after each apply
            after = [d for d in decisions if d["t"] >= p["t"] - 0.001]
            p["trigger"] = min(after, key=lambda d: d["t"])["trigger"] if after else None
        seen = self.sniffer.seen if self.sniffer else []
        episodes = []
        for ep in self.episodes:
            congested = {f"lf1->{ep.spine}", f"{ep.spine}->lf3"}
            cross = next(
                (
                    r
                    for r in tel
                    if r["t"] >= ep.t_start
                    and r["link"] in congested
                    and (r["utilization"] or 0.0) >= self.p.utilization_threshold
                ),
                None,
            )
            moved = next(
                (
                    p
                    for p in placements
                    if p["t"] >= ep.t_start and p["spine"] != ep.spine and p["status"] == "applied"
                ),
                None,
            )
            data = next((t for t, s in seen if t >= ep.t_start and s != ep.spine), None)
            e: dict[str, Any] = {
                "spine": ep.spine,
                "moved_to": moved["spine"] if moved else None,
                "t_start": ep.t_start,
                "t_end": ep.t_end,
                "t_cross": cross["t"] if cross else None,
                "cross_link": cross["link"] if cross else None,
                "cross_utilization": cross["utilization"] if cross else None,
                "t_service_applied": moved["t"] if moved else None,
                "t_onos_installed": ep.t_onos,
                "t_dataplane": data,
            }
            if cross:
                for name, t in (
                    ("reaction_s", ep.t_onos),
                    ("service_reaction_s", moved["t"] if moved else None),
                    ("dataplane_reaction_s", data),
                ):
                    if t is not None:
                        e[name] = t - cross["t"]
            e["iteration_s"] = self._phases(ep, ep.t_onos)
            episodes.append(e)

        def summary(name: str) -> dict[str, Any]:
            v = [e[name] for e in episodes if name in e]
            return {
                "samples": len(v),
                "values": v,
                "median": statistics.median(v) if v else None,
                "p95": _percentile(v, 0.95) if v else None,
                "max": max(v) if v else None,
            }

        return {
            "params": self.p.__dict__,
            "topology": {
                "switches": TOPOLOGY["switches"],
                "links": TOPOLOGY["links"],
                "hosts": {str(h): list(v) for h, v in TOPOLOGY["hosts"].items()},  # type: ignore[attr-defined]
                "job": {"workers": list(WORKERS), "ps": PS},
                "background": {"from": BG_SRC, "to": BG_DST, "udp_port": BG_PORT},
            },
            "t0": self.t0,
            "iterations": self.iterations,
            "placements": placements,
            "telemetry": tel,
            "dataplane": _bins(seen, 0.1),
            "episodes": episodes,
            # telemetry crossing the threshold -> every intent of the job INSTALLED in ONOS
            # through the other spine (headline); -> the service's placement recorded as
            # applied; -> the first gradient packet seen on the other spine
            "reaction_s": summary("reaction_s"),
            "service_reaction_s": summary("service_reaction_s"),
            "dataplane_reaction_s": summary("dataplane_reaction_s"),
            "fabric_restarts": self.fabric.restarts,
            "int_repairs": self.int_repairs,
        }

    def _phases(self, ep: Episode, moved: float | None) -> dict[str, float | None]:
        """Worker 0's iteration times: median before the congestion, the longest while the
        job was on the congested spine (until 0.5 s after the move), median after the move
        while the background still ran on the other spine, and after it stopped."""

        def pick(lo: float, hi: float) -> list[float]:
            return [
                it["seconds"] for it in self.iterations if it["worker"] == 0 and lo <= it["t"] < hi
            ]

        def median(v: list[float]) -> float | None:
            return statistics.median(v) if v else None

        until = (moved or ep.t_end) + 0.5
        during = pick(ep.t_start, until)
        settled = (moved or ep.t_start) + 1.0
        last = ep.t_end + ep.settle_s
        ends = [
            settled,
            *sorted(t for t in (it["t"] for it in self.iterations if it["worker"] == 0)
                    if settled <= t < last),
            last,
        ]  # fmt: skip
        return {
            "before_median": median(pick(ep.t_start - 3, ep.t_start)),
            "congested_max": max(during) if during else None,
            "moved_median": median(pick(until + 0.5, ep.t_end)),
            "background_stopped_median": median(pick(ep.t_end + 1.0, ep.t_end + 3.0)),
            # the longest time without a completed iteration, from 1 s after the move to the
            # next episode
            "longest_gap_s": max(b - a for a, b in itertools.pairwise(ends)),
        }

    # --- tear-down ----------------------------------------------------------------------

    def stop(self) -> None:
        if self.sniffer:
            self.sniffer.stop()
        if self.ddp is not None:
            self.ddp.stop()
        for name in ("background", "worker0", "worker1", "ps", "sink", "service", "collector"):
            p = self.procs.pop(name, None)
            if p is not None and name in ("service", "collector"):
                children.stop(p)  # their own process groups (the collector's workers)
            elif p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.onos.request("DELETE", f"/intents/{BG_APP}/background")
        for app in (SERVICE_APP, BG_APP, GLOO_APP):
            r = self.onos.request("GET", f"/intents/application/{app}")
            for i in r.json().get("intents", []) if r.status_code == 200 else []:
                self.onos.request("DELETE", f"/intents/{app}/{i['key']}")
        self.onos.request("DELETE", f"/onos/innet-agg/aggregation/{JOB}")
        r = self.onos.request("GET", "/onos/int/intIntent")
        for intent in r.json().get("IntIntents", []) if r.status_code == 200 else []:
            self.onos.request("DELETE", f"/onos/int/intIntent/{intent['id']}")
        self.onos.request("DELETE", f"/network/configuration/apps/{INT_APP}")
        self.fabric.stop()


class Sniffer:
    """Which spine carries the job: the first worker's gradient packets seen on each leaf
    uplink's veth (raw sockets in the root namespace), with their arrival times."""

    def __init__(self, veths: dict[str, str], src_ip: str) -> None:
        self.socks = {}
        for spine, dev in veths.items():
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
            s.bind((dev, 0x0003))
            self.socks[s.fileno()] = (spine, s)
        self.src = socket.inet_aton(src_ip)
        self.seen: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select(list(self.socks), [], [], 0.2)
            for fd in ready:
                spine, s = self.socks[fd]
                data = s.recv(256)
                now = time.time()
                # IPv4 without options, UDP to the aggregation port, from the worker
                if (
                    len(data) >= 38
                    and data[12:14] == b"\x08\x00"
                    and data[23] == 17
                    and data[26:30] == self.src
                    and int.from_bytes(data[36:38], "big") == AGG_PORT
                ):
                    self.seen.append((now, spine))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)
        for _, s in self.socks.values():
            s.close()


def _bins(seen: list[tuple[float, str]], width: float) -> list[dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for t, spine in seen:
        b = out.setdefault(int(t / width), {"t": int(t / width) * width})
        b[spine] = b.get(spine, 0) + 1
    return [out[k] for k in sorted(out)]


def _percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: with n samples, the ceil(q n)-th smallest."""
    s = sorted(values)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def _epoch(rfc3339: str) -> float:
    """InfluxDB 1.x's RFC 3339 time (nanoseconds, Z) as seconds since the epoch."""
    from datetime import datetime

    head, _, frac = rfc3339.rstrip("Z").partition(".")
    base = datetime.fromisoformat(head + "+00:00").timestamp()
    return base + (float("0." + frac) if frac else 0.0)
