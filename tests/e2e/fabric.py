"""An emulated fabric for the end-to-end tests: bmv2 `simple_switch_grpc` switches (built
outside the repository into /opt/p4) joined by veth pairs, hosts in network namespaces, all
given to a real ONOS 2.7 by netcfg with our pipeconf.

Plain bmv2 has no gNMI, so ONOS learns no ports from it (a device with `ports: []`, hence
no LLDP, hence no links): each switch's ports are declared in its netcfg (`ports`,
PortDescriptionsConfig), without names so that ONOS's port ids stay plain numbers. Links are
then discovered by ONOS's LLDP through our packet-in/out, and hosts by the ARP they send.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agg_optimizer.service import onosd
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
    ports: dict[int, str] = field(default_factory=dict)  # port number -> switch-side veth
    grpc: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def device(self) -> str:
        return f"device:bmv2:{self.name}"


class Fabric:
    """`links`: (switch, port, switch, port); `hosts`: host number -> (switch, port). Host i
    is 10.0.0.i with MAC 00:00:00:00:00:i in namespace `<prefix>h<i>`."""

    def __init__(
        self,
        onos: onosd.OnosServer,
        switches: list[str],
        links: list[tuple[str, int, str, int]],
        hosts: dict[int, tuple[str, int]],
        prefix: str = "e2",
        log_dir: Path | None = None,
    ) -> None:
        self.onos, self.prefix, self.log_dir = onos, prefix, log_dir
        self.switches = {s: Switch(s) for s in switches}
        self.links, self.hosts = links, hosts
        self.veths: list[str] = []

    def ns(self, host: int) -> str:
        return f"{self.prefix}h{host}"

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> Fabric:
        try:
            self._wire()
            self._start_switches()
            self._configure_onos()
            onosd.wait_for(self._devices_up, 90, "every switch available in ONOS")
            onosd.wait_for(self._links_up, 60, "every link discovered by ONOS")
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

    def _start_switches(self) -> None:
        binary = bmv2.tool("simple_switch_grpc")
        assert binary
        for sw in self.switches.values():
            sw.grpc = bmv2.free_port()
            ifaces = [a for p, v in sorted(sw.ports.items()) for a in ("-i", f"{p}@{v}")]
            log = open(  # noqa: SIM115 - owned by the process
                (self.log_dir / f"{sw.name}.log") if self.log_dir else os.devnull, "wb"
            )
            sw.proc = subprocess.Popen(
                [
                    *(
                        binary,
                        "--no-p4",
                        "--device-id",
                        "1",
                        "--thrift-port",
                        str(bmv2.free_port()),
                    ),
                    *ifaces,
                    *("--", "--grpc-server-addr", f"127.0.0.1:{sw.grpc}", "--cpu-port", "255"),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            log.close()
        for sw in self.switches.values():
            onosd.wait_for(lambda s=sw: bmv2.listening(s.grpc), 20, f"{sw.name}'s gRPC server")

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
                }
                for sw in self.switches.values()
            }
        }

    def _configure_onos(self) -> None:
        r = self.onos.request("POST", "/network/configuration", json=self.netcfg())
        r.raise_for_status()

    def _devices_up(self) -> bool:
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

        return onosd.wait_for(learned, 60, "every host learned at its port")

    def stop(self) -> None:
        for sw in self.switches.values():
            if sw.proc is not None:
                sw.proc.terminate()
                sw.proc.wait(10)
        # Devices before their netcfg (ONOS 2.7 cannot build the merged driver of a listed
        # device without it, and GET /devices then answers 404).
        for sw in self.switches.values():
            self.onos.request("DELETE", f"/devices/{sw.device}")
        for sw in self.switches.values():
            self.onos.request("DELETE", f"/network/configuration/devices/{sw.device}")
        for h in self.hosts:
            subprocess.run(["ip", "netns", "del", self.ns(h)], capture_output=True)
        for v in self.veths:
            subprocess.run(["ip", "link", "del", v], capture_output=True)
