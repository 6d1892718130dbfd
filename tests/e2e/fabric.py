"""An emulated fabric for the end-to-end tests: bmv2 `simple_switch_grpc` switches (built
outside the repository into /opt/p4) joined by veth pairs, hosts in network namespaces, all
given to a real ONOS 2.7 by netcfg with our pipeconf.

Plain bmv2 has no gNMI, so ONOS learns no ports from it (a device with `ports: []`, hence
no LLDP, hence no links): each switch's ports are declared in its netcfg (`ports`,
PortDescriptionsConfig), without names so that ONOS's port ids stay plain numbers. Links are
then discovered by ONOS's LLDP through our packet-in/out, and hosts by the ARP they send.

Optionally (`report_ports`) a switch gets one more port whose veth ends in the root
namespace, where the INT collector runs: an out-of-band telemetry network, so that reports
never queue behind the traffic they describe. Every such veth accepts `collector_ip` (one of
them holds the address; the kernel delivers a local address arriving on any interface).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agg_agent.p4names import TC_CLASSES
from agg_optimizer.service import onosd
from int_collector import children
from p4 import bmv2

PIPECONF = "org.innetagg.bmv2"

# A gratuitous ARP from host argv[2] (10.0.0.N, 00:00:00:00:00:N) on interface argv[1].
GARP = """
import socket, struct, sys
ifname, n = sys.argv[1], int(sys.argv[2])
mac, ip = bytes([0, 0, 0, 0, 0, n]), bytes([10, 0, 0, n])
arp = struct.pack("!HHBBH", 1, 0x0800, 6, 4, 1) + mac + ip + bytes(6) + ip
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((ifname, 0))
s.send(b"\\xff" * 6 + mac + b"\\x08\\x06" + arp)
"""


@dataclass
class Switch:
    name: str
    tag: str = ""  # this fabric's, in the device id
    ports: dict[int, str] = field(default_factory=dict)  # port number -> switch-side veth
    grpc: int = 0
    thrift: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def device(self) -> str:
        return f"device:bmv2:{self.name}-{self.tag}"


class Fabric:
    """`links`: (switch, port, switch, port); `hosts`: host number -> (switch, port). Host i
    is 10.0.0.i with MAC 00:00:00:00:00:i in namespace `<prefix>h<i>`, and knows every other
    host's MAC (static neighbours: no ARP is needed once ONOS has learned the hosts).
    `annotations`: switch -> device annotations set through netcfg (INT node ID, report
    port)."""

    def __init__(
        self,
        onos: onosd.OnosServer,
        switches: list[str],
        links: list[tuple[str, int, str, int]],
        hosts: dict[int, tuple[str, int]],
        prefix: str = "e2",
        log_dir: Path | None = None,
        report_ports: dict[str, int] | None = None,
        collector_ip: str = "192.168.254.1",
        annotations: dict[str, dict[str, str]] | None = None,
    ) -> None:
        self.onos, self.prefix, self.log_dir = onos, prefix, log_dir
        # A device id ONOS never saw: ONOS 2.7 keeps a removed device's pipeline status, and
        # a device of the same id added again was connected (entries written, packet-outs
        # sent) before bmv2 had taken the pipeline, which crashed simple_switch_grpc
        # (SIGSEGV in its gRPC server) in one start out of two.
        tag = uuid.uuid4().hex[:4]
        self.switches = {s: Switch(s, tag) for s in switches}
        self.links, self.hosts = links, hosts
        self.report_ports = report_ports or {}
        self.collector_ip = collector_ip
        self.annotations = annotations or {}
        self.veths: list[str] = []
        self.restarts: list[tuple[str, int]] = []  # (switch, exit status) restarted at start
        # (switch, port) -> the veth in the root namespace that sees what crosses that port
        self.port_veth: dict[tuple[str, int], str] = {}

    def ns(self, host: int) -> str:
        return f"{self.prefix}h{host}"

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> Fabric:
        try:
            self._wire()
            self._start_switches()
            self._configure_onos()
            onosd.wait_for(self._devices_up, 300, "every switch available in ONOS")
            onosd.wait_for(self._links_up, 300, "every link discovered by ONOS")
            return self
        except BaseException:
            self.stop()
            raise

    def _wire(self) -> None:
        for n, (a, pa, b, pb) in enumerate(self.links):
            va, vb = f"{self.prefix}l{n}a", f"{self.prefix}l{n}b"
            bmv2.veth_link(va, vb)
            self.veths.append(va)
            self.switches[a].ports[pa] = va
            self.switches[b].ports[pb] = vb
            self.port_veth[(a, pa)], self.port_veth[(b, pb)] = va, vb
        for n, (s, p) in enumerate(sorted(self.report_ports.items())):
            va, vb = f"{self.prefix}r{n}a", f"{self.prefix}r{n}b"
            bmv2.veth_link(va, vb)
            self.veths.append(va)
            self.switches[s].ports[p] = va
            for cmd in (
                ["sysctl", "-q", "-w", f"net.ipv4.conf.{vb}.rp_filter=0"],
                *([["ip", "addr", "add", f"{self.collector_ip}/32", "dev", vb]] if n == 0 else []),
            ):
                subprocess.run(cmd, check=True, capture_output=True)
        for h, (s, p) in self.hosts.items():
            vs, vh = f"{self.prefix}s{h}", f"{self.prefix}v{h}"
            bmv2.veth_link(vs, vh)
            self.veths.append(vs)
            self.switches[s].ports[p] = vs
            ns = self.ns(h)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            ex = ("ip", "netns", "exec", ns)
            for cmd in (
                ("ip", "netns", "add", ns),
                ("ip", "link", "set", vh, "netns", ns),
                (*ex, "ip", "link", "set", vh, "address", f"00:00:00:00:00:{h:02x}"),
                (*ex, "ip", "addr", "add", f"10.0.0.{h}/24", "dev", vh),
                (*ex, "ip", "link", "set", vh, "up"),
                (*ex, "ip", "link", "set", "lo", "up"),
            ):
                subprocess.run(cmd, check=True, capture_output=True)
            for other in self.hosts:
                if other != h:
                    subprocess.run(
                        [
                            *(*ex, "ip", "neigh", "replace", f"10.0.0.{other}"),
                            *("lladdr", f"00:00:00:00:00:{other:02x}", "dev", vh),
                        ],
                        check=True,
                        capture_output=True,
                    )

    def _start_switches(self) -> None:
        for sw in self.switches.values():
            sw.grpc, sw.thrift = bmv2.free_port(), bmv2.free_port()
            self._launch(sw)
        for sw in self.switches.values():
            onosd.wait_for(lambda s=sw: bmv2.listening(s.grpc), 20, f"{sw.name}'s gRPC server")

    def _launch(self, sw: Switch) -> None:
        binary = bmv2.tool("simple_switch_grpc")
        assert binary
        ifaces = [a for p, v in sorted(sw.ports.items()) for a in ("-i", f"{p}@{v}")]
        log = open(  # noqa: SIM115 - owned by the process
            (self.log_dir / f"{sw.name}.log") if self.log_dir else os.devnull, "ab"
        )
        # Its own session, as ONOS, the collector and the service have (children.spawn): a
        # session is a scheduler autogroup, and in pytest's the switches shared theirs with
        # whatever busy process the invoking shell started beside pytest (docs/e2e.md,
        # "Beside two busy loops").
        sw.proc = children.spawn(
            [
                *(binary, "--no-p4", "--device-id", "1", "--thrift-port", str(sw.thrift)),
                # no per-packet log: at bmv2's default level (trace) every packet's lines
                # are formatted into a null sink, most of its per-packet CPU (congestion.md)
                *("--log-level", "off"),
                *ifaces,
                *("--", "--grpc-server-addr", f"127.0.0.1:{sw.grpc}", "--cpu-port", "255"),
                # one queue per traffic class (priority.p4): without them bmv2 drops the
                # packets of any class above 0 the scheduler gives a job
                *("--priority-queues", str(TC_CLASSES)),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

    def _restart_crashed(self) -> None:
        """simple_switch_grpc (this build, /opt/p4) sometimes dies of SIGSEGV in its gRPC
        server while ONOS connects it: ONOS 2.7 may mark a device connected, and write its
        entries and packet-outs, before the SetForwardingPipelineConfig it sent is done (seen
        for 1-2 of 5 switches in about one start out of three here). Such a switch is started
        again on the same ports; ONOS reconnects it and pushes the pipeline again."""
        for sw in self.switches.values():
            if sw.proc is not None and sw.proc.poll() is not None:
                self.restarts.append((sw.name, sw.proc.returncode))
                if len(self.restarts) > 2 * len(self.switches):
                    raise RuntimeError(f"bmv2 switches keep exiting: {self.restarts}")
                self._launch(sw)
                onosd.wait_for(lambda s=sw: bmv2.listening(s.grpc), 20, f"{sw.name} again")

    def netcfg(self) -> dict[str, Any]:
        return {
            "devices": {
                sw.device: {
                    "basic": {
                        "managementAddress": f"grpc://127.0.0.1:{sw.grpc}?device_id=1",
                        "driver": "bmv2",
                        "pipeconf": PIPECONF,
                    },
                    "ports": {
                        str(p): {
                            "number": p,
                            "enabled": True,
                            "removed": False,
                            "type": "copper",
                            "speed": 10000,
                        }
                        for p in sw.ports
                    },
                    **(
                        {"annotations": {"entries": self.annotations[sw.name]}}
                        if sw.name in self.annotations
                        else {}
                    ),
                }
                for sw in self.switches.values()
            }
        }

    def _configure_onos(self) -> None:
        r = self.onos.request("POST", "/network/configuration", json=self.netcfg())
        r.raise_for_status()

    def _devices_up(self) -> bool:
        self._restart_crashed()
        for sw in self.switches.values():
            r = self.onos.request("GET", f"/devices/{sw.device}")
            if r.status_code != 200 or not r.json().get("available"):
                return False
        return True

    def _links_up(self) -> bool:
        ours = {sw.device for sw in self.switches.values()}
        links = {
            (ln["src"]["device"], ln["src"]["port"], ln["dst"]["device"], ln["dst"]["port"])
            for ln in self.onos.get("/links")["links"]
            if ln["src"]["device"] in ours and ln.get("state") == "ACTIVE"
        }
        want = set()
        for a, pa, b, pb in self.links:
            da, db = self.switches[a].device, self.switches[b].device
            want |= {(da, str(pa), db, str(pb)), (db, str(pb), da, str(pa))}
        return want <= links

    def announce_hosts(self) -> dict[int, dict]:
        """Each host sends a gratuitous ARP until ONOS has learned every host where it is."""

        def learned() -> dict[int, dict] | None:
            for h in self.hosts:
                subprocess.run(
                    [
                        "ip",
                        "netns",
                        "exec",
                        self.ns(h),
                        "python3",
                        "-c",
                        GARP,
                        f"{self.prefix}v{h}",
                        str(h),
                    ],
                    capture_output=True,
                )
            known = {x["mac"].lower(): x for x in self.onos.get("/hosts")["hosts"]}
            out = {}
            for h, (s, p) in self.hosts.items():
                x = known.get(f"00:00:00:00:00:{h:02x}")
                if x is None:
                    return None
                loc = x["locations"][0]
                if (loc["elementId"], loc["port"]) != (self.switches[s].device, str(p)):
                    return None
                out[h] = x
            return out

        return onosd.wait_for(learned, 300, "every host learned at its port")

    def name_of(self, device: str) -> str | None:
        """The switch name of an ONOS device id of this fabric."""
        return next((s.name for s in self.switches.values() if s.device == device), None)

    def cli(self, switch: str, *commands: str) -> str:
        """simple_switch_CLI commands on a switch's Thrift port (queue rates and depths: what
        P4Runtime does not reach); raises if one of them reports an error."""
        cli = bmv2.tool("simple_switch_CLI")
        assert cli
        r = subprocess.run(
            ["/usr/bin/python3", cli, "--thrift-port", str(self.switches[switch].thrift)],
            input="\n".join(commands) + "\n",
            capture_output=True,
            text=True,
            env=dict(os.environ, PYTHONPATH=bmv2.P4_PYTHONPATH),
            timeout=30,
        )
        bad = [ln for ln in r.stdout.splitlines() if "Error" in ln or "Invalid" in ln]
        if r.returncode != 0 or bad or "Could not connect" in r.stderr + r.stdout:
            raise RuntimeError(f"simple_switch_CLI on {switch}: {bad or r.stderr.strip()[-300:]}")
        return r.stdout

    def run(self, host: int, argv: list[str], **kw: object) -> subprocess.Popen[str]:
        """A process in host `host`'s namespace (this interpreter for argv[0] == "python")."""
        if argv and argv[0] == "python":
            argv = [sys.executable, *argv[1:]]
        # its own session (scheduler autogroup), as the switches' (`_launch`)
        return children.spawn(["ip", "netns", "exec", self.ns(host), *argv], text=True, **kw)

    def stop(self) -> None:
        for sw in self.switches.values():
            if sw.proc is not None:
                sw.proc.terminate()
                sw.proc.wait(10)
        try:
            self.onos.remove_devices([sw.device for sw in self.switches.values()])
        finally:
            for h in self.hosts:
                subprocess.run(["ip", "netns", "del", self.ns(h)], capture_output=True)
            for v in self.veths:
                subprocess.run(["ip", "link", "del", v], capture_output=True)
