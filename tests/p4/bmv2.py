"""Run simple_switch with the committed pipeline on veth pairs, for the bmv2 tests.

Needs root, iproute2, bmv2's `simple_switch` and `simple_switch_CLI` (on PATH or in
/opt/p4/bin); `skip_reason()` says which is missing. The CLI is a Python 2/3 script of
bmv2's that runs on the system Python, outside this workspace's environment.
"""

from __future__ import annotations

import array
import fcntl
import os
import shutil
import socket
import struct
import subprocess
import time
from pathlib import Path
from typing import IO

from agg_agent import p4names

ROOT = Path(__file__).resolve().parents[2]
P4_BIN = Path("/opt/p4/bin")
P4_PYTHONPATH = "/opt/p4/lib/python3.11/site-packages"


def tool(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    p = P4_BIN / name
    return str(p) if p.exists() else None


def skip_reason() -> str | None:
    if os.environ.get("INNET_AGG_NO_BMV2"):
        return "INNET_AGG_NO_BMV2 is set"
    for name in ("simple_switch", "simple_switch_CLI"):
        if tool(name) is None:
            return f"bmv2 not installed: no {name} on PATH or in {P4_BIN}"
    if shutil.which("ip") is None:
        return "iproute2 (ip) not installed: veth pairs need it"
    if os.geteuid() != 0:
        return "veth pairs and raw sockets need root"
    return None


def grpc_skip_reason() -> str | None:
    """Why a `simple_switch_grpc` (bmv2 with P4Runtime) on veth pairs cannot run here."""
    if tool("simple_switch_grpc") is None:
        return f"bmv2 with P4Runtime not installed: no simple_switch_grpc on PATH or in {P4_BIN}"
    if shutil.which("ip") is None or os.geteuid() != 0:
        return "veth pairs and network namespaces need root and iproute2"
    return None


def listening(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:`port`."""
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def _tx_checksum_off(dev: str) -> None:
    """`ethtool -K dev tx off` by ioctl (no ethtool here): a veth otherwise hands bmv2 UDP
    packets whose checksum the kernel left for the NIC to finish, and the receiving host
    drops them as corrupt."""
    siocethtool, ethtool_stxcsum = 0x8946, 0x17
    value = array.array("I", [ethtool_stxcsum, 0])
    ifreq = struct.pack("16sP16x", dev.encode(), value.buffer_info()[0])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s.fileno(), siocethtool, ifreq)


def veth_link(a: str, b: str) -> None:
    """A veth pair between two switches' ports (no IPv6, no checksum offload)."""
    subprocess.run(["ip", "link", "del", a], capture_output=True)
    _run("ip", "link", "add", a, "type", "veth", "peer", "name", b)
    for dev in (a, b):
        _run("sysctl", "-q", "-w", f"net.ipv6.conf.{dev}.disable_ipv6=1")
        _run("ip", "link", "set", dev, "up")
        _tx_checksum_off(dev)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GrpcSwitch:
    """One `simple_switch_grpc` running no program until ONOS pushes its pipeline, port i on
    veth `<prefix>s<i>` with a raw socket on `<prefix>h<i>` (`ports`), for the ONOS tests;
    `netcfg` is the network configuration that attaches it. Leaving stops the switch and
    removes its veths, on failure too; whoever attached it removes the device first."""

    def __init__(self, prefix: str, log: Path, ports: int = 2, start_s: float = 60.0) -> None:
        self.prefix, self.log, self.n, self.start_s = prefix, log, ports, start_s
        self.grpc_port, self.thrift_port = free_port(), free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.ports: dict[int, RawPort] = {}

    def __enter__(self) -> GrpcSwitch:
        try:
            return self._start()
        except BaseException:
            self.__exit__()
            raise

    def _start(self) -> GrpcSwitch:
        from int_collector import children

        binary = tool("simple_switch_grpc")
        assert binary, grpc_skip_reason()
        for i in range(1, self.n + 1):
            veth_link(f"{self.prefix}s{i}", f"{self.prefix}h{i}")
        ifaces = [a for i in range(1, self.n + 1) for a in ("-i", f"{i}@{self.prefix}s{i}")]
        self.proc = children.spawn(
            [binary, "--no-p4", "--device-id", "1", "--thrift-port", str(self.thrift_port),
             *ifaces, "--log-file", str(self.log), "--",
             "--grpc-server-addr", f"127.0.0.1:{self.grpc_port}", "--cpu-port", "255",
             # bmv2 drops a packet whose class (v1model priority) has no queue
             "--priority-queues", str(p4names.TC_CLASSES)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        self.ports = {i: RawPort(f"{self.prefix}h{i}") for i in range(1, self.n + 1)}
        deadline = time.monotonic() + self.start_s  # a cold start on a loaded 2-core machine
        while not listening(self.grpc_port):
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise RuntimeError(f"simple_switch_grpc exited {self.proc.returncode}: {err}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"simple_switch_grpc: no gRPC server in {self.start_s} s")
            time.sleep(0.1)
        return self

    def netcfg(self, device: str, pipeconf: str) -> dict:
        return {"devices": {device: {"basic": {
            "managementAddress": f"grpc://127.0.0.1:{self.grpc_port}?device_id=1",
            "driver": "bmv2", "pipeconf": pipeconf}}}}  # fmt: skip

    def __exit__(self, *exc: object) -> None:
        from int_collector import children

        for port in self.ports.values():
            port.close()
        if self.proc is not None:
            children.stop(self.proc, timeout_s=10)
        for i in range(1, self.n + 1):
            subprocess.run(["ip", "link", "del", f"{self.prefix}s{i}"], capture_output=True)


class Bmv2:
    """One simple_switch whose port i is veth `<prefix>s<i>`; tests use `<prefix>h<i>`."""

    def __init__(
        self,
        ports: list[int],
        prefix: str | None = None,
        links: dict[int, str] | None = None,
        target_args: tuple[str, ...] = (),
        nice: int = 0,
        program: Path | None = None,
    ) -> None:
        self.program = program or ROOT / p4names.BMV2_JSON_PATH  # the compiled pipeline
        self.target_args = target_args  # simple_switch's own options, e.g. --priority-queues
        # simple_switch's niceness (negative: before other work; root only). A test that
        # measures its port's rate wants the rate a hardware port keeps whatever else the
        # host runs: starved beside busy loops, bmv2 drained its queue below the rate set.
        self.nice = nice
        self.prefix = prefix or f"ia{os.getpid() % 10000}"
        self.links = links or {}  # port -> an interface made by the caller (to another switch)
        self.ports = [p for p in ports if p not in self.links]
        self.thrift_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[str] | None = None

    def host_if(self, port: int) -> str:
        return f"{self.prefix}h{port}"

    def __enter__(self) -> Bmv2:
        try:
            return self._start()
        except BaseException:
            self.__exit__()
            raise

    def _start(self) -> Bmv2:
        for i in self.ports:
            sw, host = f"{self.prefix}s{i}", self.host_if(i)
            subprocess.run(["ip", "link", "del", sw], capture_output=True)
            _run("ip", "link", "add", sw, "type", "veth", "peer", "name", host)
            for dev in (sw, host):
                # No IPv6: router solicitations and DAD would be extra packets on the ports.
                _run("sysctl", "-q", "-w", f"net.ipv6.conf.{dev}.disable_ipv6=1")
                _run("ip", "link", "set", dev, "up")
            _tx_checksum_off(host)
        # Own Thrift port and notification socket: several switches (and test runs) at once.
        args = [
            tool("simple_switch") or "simple_switch",
            *("--thrift-port", str(self.thrift_port)),
            *("--notifications-addr", f"ipc:///tmp/bmv2-{self.prefix}-notifications.ipc"),
        ]
        for i in self.ports:
            args += ["-i", f"{i}@{self.prefix}s{i}"]
        for i, dev in self.links.items():
            args += ["-i", f"{i}@{dev}"]
        args.append(str(self.program))
        if self.target_args:
            args += ["--", *self.target_args]
        log = os.environ.get("INNET_AGG_BMV2_LOG")  # a file for simple_switch's packet log
        if log:
            args.insert(1, "--log-console")
            self._log = open(log, "w")  # noqa: SIM115 (closed in __exit__)
        else:
            # bmv2's default level is trace even with no log sink: every packet's log lines
            # are formatted, then dropped, and that formatting was most of its per-packet
            # CPU (docs/congestion.md, "Where the switch's time went")
            args[1:1] = ["--log-level", "off"]
        if self.nice and shutil.which("nice"):  # every thread of the switch inherits it
            args = ["nice", "-n", str(self.nice), *args]
        self.proc = subprocess.Popen(
            args, stdout=self._log or subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + 15
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"simple_switch exited: {self.proc.stderr.read().decode()}")
            try:
                self.cli("show_ports")
                break
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for i in self.ports:
            subprocess.run(["ip", "link", "del", f"{self.prefix}s{i}"], capture_output=True)
        Path(f"/tmp/bmv2-{self.prefix}-notifications.ipc").unlink(missing_ok=True)
        if self._log is not None:
            self._log.close()

    def cli(self, *commands: str) -> str:
        """Run simple_switch_CLI commands; raise if any of them reports an error."""
        env = dict(os.environ, PYTHONPATH=P4_PYTHONPATH)
        cli = tool("simple_switch_CLI") or "simple_switch_CLI"
        r = subprocess.run(
            ["/usr/bin/python3", cli, "--thrift-port", str(self.thrift_port)],
            input="\n".join(commands) + "\n",
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        )
        bad = [ln for ln in r.stdout.splitlines() if "Error" in ln or "Invalid" in ln]
        if r.returncode != 0 or bad or "Could not connect" in r.stderr + r.stdout:
            raise RuntimeError(f"simple_switch_CLI: {bad or r.stderr.strip()[-300:]}")
        return r.stdout


ETH_P_ALL = 0x0003


class RawPort:
    """A raw socket on a host-side veth: send frames into the switch, read what it sends."""

    def __init__(self, ifname: str) -> None:
        # Protocol 0 receives nothing until bound: a socket opened with ETH_P_ALL would take
        # frames of every interface (other processes' loopback traffic) until bind().
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        self.sock.bind((ifname, ETH_P_ALL))

    def close(self) -> None:
        self.sock.close()

    def send(self, frame: bytes) -> None:
        self.sock.send(frame)

    def frames(self, timeout: float, want: int | None = None) -> list[bytes]:
        """Frames received until `timeout` passes with none, or `want` have arrived."""
        out: list[bytes] = []
        self.sock.settimeout(timeout)
        while want is None or len(out) < want:
            try:
                data, addr = self.sock.recvfrom(4096)
            except TimeoutError:
                break
            if addr[2] != socket.PACKET_OUTGOING:  # our own sends show up too
                out.append(data)
        return out


class Hosts:
    """Move host-side veths of `sw` into network namespaces: host i is 10.0.0.i with MAC
    00:00:00:00:00:0i, and knows every other host's MAC (the pipeline does not answer ARP
    without ONOS). `run(i, argv)` starts a process in host i's namespace."""

    def __init__(self, sw: Bmv2, hosts: list[int]) -> None:
        self.sw, self.hosts = sw, hosts

    def ns(self, i: int) -> str:
        return f"{self.sw.prefix}n{i}"

    def __enter__(self) -> Hosts:
        try:
            return self._start()
        except BaseException:
            self.__exit__()
            raise

    def _start(self) -> Hosts:
        for i in self.hosts:
            ns, dev = self.ns(i), self.sw.host_if(i)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "set", dev, "netns", ns)
            ex = ("ip", "netns", "exec", ns)
            _run(*ex, "ip", "link", "set", dev, "address", f"00:00:00:00:00:{i:02x}")
            _run(*ex, "ip", "addr", "add", f"10.0.0.{i}/24", "dev", dev)
            _run(*ex, "ip", "link", "set", dev, "up")
            _run(*ex, "ip", "link", "set", "lo", "up")
            for j in self.hosts:
                if j != i:
                    mac = f"00:00:00:00:00:{j:02x}"
                    _run(*ex, "ip", "neigh", "add", f"10.0.0.{j}", "lladdr", mac, "dev", dev)
        return self

    def __exit__(self, *exc: object) -> None:
        for i in self.hosts:
            subprocess.run(["ip", "netns", "del", self.ns(i)], capture_output=True)

    def wait_udp_listening(
        self, i: int, port: int, proc: subprocess.Popen[str], timeout_s: float = 20.0
    ) -> None:
        """Until a socket in host i's namespace listens on UDP `port` (or `proc` exits)."""
        deadline = time.monotonic() + timeout_s
        while True:
            out = subprocess.run(
                ["ip", "netns", "exec", self.ns(i), "ss", "-Huln", f"sport = :{port}"],
                capture_output=True,
                text=True,
            ).stdout
            if out.strip():
                return
            if proc.poll() is not None:
                raise RuntimeError(
                    f"host {i}'s process exited: {proc.stderr.read() if proc.stderr else ''}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on UDP {port} in host {i} after {timeout_s} s")
            time.sleep(0.05)

    def run(self, i: int, argv: list[str], log: Path | None = None) -> subprocess.Popen[str]:
        """`argv` in host `i`'s namespace; its output in pipes, or with `log` in that file
        (a process that prints for hours must not block on a pipe nobody reads yet)."""
        if log is None:
            return subprocess.Popen(
                ["ip", "netns", "exec", self.ns(i), *argv],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        with log.open("w") as f:
            return subprocess.Popen(
                ["ip", "netns", "exec", self.ns(i), *argv], stdout=f, stderr=f, text=True
            )


def bottleneck(sw: Bmv2, port: int, dst_ip_last: int, rate: int, depth: int) -> None:
    """Forward IPv4 to 10.0.0.`dst_ip_last` out of `port`, drained at `rate` packets/s
    through a queue of `depth` packets (simple_switch's set_queue_rate and depth)."""
    key = ["0&&&0"] * 5 + [f"0x0a0000{dst_ip_last:02x}&&&0xffffffff"] + ["0&&&0"] * 3
    sw.cli(
        f"table_add {p4names.FWD_TABLE} {p4names.FWD_SET_EGRESS_PORT} {' '.join(key)} => {port} 10",
        f"set_queue_rate {rate} {port}",
        f"set_queue_depth {depth} {port}",
    )
