"""docs/deploy.md's commands that run without a Docker engine, run as written against the real
parts they talk to: the InfluxDB 2 query for INT points (its curl, against InfluxDB 1.8.10,
which serves the same v2 query API; the compose stack test runs it in the stack too)."""

from __future__ import annotations

import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

from int_collector.influxd import InfluxServer

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "deploy.md"


def shell_block_after(marker: str) -> str:
    """The first ```sh block after `marker` in deploy.md, its indentation removed."""
    text = DOC.read_text()
    start = text.index(marker)
    m = re.search(r"```sh\n(.*?)```", text[start:], re.S)
    assert m, f"no sh block after {marker!r}"
    return "\n".join(line.strip() for line in m.group(1).splitlines())


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl on PATH")
def test_the_documented_influxdb2_query_shows_int_points(tmp_path: Path) -> None:
    srv = InfluxServer(database="telemetry")  # the stack's bucket name
    srv.start()
    try:
        line = b"int_link,switch=1,port=2 utilization=0.25,queue_depth=3i"
        req = urllib.request.Request(f"{srv.url}/write?db=telemetry", data=line, method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 204
        script = shell_block_after("**INT points in InfluxDB 2**")
        assert "localhost:8086" in script
        script = script.replace("localhost:8086", srv.url.removeprefix("http://"))
        r = subprocess.run(["bash", "-c", "set -e; " + script], capture_output=True, text=True,
                           timeout=120)  # fmt: skip
        assert r.returncode == 0, r.stderr
        rows = [ln for ln in r.stdout.splitlines() if "int_link" in ln]
        assert rows and any("utilization" in ln for ln in rows), r.stdout
    finally:
        srv.stop()
