"""Run a throwaway ONOS 2.7.0 with the null providers (tests, benchmark, native demo).

ONOS is built from its public source outside the repository and cached where `make onos`
(optimizer-service/scripts/get-onos.sh) looks; Java 11 comes from `get-java11.sh`. The null
providers simulate a spine-leaf fabric with hosts, so intents really compile and install.
Boot takes a minute or more on two cores: start it once per test session.

Readiness is waited for, never assumed after a fixed time: ONOS answers 503 while its
services start, and again for a few seconds whenever an app install makes Karaf refresh the
core bundles (`ApplicationAdminService not found`); a NullProviders setting posted right after
`org.onosproject.null` turns ACTIVE can be lost, so it is re-posted until devices appear.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

VERSION = "2.7.0"
JAVA_VERSION = "11.0.13.1"
# ONOS_APPS names (org.onosproject. prefix implied). drivers.bmv2 pulls in the P4Runtime
# chain our app requires; gui is the legacy GUI that hosts our topology overlay.
APPS = (
    "drivers",
    "null",
    "proxyarp",
    "hostprovider",
    "lldpprovider",
    "drivers.bmv2",
    "inbandtelemetry",
    "gui",
)
# Karaf 4.2.9 on a Java 11 newer than 11.0.19 rejects its own jars ("Invalid CEN header")
# without this; harmless where the check does not exist.
JAVA_OPTS = "-Xms256m -Xmx1500m -Djdk.util.zip.disableZip64ExtraFieldValidation=true"


def wait_for(check: Callable[[], Any], timeout_s: float = 30.0, what: str = "") -> Any:
    """Poll `check` until it returns something truthy, and return that; an AssertionError
    naming `what` when `timeout_s` passes first (ONOS changes state asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not seen in {timeout_s} s: {what or check}")
        time.sleep(0.3)


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "innet-agg"


def default_onos() -> Path:
    env = os.environ.get("INNET_AGG_ONOS")
    return Path(env) if env else cache_dir() / f"onos-{VERSION}" / f"onos-{VERSION}"


def default_java_home() -> Path:
    env = os.environ.get("INNET_AGG_JAVA11")
    return Path(env) if env else cache_dir() / f"jre-{JAVA_VERSION}" / "java-runtime"


def port_taken() -> str | None:
    """Why an ONOS started now would not be the one answering on 8181, or None: another
    ONOS (or anything) there would answer in its place, and tests would talk to a
    stranger's devices and hosts."""
    with socket.socket() as sk:
        sk.settimeout(0.5)
        if sk.connect_ex(("127.0.0.1", 8181)) == 0:
            return "port 8181 is taken by another process (an ONOS left running?)"
    return None


def missing() -> str | None:
    """Why ONOS cannot be started here, or None."""
    if not (default_java_home() / "bin" / "java").is_file():
        return f"no Java 11 at {default_java_home()}: run `make onos`"
    if not (default_onos() / "bin" / "onos-service").is_file():
        return (
            f"no ONOS {VERSION} at {default_onos()}: it is built from source outside the "
            "repository (docs/service.md, 'Testing against ONOS'); `make onos` says more"
        )
    return None


NO_MASTER = "There is no master for available device "


def _masterless(r: requests.Response) -> str | None:
    """The device of ONOS's 500 "There is no master for available device <id>", or None."""
    if r.status_code != 500 or NO_MASTER not in r.text:
        return None
    try:
        message = str(r.json().get("message", ""))
    except ValueError:
        return None
    _, found, device = message.partition(NO_MASTER)
    return device.strip() or None if found else None


class OnosNotReady(RuntimeError):
    """ONOS did not become ready in time, or exited; carries the log's tail."""


class OnosServer:
    """A private copy of the unpacked release (ONOS writes into its own tree), on the
    default ports 8181 (REST, GUI) and 8101 (shell): one per machine at a time."""

    def __init__(self, shape: str = "spineleaf,2,3,2", apps: tuple[str, ...] = APPS) -> None:
        why = missing()
        if why:
            raise FileNotFoundError(why)
        self.shape = shape
        self.apps = apps
        self.dir = Path(tempfile.mkdtemp(prefix="onos-"))
        self.home = self.dir / "onos"
        shutil.copytree(default_onos(), self.home, symlinks=True)
        self.proc: subprocess.Popen[bytes] | None = None
        self.attached = False
        self.root = "http://127.0.0.1:8181"
        self.url = f"{self.root}/onos/v1"
        self.auth = ("onos", "rocks")

    @classmethod
    def attach(cls, home_dir: Path, shape: str = "spineleaf,2,3,2") -> OnosServer:
        """One already running from `home_dir` (an earlier OnosServer's `dir`), for working
        against a warm ONOS: `stop` leaves it alone."""
        srv = cls.__new__(cls)
        srv.shape, srv.apps, srv.dir, srv.home = shape, APPS, home_dir, home_dir / "onos"
        srv.proc = None
        srv.attached = True
        srv.root = "http://127.0.0.1:8181"
        srv.url = f"{srv.root}/onos/v1"
        srv.auth = ("onos", "rocks")
        return srv

    # --- lifecycle ----------------------------------------------------------------------

    def start(self, timeout_s: float = 600.0) -> None:
        """Boot, wait until every app is ACTIVE and the core services answer, then give the
        null providers their topology. ONOS is stopped again if any of that fails."""
        taken = port_taken()
        if taken:
            raise RuntimeError(f"cannot start ONOS: {taken}")
        env = {
            **os.environ,
            "JAVA_HOME": str(default_java_home()),
            "ONOS_APPS": ",".join(self.apps),
            "JAVA_OPTS": JAVA_OPTS,
        }
        from int_collector import children

        # Its own process group (the script, Karaf's Java), ended with this process.
        with open(self.dir / "onos.log", "ab") as log:
            self.proc = children.spawn(
                [str(self.home / "bin" / "onos-service"), "server"],
                cwd=self.home, env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            deadline = time.monotonic() + timeout_s
            self.wait_ready(deadline - time.monotonic())
            if self.shape:
                self._start_null_topology(deadline)
        except BaseException:
            self.stop()
            raise

    def wait_ready(self, timeout_s: float = 120.0, apps: tuple[str, ...] = ()) -> None:
        """Until the wanted apps are ACTIVE and devices, hosts and flows answer 200."""
        wanted = {f"org.onosproject.{a}" for a in self.apps} | set(apps)
        deadline = time.monotonic() + timeout_s
        why = "no answer yet"
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise OnosNotReady(f"ONOS exited with {self.proc.returncode}: {self.log_tail()}")
            why = self._not_ready(wanted)
            if why is None:
                return
            if time.monotonic() > deadline:
                tail = self.log_tail()
                raise OnosNotReady(f"ONOS not ready in {timeout_s:.0f} s ({why}): {tail}")
            time.sleep(1)

    def _not_ready(self, wanted: set[str]) -> str | None:
        try:
            r = self.request("GET", "/applications")
            if r.status_code != 200:
                return f"/applications answered {r.status_code}"
            active = {a["name"] for a in r.json().get("applications", []) if a["state"] == "ACTIVE"}
            if wanted - active:
                return f"apps not ACTIVE: {sorted(wanted - active)}"
            for path in ("/devices", "/hosts", "/flows", "/intents"):
                r = self.request("GET", path)
                if r.status_code != 200:
                    return f"{path} answered {r.status_code}"
        except requests.RequestException as e:
            return type(e).__name__
        return None

    def _start_null_topology(self, deadline: float) -> None:
        parts = self.shape.split(",")
        hosts = int(parts[2]) * int(parts[3]) if parts[0] == "spineleaf" and len(parts) > 3 else 1
        while True:
            r = self.request(
                "POST",
                "/configuration/org.onosproject.provider.nil.NullProviders",
                json={"topoShape": self.shape, "enabled": "true"},
            )
            posted = time.monotonic()
            while r.status_code == 200 and time.monotonic() - posted < 10:
                if len(self.get("/hosts").get("hosts", [])) >= hosts:
                    return
                time.sleep(1)
            if time.monotonic() > deadline:
                raise OnosNotReady(
                    f"null providers gave fewer than {hosts} hosts (last POST: {r.status_code})"
                )
            time.sleep(2)

    def install_app(
        self, oar: Path, name: str, timeout_s: float = 180.0, probe: str | None = None
    ) -> None:
        """Install and activate an .oar (replacing an installed one), then wait for ONOS to be
        ready again: activating may make Karaf refresh the core bundles. ONOS reports the app
        ACTIVE before pax-web has started its web context: `probe`, a path of the app's REST
        API, is asked until it answers JSON (any status; Jetty's own 404 is HTML)."""
        self.request("DELETE", f"/applications/{name}")
        deadline = time.monotonic() + timeout_s
        while True:
            with oar.open("rb") as f:
                r = self.request(
                    "POST",
                    "/applications?activate=true",
                    data=f,
                    headers={"Content-Type": "application/octet-stream"},
                    timeout=120,
                )
            if r.status_code < 300:
                break
            if r.status_code != 503 or time.monotonic() > deadline:
                raise OnosNotReady(f"installing {oar.name}: {r.status_code} {r.text[:300]}")
            time.sleep(2)
        self.wait_ready(deadline - time.monotonic(), apps=(name,))
        while probe is not None:
            r = self.request("GET", probe)
            if r.headers.get("Content-Type", "").startswith("application/json"):
                break
            if time.monotonic() > deadline:
                raise OnosNotReady(f"{probe} still answers {r.status_code} without JSON")
            time.sleep(0.5)

    def stop(self, remove: bool = False) -> None:
        if self.attached:
            return
        if self.proc is not None:
            from int_collector import children

            # Karaf's orderly stop takes 20-40 s on 2 cores; when the tree is removed next
            # nothing it writes is kept, so it gets 5 s before the SIGKILL (every test
            # session's last teardown and the cluster module's waited for it).
            children.stop(self.proc, timeout_s=5 if remove else 60)
        self.proc = None
        if remove:
            shutil.rmtree(self.dir, ignore_errors=True)

    # --- REST ---------------------------------------------------------------------------

    def request(self, method: str, path: str, **kw: object) -> requests.Response:
        """`path` under /onos/v1, or absolute from the root when it starts with /onos/."""
        url = (self.root if path.startswith("/onos/") else self.url) + path
        # ONOS beside five bmv2 and two busy loops on 2 cores stalled a GET over 15 s
        # (CI under load, twice): the harness waits longer than any stall it has shown.
        kw.setdefault("timeout", 60)
        return requests.request(method, url, auth=self.auth, **kw)  # type: ignore[arg-type]

    def get(self, path: str) -> dict:
        r = self.request("GET", path)
        device = _masterless(r)
        if device is not None:
            self.renew_mastership(device)
            r = self.request("GET", path)
        r.raise_for_status()
        return r.json()

    def renew_mastership(self, device: str, timeout_s: float = 30.0) -> None:
        """Give up this node's role for `device` and ask for it again. ONOS 2.7's periodic
        role check sometimes gets no answer from a bmv2 in time ("Failed to assert role ...
        no response"), gives the role up and takes it again; once in a while ("Inconsistent
        mastership info") its flow store is left without a master for the device while the
        mastership service says MASTER, and every `GET /flows/{device}` answers 500 "There is
        no master for available device" for good (3 min in one run, without a CPU stall). A new term
        (relinquish, then request) is taken by the flow store: answered 200 within 3 s."""
        self.request("GET", f"/mastership/{device}/relinquish")

        def mastered() -> bool:
            r = self.request("GET", f"/mastership/{device}/request")
            if r.status_code != 200 or r.json().get("role") != "MASTER":
                return False
            return _masterless(self.request("GET", f"/flows/{device}")) is None

        wait_for(mastered, timeout_s, f"{device} mastered again after relinquishing it")

    def remove_devices(self, devices: list[str], timeout_s: float = 300.0) -> None:
        """Remove P4Runtime devices and their netcfg for good, leaving GET /devices answering.

        ONOS 2.7 builds the driver of a device that connected with a pipeconf from its basic
        netcfg: a device listed without one cannot be encoded, and GET /devices answers 404
        ("pipeconf-merged driver was not found") for the rest of the session. Removing the
        netcfg first leaves the device so; removing the device first while the netcfg has a
        management address lets the provider's periodic check register it again, and it is
        left so when the netcfg goes after (CI, once each). So the basic netcfg becomes the
        plain bmv2 driver with no address (nothing to connect to, a driver ONOS can build),
        then the devices go, then the netcfg; repeated until ONOS lists none of them."""
        if not devices:
            return

        def listed() -> set[str] | None:
            r = self.request("GET", "/devices")
            return {d["id"] for d in r.json()["devices"]} if r.status_code == 200 else None

        def gone() -> bool:
            for dev in devices:
                self.request(
                    "POST",
                    "/network/configuration",
                    json={"devices": {dev: {"basic": {"driver": "bmv2"}}}},
                )
            for dev in devices:
                self.request("DELETE", f"/devices/{dev}")
            try:
                wait_for(
                    lambda: not set(devices) & (listed() or set(devices)), 10, "devices removed"
                )
            except AssertionError:
                return False
            for dev in devices:
                self.request("DELETE", f"/network/configuration/devices/{dev}")

            def back() -> bool:
                now = listed()
                return now is None or bool(set(devices) & now)

            # Listed again, or /devices not answering, within a few seconds: not done.
            try:
                wait_for(back, 3)
            except AssertionError:
                return True
            return False

        wait_for(gone, timeout_s, f"{sorted(devices)} removed from ONOS")

    def fast_readback(self, seconds: int = 2) -> None:
        """ONOS learns that a P4Runtime switch holds an entry or group (ADDED) or dropped it
        by reading it back, every 30 s by default; the switch itself is written at once.
        Poll every `seconds` instead, so that tests see the switch's state promptly."""
        for component, prop in (
            ("flow.impl.FlowRuleManager", "fallbackFlowPollFrequency"),
            ("group.impl.GroupManager", "fallbackGroupPollFrequency"),
        ):
            r = self.request(
                "POST", f"/configuration/org.onosproject.net.{component}", json={prop: str(seconds)}
            )
            r.raise_for_status()

    def table_flows(self, table_suffix: str, device: str | None = None) -> list[dict]:
        """Flow rules of a PI table (ONOS 2.7 names it in `tableName`; `tableId` is a number),
        on one device or all, leaving out those ONOS is removing."""
        flows = self.get(f"/flows/{device}" if device else "/flows").get("flows", [])
        return [
            f
            for f in flows
            if str(f.get("tableName", "")).endswith(table_suffix)
            and f.get("state") != "PENDING_REMOVE"
        ]

    def log_tail(self, n: int = 3000) -> str:
        try:
            return (self.dir / "onos.log").read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def karaf_log(self) -> str:
        logs = sorted(self.home.glob("apache-karaf-*/data/log/karaf.log"))
        return logs[-1].read_text(errors="replace") if logs else ""

    def cli(self, command: str, timeout_s: float = 120.0) -> str:
        """One command of ONOS's Karaf shell (port 8101), e.g. `null-device <id> down`,
        over ssh with a key of this copy's own, added to its `etc/keys.properties` (Karaf's
        `bin/client` logs in, then gets its channel closed by ONOS's shell). Raises with
        the output if it fails."""
        key = self.dir / "shell-key"
        if not key.exists():
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-N", "", "-f", str(key)],
                check=True, capture_output=True,
            )  # fmt: skip
            pub = (self.dir / "shell-key.pub").read_text().split()[1]
            (keys,) = self.home.glob("apache-karaf-*/etc/keys.properties")
            with keys.open("a") as f:
                f.write(f"\nonos={pub},_g_:admingroup\n")
        argv = [
            "ssh", "-p", "8101", "-i", str(key), "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR", "-o", "HostKeyAlgorithms=+ssh-rsa",
            "-o", "PubkeyAcceptedAlgorithms=+ssh-rsa", "onos@127.0.0.1", command,
        ]  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while True:  # Karaf reads the key file when it next authenticates: a moment
            r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
            out = r.stdout + r.stderr
            if r.returncode == 0 and "Error executing command" not in out:
                return out
            if time.monotonic() > deadline:
                raise RuntimeError(f"ONOS shell {command!r}: exit {r.returncode}: {out[-500:]}")
            time.sleep(1)
