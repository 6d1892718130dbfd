"""Mininet classes of the p4mn stand-in (README.md beside this file), loaded by
`mn --custom`: switch class `simple_switch_grpc` and host class `onoshost`, named and behaving
as p4mn's for what this project uses. Written here; p4mn's own module is not copied.

- Switch N (in Mininet's creation order) serves P4Runtime on 0.0.0.0:50000+N with device id 1
  and starts without a pipeline (`--no-p4`): ONOS pushes it.
- It writes /tmp/bmv2-<name>-netcfg.json: device `device:bmv2:<name>`, management address
  grpc://localhost:<port>?device_id=1, driver bmv2, the pipeconf option (ONOS's `basic` unless
  `--switch simple_switch_grpc,pipeconf=...`), and its ports numbered 1.. in Mininet's order
  with their interface names; its log goes to /tmp/bmv2-<name>-log.
- Differs from p4mn: each switch gets its own Thrift port (9090+N; this bmv2 is built with
  Thrift, p4mn's without, and they would all take 9090), and a switch that dies is reported
  on the console, as p4mn does, but not restarted.

`mn` runs this file with exec() and copies its top-level names into its own globals, so the
names here are few and do not shadow mn's.
"""

import json
import socket
import subprocess
import threading
import time

from mininet.log import info, warn
from mininet.node import Host, Switch

P4MN_BMV2 = "/opt/p4/bin/simple_switch_grpc"
P4MN_START_S = 120  # a cold start of five processes on a loaded 2-core machine


class P4RuntimeSwitch(Switch):
    """bmv2 simple_switch_grpc on this node's Mininet ports."""

    created = 0

    def __init__(
        self,
        name,
        cpuport=255,
        loglevel="warn",
        pipeconf="org.onosproject.pipelines.basic",
        json=None,
        **params,
    ):
        Switch.__init__(self, name, **params)
        P4RuntimeSwitch.created += 1
        self.grpc_port = 50000 + P4RuntimeSwitch.created
        self.thrift_port = 9090 + P4RuntimeSwitch.created
        self.cpu_port = int(cpuport)
        self.loglevel = loglevel
        self.pipeconf = pipeconf
        self.json_path = json
        self.device = f"device:bmv2:{name}"
        self.proc = None
        self.stopping = False

    def tmp(self, what):
        return f"/tmp/bmv2-{self.name}-{what}"

    def data_ports(self):
        """(port number, interface) of the ports bmv2 serves, in port order: not `lo` (port 0,
        Mininet's control interface of a switch in the root namespace)."""
        return [(self.ports[i], i) for i in self.intfList() if i.name != "lo" and not i.IP()]

    def argv(self):
        args = [P4MN_BMV2, "--device-id", "1"]
        for port, intf in self.data_ports():
            args += ["-i", f"{port}@{intf.name}"]
        args += ["--thrift-port", str(self.thrift_port), "--log-console", "-L", self.loglevel]
        args += [self.json_path] if self.json_path else ["--no-p4"]
        args += ["--", "--cpu-port", str(self.cpu_port)]
        args += ["--grpc-server-addr", f"0.0.0.0:{self.grpc_port}"]
        return args

    def start(self, controllers):
        subprocess.run(f"rm -rf /tmp/bmv2-{self.name}-*", shell=True, check=False)
        with open(self.tmp("grpc-port"), "w") as f:
            f.write(str(self.grpc_port))
        argv = self.argv()
        with open(self.tmp("log"), "w") as log:
            log.write(" ".join(argv) + "\n\n")
            log.flush()
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        self.wait_listening()
        info(f"{self.name}: simple_switch_grpc on P4Runtime port {self.grpc_port} ")
        with open(self.tmp("netcfg.json"), "w") as f:
            json.dump({"devices": {self.device: self.netcfg()}}, f, indent=4)
        threading.Thread(target=self.watch, daemon=True).start()

    def wait_listening(self):
        deadline = time.monotonic() + P4MN_START_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name}: simple_switch_grpc exited: {self.log_tail()}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.grpc_port)) == 0:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: no P4Runtime server after {P4MN_START_S} s")
            time.sleep(0.1)

    def log_tail(self, lines=5):
        try:
            with open(self.tmp("log")) as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def watch(self):
        status = self.proc.wait()
        if not self.stopping:
            warn(f"\n*** {self.name}: simple_switch_grpc exited ({status}):\n{self.log_tail()}\n")

    def netcfg(self):
        return {
            "basic": {
                "managementAddress": f"grpc://localhost:{self.grpc_port}?device_id=1",
                "driver": "bmv2",
                "pipeconf": self.pipeconf,
            },
            "ports": {
                str(n): {
                    "number": n,
                    "name": intf.name,
                    "enabled": True,
                    "removed": False,
                    "type": "copper",
                    "speed": 10000,
                }
                for n, (_, intf) in enumerate(self.data_ports(), 1)
            },
        }

    def stop(self, deleteIntfs=True):
        self.stopping = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        Switch.stop(self, deleteIntfs)


class OnosHost(Host):
    """A host whose NIC computes no checksum (bmv2 would forward the kernel's unfinished
    ones and the receiver drop them) and that sends no IPv6."""

    def config(self, **params):
        r = Host.config(self, **params)
        for feature in ("rx", "tx", "sg"):
            self.cmd(f"ethtool --offload {self.defaultIntf()} {feature} off")
        for scope in ("all", "default", "lo"):
            self.cmd(f"sysctl -qw net.ipv6.conf.{scope}.disable_ipv6=1")
        return r


switches = {"simple_switch_grpc": P4RuntimeSwitch}
hosts = {"onoshost": OnosHost}
