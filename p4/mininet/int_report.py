# ruff: noqa: UP031, UP024
"""The INT report network of the compose profile `emulated` (docs/deploy.md): a custom file
for p4mn's `mn` (opennetworking/p4mn, or the stand-in of tests/deploy/standins/p4mn):

    mn ... --custom int_report.py --topo intreport,tree,depth=2,fanout=2

`intreport,NAME,ARGS` is Mininet's topology NAME (tree, linear, single, ...) with ARGS, plus
one node `int1` in the container's own network namespace and one more port on every switch,
linked to it: an out-of-band telemetry network, as tests/e2e/fabric.py gives bmv2, so reports
never queue behind the traffic they describe, and reach the container's IP stack and from
there the compose network.

- int1's interfaces answer nothing (no ARP, no IPv6), so ONOS learns no host there and our
  pipeline sends reports to the broadcast MAC (docs/onos-int.md, "Report addresses"); one of
  them holds the collector address ONOS's INT app is given, INT_REPORT_ADDR
  (10.0.0.254:32766), and the kernel takes a local address on any of them.
- A relay thread sends every datagram arriving there to INT_REPORT_COLLECTOR
  (int-collector:32766, looked up again every 10 s: the collector's container may be
  recreated with another address).
- Once the switches have started, every switch's netcfg file (/tmp/bmv2-<switch>-netcfg.json,
  which onos-netcfg pushes to ONOS) gets the device annotation `intReportPort`: its port to
  int1, where the INT app's report clone session outputs.

Python 2 (p4mn's Mininet) and 3 (the stand-in's); only the latter has run it.
"""

import json
import os
import socket
import threading
import time

from mininet.log import info, warn
from mininet.node import Switch
from mininet.topo import LinearTopo, MinimalTopo, SingleSwitchReversedTopo, SingleSwitchTopo
from mininet.topolib import TorusTopo, TreeTopo

INT_REPORT_NODE = "int1"
# Written once every switch's netcfg file is annotated: the files of this run (onos-netcfg
# `--ready-file`, beside the netcfg files in /tmp).
READY = "/tmp/innet-agg-netcfg-ready.json"
INT_REPORT_TOPOS = {
    "minimal": MinimalTopo,
    "linear": LinearTopo,
    "reversed": SingleSwitchReversedTopo,
    "single": SingleSwitchTopo,
    "tree": TreeTopo,
    "torus": TorusTopo,
}


def int_report_addr(value):
    host, _, port = value.rpartition(":")
    return host, int(port)


class IntReportNode(Switch):
    """The root-namespace end of every switch's report port (a Switch to Mininet, so that
    `pingall` leaves it out and it starts after the links exist)."""

    def __init__(self, name, **params):
        Switch.__init__(self, name, **params)
        self.listen = int_report_addr(os.environ.get("INT_REPORT_ADDR", "10.0.0.254:32766"))
        self.collector = int_report_addr(
            os.environ.get("INT_REPORT_COLLECTOR", "int-collector:32766")
        )

    def start(self, controllers):
        intfs = [i for i in self.intfList() if i.name != "lo"]
        for intf in intfs:
            # rp_filter: reports come from 169.254.H.L, which is routed elsewhere (eth0).
            for cmd in (
                "sysctl -qw net.ipv6.conf.%s.disable_ipv6=1" % intf.name,
                "sysctl -qw net.ipv4.conf.%s.rp_filter=0" % intf.name,
                "ip link set dev %s arp off" % intf.name,
            ):
                self.cmd(cmd)
        self.cmd("sysctl -qw net.ipv4.conf.all.rp_filter=0")
        self.cmd("ip addr add %s/32 dev %s" % (self.listen[0], intfs[0].name))
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(self.listen)
        relay = threading.Thread(target=self.relay, args=(sock,))
        relay.daemon = True
        relay.start()
        (ip, port), (host, to) = self.listen, self.collector
        info("%s: INT reports to %s:%d go to %s:%d " % (self.name, ip, port, host, to))

    def relay(self, sock):
        out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        target, looked_up, sent = None, 0.0, 0
        while True:
            data = sock.recv(65535)
            if target is None or time.time() - looked_up > 10:
                try:
                    target = (socket.gethostbyname(self.collector[0]), self.collector[1])
                    looked_up = time.time()
                except socket.error:
                    continue
            try:
                out.sendto(data, target)
            except socket.error:
                target = None
                continue
            sent += 1
            if sent == 1:
                info(
                    "\n*** %s: first INT report relayed to %s:%d\n"
                    % (self.name, target[0], target[1])
                )

    @classmethod
    def batchStartup(cls, switches):
        """After every switch's start(), so p4mn has written their netcfg files; then the
        ready marker names the files of this run, so onos-netcfg pushes those, complete,
        and no stale file an earlier, larger topology left in the volume."""
        files = []
        for node in switches:
            files += node.annotate()
        with open(READY + ".new", "w") as f:
            json.dump({"files": sorted(os.path.basename(p) for p in files)}, f)
        os.rename(READY + ".new", READY)
        return switches

    def annotate(self):
        """Annotate the netcfg files of this node's switches; returns their paths."""
        done = []
        for intf in self.intfList():
            if intf.link is None:
                continue
            peer = intf.link.intf2 if intf.link.intf1 is intf else intf.link.intf1
            path = "/tmp/bmv2-%s-netcfg.json" % peer.node.name
            try:
                with open(path) as f:
                    doc = json.load(f)
            except (IOError, ValueError) as e:
                warn("*** %s: no netcfg to annotate for %s: %s\n" % (self.name, peer.node, e))
                continue
            for cfg in doc.get("devices", {}).values():
                entries = cfg.setdefault("annotations", {}).setdefault("entries", {})
                entries["intReportPort"] = str(peer.node.ports[peer])
            # Replaced in one step: onos-netcfg may read it at any time.
            with open(path + ".new", "w") as f:
                json.dump(doc, f, indent=4)
            os.rename(path + ".new", path)
            done.append(path)
        return done


def int_report_topo(base="minimal", *args, **kwargs):
    """Topology `base` with the report node linked to every switch, after the base's own links
    (so each switch's report port is its last one)."""
    parent = INT_REPORT_TOPOS[base]

    class WithReportNetwork(parent):
        def build(self, *a, **kw):
            if os.path.exists(READY):  # an earlier run's: not this one's switches
                os.remove(READY)
            parent.build(self, *a, **kw)
            switches = self.switches()
            node = self.addSwitch(INT_REPORT_NODE, cls=IntReportNode)
            for sw in switches:
                self.addLink(sw, node)

    return WithReportNetwork(*args, **kwargs)


topos = {"intreport": int_report_topo}
