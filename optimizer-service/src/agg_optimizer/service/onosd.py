"""Run a throwaway ONOS 2.7.0 with the null providers (tests, benchmark, native demo).

ONOS comes from `make onos` (optimizer-service/scripts/get-onos.sh) and Java 11 from
`get-java11.sh`, both cached outside the repository. The null providers simulate a
spine-leaf fabric with hosts, so intents really compile and install. Boot takes minutes on
two cores: start it once per test session.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import requests

VERSION = "2.7.0"
JAVA_VERSION = "11.0.13.1"
APPS = "drivers,null,proxyarp,hostprovider,lldpprovider"


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "innet-agg"


def default_onos() -> Path:
    env = os.environ.get("INNET_AGG_ONOS")
    return Path(env) if env else cache_dir() / f"onos-{VERSION}" / f"onos-{VERSION}"


def default_java_home() -> Path:
    env = os.environ.get("INNET_AGG_JAVA11")
    return Path(env) if env else cache_dir() / f"jre-{JAVA_VERSION}" / "java-runtime"


def missing() -> str | None:
    """Why ONOS cannot be started here, or None."""
    if not (default_java_home() / "bin" / "java").is_file():
        return f"no Java 11 at {default_java_home()}: run `make onos`"
    if not (default_onos() / "bin" / "onos-service").is_file():
        return f"no ONOS {VERSION} at {default_onos()}: run `make onos`"
    return None


class OnosServer:
    """A private copy of the unpacked release (ONOS writes into its own tree), on the
    default ports 8181 (REST) and 8101 (shell): one per machine at a time."""

    def __init__(self, shape: str = "spineleaf,2,3,2") -> None:
        why = missing()
        if why:
            raise FileNotFoundError(why)
        self.shape = shape
        self.dir = Path(tempfile.mkdtemp(prefix="onos-"))
        self.home = self.dir / "onos"
        shutil.copytree(default_onos(), self.home, symlinks=True)
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = "http://127.0.0.1:8181/onos/v1"
        self.auth = ("onos", "rocks")

    def start(self, timeout_s: float = 420.0) -> None:
        env = {
            **os.environ,
            "JAVA_HOME": str(default_java_home()),
            "ONOS_APPS": APPS,
            "JAVA_OPTS": "-Xms256m -Xmx1g",
        }
        log = open(self.dir / "onos.log", "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            [str(self.home / "bin" / "onos-service"), "server"],
            cwd=self.home,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while not self._apps_active():
            if self.proc.poll() is not None:
                raise RuntimeError(f"ONOS exited with {self.proc.returncode}: {self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"ONOS not ready in {timeout_s} s: {self.log_tail()}")
            time.sleep(2)
        r = requests.post(
            f"{self.url}/configuration/org.onosproject.provider.nil.NullProviders",
            json={"topoShape": self.shape, "enabled": "true"},
            auth=self.auth,
            timeout=30,
        )
        r.raise_for_status()
        while len(self.get("/hosts").get("hosts", [])) < self._hosts_expected():
            if time.monotonic() > deadline:
                raise RuntimeError("null providers gave no hosts in time")
            time.sleep(1)

    def _hosts_expected(self) -> int:
        parts = self.shape.split(",")
        return int(parts[2]) * int(parts[3]) if parts[0] == "spineleaf" and len(parts) > 3 else 1

    def _apps_active(self) -> bool:
        try:
            r = requests.get(f"{self.url}/applications", auth=self.auth, timeout=3)
        except requests.RequestException:
            return False
        if r.status_code != 200:
            return False
        active = {a["name"] for a in r.json().get("applications", []) if a["state"] == "ACTIVE"}
        return "org.onosproject.null" in active

    def get(self, path: str) -> dict:
        r = requests.get(self.url + path, auth=self.auth, timeout=10)
        r.raise_for_status()
        return r.json()

    def log_tail(self, n: int = 3000) -> str:
        try:
            return (self.dir / "onos.log").read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self, remove: bool = False) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        self.proc = None
        if remove:
            shutil.rmtree(self.dir, ignore_errors=True)
