"""An ONOS 2.7 cluster on one machine for the tests: three Atomix 3.1.9 storage nodes (our
launcher, `onos-app/atomix/`, built from Maven Central by `make atomix`) and ONOS nodes from
the source build, each a private copy of the release tree with its own ports (REST, Karaf
shell, RMI, cluster messaging) on 127.0.0.1 and a `config/cluster.json` naming the Atomix
nodes, as ONOS's own deployments configure them. Every process dies with the test process.

    with AtomixCluster(tmp) as atomix, OnosCluster(atomix, 2) as onos:
        onos.nodes[0].request("GET", "/cluster")
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import requests

from agg_optimizer.service import onosd
from int_collector import children
from int_collector.influxd import free_port

REPO = Path(__file__).resolve().parents[2]
ATOMIX = REPO / "onos-app" / "atomix"
START_S = 900  # two ONOS nodes booting together beside other work on 2 cores
FORM_MIN_S = 120  # nodes READY late still get this long to see each other


def atomix_jar() -> Path | None:
    jars = sorted((ATOMIX / "target").glob("innet-agg-atomix-*.jar"))
    return jars[-1] if jars and (ATOMIX / "target" / "lib").is_dir() else None


def skip_reason() -> str | None:
    why = onosd.missing()
    if why:
        return f"real ONOS unavailable: {why}"
    if atomix_jar() is None:
        return "no onos-app/atomix/target/innet-agg-atomix-*.jar: `make atomix` builds it"
    return None


def _java() -> str:
    return str(onosd.default_java_home() / "bin" / "java")


class AtomixCluster:
    """Three Raft members on free ports of 127.0.0.1."""

    def __init__(self, base: Path, size: int = 3, name: str = "onos") -> None:
        self.base = base / "atomix"
        self.name = name
        self.ids = [f"atomix-{i + 1}" for i in range(size)]
        self.ports = [free_port() for _ in range(size)]
        self.procs: list[subprocess.Popen | None] = [None] * size

    @property
    def members(self) -> str:
        return ",".join(f"{i}@127.0.0.1:{p}" for i, p in zip(self.ids, self.ports, strict=True))

    def log(self, i: int) -> Path:
        return self.base / f"{self.ids[i]}.log"

    def __enter__(self) -> AtomixCluster:
        jar = atomix_jar()
        if jar is None:
            raise RuntimeError(skip_reason() or "no Atomix launcher")
        self.base.mkdir(parents=True, exist_ok=True)
        try:
            for i in range(len(self.ids)):
                self.start(i, wait=False)
            for i in range(len(self.ids)):
                self._wait(i)
        except BaseException:
            self.__exit__()
            raise
        return self

    def start(self, i: int, wait: bool = True) -> None:
        jar = atomix_jar()
        assert jar is not None
        self.procs[i] = children.spawn(
            [_java(), "-Xmx256m", "-jar", str(jar), "--cluster", self.name,
             "--id", self.ids[i], "--address", f"127.0.0.1:{self.ports[i]}",
             "--members", self.members, "--data", str(self.base / self.ids[i])],
            log=self.log(i),
        )  # fmt: skip
        if wait:
            self._wait(i)

    def _wait(self, i: int) -> None:
        proc = self.procs[i]

        def ready() -> bool:
            return f"atomix {self.ids[i]} ready" in self.log(i).read_text(errors="replace")

        children.wait_ready(ready, self.ids[i], timeout_s=START_S, proc=proc, log=self.log(i))

    def kill(self, i: int) -> None:
        p = self.procs[i]
        if p is not None:
            children.stop(p, timeout_s=0.1)
            self.procs[i] = None

    def __exit__(self, *exc: object) -> None:
        for i, p in enumerate(self.procs):
            if p is not None:
                children.stop(p, timeout_s=5)  # the cluster is discarded: no orderly stop
                self.procs[i] = None


def _set(path: Path, key: str, value: int) -> None:
    """`key = value` in a Karaf .cfg file (the line replaced, or added)."""
    text = path.read_text()
    line = f"{key} = {value}"
    pattern = re.compile(rf"^\s*{re.escape(key)}\s*=.*$", re.M)
    text = pattern.sub(line, text) if pattern.search(text) else text + f"\n{line}\n"
    path.write_text(text)


class OnosNode(onosd.OnosServer):
    """One ONOS node of a cluster: its own tree, ports and cluster.json."""

    def __init__(self, index: int, atomix: AtomixCluster | None, apps: tuple[str, ...]) -> None:
        """`atomix` None: a single ONOS without storage nodes (its own Raft, ONOS's test mode)."""
        super().__init__(shape="", apps=apps)
        self.index = index
        self.node_id = f"onos-{index + 1}"
        self.http_port, self.ssh_port = free_port(), free_port()
        self.cluster_port = free_port()
        etc = self.home / "apache-karaf-4.2.9" / "etc"
        _set(etc / "org.ops4j.pax.web.cfg", "org.osgi.service.http.port", self.http_port)
        _set(etc / "org.ops4j.pax.web.cfg", "org.osgi.service.http.port.secure", free_port())
        _set(etc / "org.apache.karaf.shell.cfg", "sshPort", self.ssh_port)
        _set(etc / "org.apache.karaf.management.cfg", "rmiRegistryPort", free_port())
        _set(etc / "org.apache.karaf.management.cfg", "rmiServerPort", free_port())
        config = self.home / "config"
        config.mkdir(exist_ok=True)
        if atomix is None:
            self.root = f"http://127.0.0.1:{self.http_port}"
            self.url = f"{self.root}/onos/v1"
            return
        (config / "cluster.json").write_text(
            json.dumps(
                {
                    "name": atomix.name,
                    "node": {"id": self.node_id, "ip": "127.0.0.1", "port": self.cluster_port},
                    "storage": [
                        {"id": i, "ip": "127.0.0.1", "port": p}
                        for i, p in zip(atomix.ids, atomix.ports, strict=True)
                    ],
                },
                indent=1,
            )
        )
        self.root = f"http://127.0.0.1:{self.http_port}"
        self.url = f"{self.root}/onos/v1"

    def launch(self, fresh_cache: bool = False) -> None:
        """Start the node's process (again, on its kept tree and config); `wait_ready` waits
        for it. `fresh_cache`: without Karaf's local cache (`data/`), as a container is
        recreated: ONOS 2.7 restarted on the cache of a SIGKILLed run came back in 1 of 2
        tries with every app ACTIVE in the cluster's store but no driver loaded locally (a
        bmv2 device never became available on it); from a clean cache it fetches the apps
        from the cluster and converges."""
        if fresh_cache:
            shutil.rmtree(self.home / "apache-karaf-4.2.9" / "data", ignore_errors=True)
        with socket.socket() as sk:
            if sk.connect_ex(("127.0.0.1", self.http_port)) == 0:
                raise RuntimeError(f"port {self.http_port} is taken")
        env = {
            **os.environ,
            "JAVA_HOME": str(onosd.default_java_home()),
            "ONOS_APPS": ",".join(self.apps),
            "JAVA_OPTS": onosd.JAVA_OPTS,
        }
        with open(self.dir / "onos.log", "ab") as log:
            self.proc = children.spawn(
                [str(self.home / "bin" / "onos-service"), "server"],
                cwd=self.home, env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def kill(self) -> None:
        """SIGKILL the node's whole process group (the script and Karaf's Java)."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(60)
            self.proc = None

    def cli(self, command: str, timeout_s: float = 120.0) -> str:
        raise NotImplementedError("the cluster's nodes are driven over REST")


class OnosCluster:
    """`size` ONOS nodes on one Atomix cluster, every app of `apps` active on each."""

    def __init__(self, atomix: AtomixCluster | None, size: int = 2,
                 apps: tuple[str, ...] = onosd.APPS) -> None:  # fmt: skip
        self.atomix = atomix
        self.nodes = [OnosNode(i, atomix, apps) for i in range(size)]
        self.timings: dict[str, float] = {}  # seconds from launch, for the test's report

    def __enter__(self) -> OnosCluster:
        try:
            for n in self.nodes:
                n.launch()
            t0 = time.monotonic()
            deadline = t0 + START_S
            for n in self.nodes:
                n.wait_ready(deadline - time.monotonic())
                self.timings[f"{n.node_id} ready"] = time.monotonic() - t0
            if self.atomix is not None:  # alone, ONOS names itself after its address
                self.wait_formed(max(deadline - time.monotonic(), FORM_MIN_S))
                self.timings["formed"] = time.monotonic() - t0
        except BaseException:
            self.__exit__()
            raise
        return self

    def view(self, via: OnosNode) -> dict[str, str] | str:
        """What `via` says of the cluster: each node's status, or why it did not say."""
        try:
            r = via.request("GET", "/cluster")
        except requests.RequestException as e:
            return type(e).__name__
        if r.status_code != 200:
            return f"HTTP {r.status_code}"
        return {n["id"]: n.get("status", "?") for n in r.json().get("nodes", [])}

    def active_nodes(self, via: OnosNode) -> set[str]:
        seen = self.view(via)
        return {k for k, v in seen.items() if v == "READY"} if isinstance(seen, dict) else set()

    def wait_formed(self, timeout_s: float, nodes: list[OnosNode] | None = None) -> None:
        """Until every node in `nodes` (default all) sees all of them READY; on a timeout
        the error says what each node saw last."""
        nodes = nodes or [n for n in self.nodes if n.proc is not None]
        want = {n.node_id for n in nodes}

        def formed() -> bool:
            return all(want <= self.active_nodes(n) for n in nodes)

        try:
            onosd.wait_for(formed, timeout_s, f"ONOS nodes {sorted(want)} READY on each")
        except AssertionError as e:
            seen = {n.node_id: self.view(n) for n in nodes}
            raise AssertionError(f"{e}; last seen: {seen}") from None

    def __exit__(self, *exc: object) -> None:
        for n in self.nodes:
            n.stop(remove=True)
