"""Run a throwaway InfluxDB 1.8 server (tests, benchmark, native demo).

The binary comes from `make influxdb` (int-collector/scripts/build-influxd.sh), cached
outside the repository. The server listens on loopback only, on free ports, with Flux
enabled so the v2-compatible `/api/v2/query` works, and keeps its data in a temporary
directory removed on `stop()`.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

from . import children

VERSION = "1.8.10"
# influxd answers /ping in under a second on an idle machine; this is for a cold start
# beside other builds on a loaded 2-core machine (a 30 s bound failed there).
START_TIMEOUT_S = 300.0


def default_binary() -> Path:
    env = os.environ.get("INNET_AGG_INFLUXD")
    if env:
        return Path(env)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "innet-agg" / f"influxdb-{VERSION}" / "bin" / "influxd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class InfluxServer:
    """`start()` spawns influxd and waits for /ping; `stop()` ends it (data kept for
    `start()` again unless `stop(remove=True)`)."""

    def __init__(self, binary: Path | None = None, database: str = "telemetry") -> None:
        self.binary = Path(binary or default_binary())
        if not self.binary.is_file():
            raise FileNotFoundError(
                f"influxd not found at {self.binary}: run `make influxdb` (needs Go)"
            )
        self.database = database
        self.dir = Path(tempfile.mkdtemp(prefix="influxd-"))
        self.port = free_port()
        self.rpc_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.config = self.dir / "influxdb.conf"
        self.config.write_text(
            f"""reporting-disabled = true
bind-address = "127.0.0.1:{self.rpc_port}"
[meta]
  dir = "{self.dir}/meta"
[data]
  dir = "{self.dir}/data"
  wal-dir = "{self.dir}/wal"
  query-log-enabled = false
[http]
  bind-address = "127.0.0.1:{self.port}"
  flux-enabled = true
  log-enabled = false
  auth-enabled = false
[monitor]
  store-enabled = false
[continuous_queries]
  enabled = false
[logging]
  level = "warn"
"""
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def bucket(self) -> str:
        return f"{self.database}/autogen"

    def start(
        self, timeout_s: float = START_TIMEOUT_S, say: Callable[[str], None] | None = None
    ) -> None:
        """Start influxd and wait for /ping (saying so every 10 s through `say`); on a
        failure, stop it and raise `NotReady` naming its log."""
        self.proc = children.spawn(
            [str(self.binary), "run", "-config", str(self.config)], log=self.dir / "influxd.log"
        )

        def ping() -> bool:
            with urllib.request.urlopen(self.url + "/ping", timeout=2) as r:
                return r.status == 204

        try:
            children.wait_ready(
                ping, "InfluxDB (influxd /ping)", timeout_s=timeout_s, proc=self.proc,
                log=self.dir / "influxd.log", say=say,
            )  # fmt: skip
            self.query_v1(f'CREATE DATABASE "{self.database}"')
        except BaseException:
            self.stop()
            raise

    def query_v1(self, q: str) -> bytes:
        data = urllib.parse.urlencode({"q": q}).encode()
        with urllib.request.urlopen(self.url + "/query", data=data, timeout=10) as r:
            return r.read()

    def log_tail(self, n: int = 2000) -> str:
        try:
            return (self.dir / "influxd.log").read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self, remove: bool = False) -> None:
        if self.proc is not None:
            children.stop(self.proc)
        self.proc = None
        if remove:
            shutil.rmtree(self.dir, ignore_errors=True)
