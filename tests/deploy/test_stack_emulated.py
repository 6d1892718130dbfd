"""The compose profile `emulated` run for real (issue 32): docker-compose.yml started by a
Docker engine with `--profile emulated`, bmv2 switches in Mininet under ONOS, walked as
docs/deploy.md tells a user to: the three switches of `tree,depth=2,fanout=2` connected and
available in ONOS with our pipeconf applied (its driver, and the packet-in rules ONOS's
providers asked for written through it), links found by LLDP, hosts learned from their ARP;
then ONOS's INT app configured as docs/onos-int.md says, traffic between two Mininet hosts,
and its INT reports through the report network of p4/mininet/int_report.py, the collector and
into InfluxDB, one series for each of the three switches on the path.

`opennetworking/p4mn:stable` is stood in for by a local image of Debian's Mininet and the
bmv2 1.15.5 built in /opt/p4 (standins/p4mn/README.md), the other images as for
test_stack.py. This engine cannot start privileged containers (its host lacks
CAP_SYS_RESOURCE), so compose.emulated.yml gives the Mininet container the capabilities it
uses instead. Skips naming what is missing; its own compose project on free ports, removed
with its volumes after.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from . import standin_images as si
from . import test_stack as stack_base
from .conftest import REPO
from .test_stack import ONOS_AUTH, compose_up, exit_code, http, until
from .test_stack import missing as stack_missing

P4 = Path("/opt/p4")
SIMPLE_SWITCH_GRPC = P4 / "bin" / "simple_switch_grpc"
P4MN = "opennetworking/p4mn:stable"
STANDIN = REPO / "tests" / "deploy" / "standins" / "p4mn"
OVERRIDES = [
    REPO / "tests" / "deploy" / f for f in ("compose.standins.yml", "compose.emulated.yml")
]
PIPECONF = "org.innetagg.bmv2"
INT_APP = "org.onosproject.inbandtelemetry"
TEST_APP = "org.innetagg.deploy.emulated"
SWITCHES = {f"device:bmv2:s{i}" for i in (1, 2, 3)}
# Each switch's last port, linked to the report network (p4/mininet/int_report.py): s1 has two
# switches below it, s2 and s3 two hosts and s1 above.
REPORT_PORTS = {"device:bmv2:s1": "3", "device:bmv2:s2": "4", "device:bmv2:s3": "4"}
# tree,depth=2,fanout=2: s1 above s2 (h1, h2) and s3 (h3, h4); Mininet's addresses
HOSTS = {f"h{i}": f"10.0.0.{i}" for i in (1, 2, 3, 4)}
AGG_PORT = 48879  # the watched flow: the aggregation protocol's port (docs/onos-int.md)
# Sized for a cold start beside other work on a loaded 2-core machine.
UP_TIMEOUT_S = 1800  # image builds from cold caches
ONOS_WAIT_S = 900
INT_WAIT_S = 600


def missing() -> str | None:
    if not SIMPLE_SWITCH_GRPC.exists():
        return f"no bmv2 with P4Runtime at {SIMPLE_SWITCH_GRPC} for the {P4MN} stand-in"
    if shutil.which("ldd") is None:
        return "no ldd to find the libraries simple_switch_grpc loads"
    return stack_missing()


REASON = missing()
pytestmark = pytest.mark.skipif(bool(REASON), reason=str(REASON))


def bmv2_files() -> list[Path]:
    """simple_switch_grpc and the libraries it loads from /opt/p4 (ldd; the rest of
    /opt/p4, 600 MB of headers, static libraries and other targets, stays out)."""
    r = subprocess.run(["ldd", str(SIMPLE_SWITCH_GRPC)], capture_output=True, text=True)
    libs = [Path(w) for line in r.stdout.splitlines() for w in line.split()
            if w.startswith(f"{P4}/")]  # fmt: skip
    return [SIMPLE_SWITCH_GRPC, *libs, *(p.resolve() for p in libs)]


def build_p4mn(log: object = print) -> None:
    files = bmv2_files()
    want = si.digest(STANDIN, si.image_id(si.PYTHON), *(si.stamp(f) for f in files))

    def build(tmp: Path) -> None:
        ctx = tmp / "p4mn"
        shutil.copytree(STANDIN, ctx)
        for f in files:
            dest = ctx / "p4" / f.relative_to(P4)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dest, follow_symlinks=False)
        si._build(P4MN, ctx, want)

    si.ensure(P4MN, want, build, log)  # type: ignore[arg-type]


class Stack(stack_base.Stack):
    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp, "emulated", OVERRIDES, "innet-agg-test-emulated")
        self.times: dict[str, float] = {}
        self.t0 = time.monotonic()

    def mark(self, what: str) -> None:
        self.times[what] = time.monotonic() - self.t0
        print(f"{self.times[what]:7.1f} s  {what}", flush=True)

    def up(self) -> None:
        compose_up(self.compose, self.log, UP_TIMEOUT_S)

    def onos(self, path: str, body: object = None, method: str | None = None) -> tuple[int, object]:
        url = f"http://127.0.0.1:{self.ports['ONOS_PORT']}/onos{path}"
        return http(url, body=body, method=method, headers=ONOS_AUTH)

    def on_host(self, host: str, *argv: str, timeout: float = 60) -> str:
        """A command in a Mininet host, as a user runs it: `docker compose exec mininet m`."""
        r = self.compose("exec", "-T", "mininet", "m", host, *argv, timeout=timeout)
        return r.stdout + r.stderr

    def int_switches(self) -> set[str]:
        q = 'SHOW TAG VALUES FROM int_link WITH KEY = "switch"'
        url = f"http://127.0.0.1:{self.ports['INFLUXDB_PORT']}/query?db=telemetry&q="
        code, doc = http(url + quote(q))
        series = doc["results"][0].get("series", []) if code == 200 else []
        return {v[1] for s in series for v in s["values"]}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("emulated")
    si.remove_stale_projects()
    s = Stack(tmp)
    try:
        si.build_all()
        build_p4mn()
    except si.StandInError as e:
        pytest.fail(str(e))
    s.mark("stand-in images ready")
    try:
        s.up()
        s.mark("compose up: every service ready")
        yield s
    finally:
        s.compose("down", "-v", "--remove-orphans", timeout=300)
        print(f"phases (s since the fixture started): {s.times}")


def test_bmv2_switches_in_mininet_run_our_pipeline_and_send_int_reports_to_influxdb(
    stack: Stack,
) -> None:
    # onos-netcfg pushed p4mn's netcfg files (annotated with their report port).
    code = exit_code(stack.compose, "onos-netcfg", ONOS_WAIT_S)
    said = stack.compose("logs", "--no-color", "onos-netcfg").stdout
    assert code == 0, f"onos-netcfg exited {code}: {said}"
    assert "netcfg pushed for 3 devices" in said, said
    stack.mark("onos-netcfg exited 0")

    # Every switch connected and available, running our pipeconf: the pipeconf-merged driver,
    # and ONOS's packet-in requests (ARP, LLDP) written into the switch through it.
    def devices_ready() -> dict[str, dict] | None:
        code, doc = stack.onos("/v1/devices")
        devs = {d["id"]: d for d in doc["devices"]} if code == 200 else {}
        if not {i for i, d in devs.items() if d["available"]} >= SWITCHES:
            return None
        for dev in SWITCHES:
            code, flows = stack.onos(f"/v1/flows/{dev}")
            if code != 200 or not any(f["state"] == "ADDED" for f in flows["flows"]):
                return None
        return devs

    devs = until(devices_ready, "3 switches available with rules written", ONOS_WAIT_S)
    for dev in SWITCHES:
        assert PIPECONF in devs[dev]["driver"], devs[dev]
        assert devs[dev]["annotations"].get("intReportPort") == REPORT_PORTS[dev], devs[dev]
    stack.mark("switches available, pipeconf applied")
    code, apps = stack.onos("/v1/applications/org.innetagg.app")
    assert code == 200 and apps["state"] == "ACTIVE", apps

    # Links by LLDP through our packet-in/out: s1-s2 and s1-s3, both ways.
    def links() -> bool:
        code, doc = stack.onos("/v1/links")
        return code == 200 and sum(ln["state"] == "ACTIVE" for ln in doc["links"]) >= 4

    until(links, "4 links discovered by LLDP", ONOS_WAIT_S)
    stack.mark("links discovered")

    # Hosts from their ARP: each host pings another (no forwarding yet; ONOS learns them).
    def hosts() -> dict[str, dict] | None:
        for h in HOSTS:
            other = HOSTS["h3" if h in ("h1", "h2") else "h1"]
            stack.on_host(h, "ping", "-c", "1", "-W", "1", other)
        code, doc = stack.onos("/v1/hosts")
        known = {ip: x for x in doc["hosts"] for ip in x["ipAddresses"]} if code == 200 else {}
        return (
            {h: known[ip] for h, ip in HOSTS.items()} if set(HOSTS.values()) <= set(known) else None
        )

    found = until(hosts, "the 4 Mininet hosts learned by ONOS", ONOS_WAIT_S)
    stack.mark("hosts learned")

    # INT as docs/onos-int.md says: the collector's address (the report network's end in the
    # Mininet container, relayed to int-collector), then the flows to watch.
    def report_config(variant: int) -> None:
        report = {"collectorIp": "10.0.0.254", "collectorPort": 32766,
                  "minFlowHopLatencyChangeNs": variant}  # fmt: skip
        code, doc = stack.onos("/v1/network/configuration",
                               {"apps": {INT_APP: {"report": report}}})  # fmt: skip
        assert code == 200, doc

    report_config(0)
    intent = {
        "selector": {"criteria": [{"type": "ETH_TYPE", "ethType": "0x800"},
                                  {"type": "UDP_DST", "udpPort": AGG_PORT}]},
        "metadataTypes": ["SWITCH_ID", "L1_PORT_ID", "HOP_LATENCY", "QUEUE_OCCUPANCY",
                          "INGRESS_TIMESTAMP", "EGRESS_TIMESTAMP"],
        "headerType": "HOP_BY_HOP", "telemetryMode": "INBAND_TELEMETRY",
        "reportTypes": "TRACKED_FLOW",
    }  # fmt: skip
    code, doc = stack.onos("/int/intIntent", intent)
    assert code < 300, doc
    # A path for the traffic: a host-to-host intent h1 <-> h3 (through s2, s1, s3).
    code, doc = stack.onos(f"/v1/applications/{TEST_APP}/register", method="POST")
    assert code < 300, doc
    h2h = {"type": "HostToHostIntent", "appId": TEST_APP, "key": "h1-h3",
           "one": found["h1"]["id"], "two": found["h3"]["id"]}  # fmt: skip
    code, doc = stack.onos("/v1/intents", h2h)
    assert code == 201, doc
    until(lambda: stack.onos(f"/v1/intents/{TEST_APP}/h1-h3")[1].get("state") == "INSTALLED",
          "the h1-h3 intent INSTALLED", ONOS_WAIT_S)  # fmt: skip
    stack.mark("INT configured, h1-h3 intent installed")

    # UDP from h1 to h3 on the watched port until the three switches' hops are in InfluxDB.
    # The INT app does not retry what a switch missed (tests/e2e/closed_loop.py, ensure_int):
    # every minute without reports the report config changes, which re-programs every switch.
    send = ("import socket, time\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            f"for _ in range(100):\n    s.sendto(b'x' * 64, ('10.0.0.3', {AGG_PORT}))\n"
            "    time.sleep(0.01)\n")  # fmt: skip
    started, variant = time.monotonic(), 0

    def reported() -> set[str] | None:
        nonlocal started, variant
        stack.on_host("h1", "python3", "-c", send)
        seen = stack.int_switches()
        if not seen and time.monotonic() - started > 60:
            variant, started = variant + 1, time.monotonic()
            report_config(variant)
        return seen if len(seen) >= 3 else None

    seen = until(reported, "int_link points of the 3 switches in InfluxDB", INT_WAIT_S)
    stack.mark("INT reports in InfluxDB")
    code, doc = stack.onos("/v1/devices")
    ids = {d["annotations"].get("intSwitchId") for d in doc["devices"] if d["id"] in SWITCHES}
    assert seen == ids, (seen, ids)
