"""The collector's image, built from its Dockerfile by a real Docker engine, runs as its own
user and stays healthy: it loads the receive path compiled at build time from a cache folder
that user owns (a root-owned one made every start fail: numba refuses a cache folder it
cannot write). Skipped, saying why, where no engine runs; where no registry can be reached
the base image is a local stand-in (tests/deploy/standins/README.md)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from int_collector import children
from int_collector.influxd import free_port

from . import standin_images

REPO = Path(__file__).resolve().parents[2]
TAG = "innet-agg/int-collector:test"


def _docker(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


def _engine_missing() -> str | None:
    if shutil.which("docker") is None:
        return "no docker CLI"
    try:
        if _docker("info", timeout=20).returncode != 0:
            return "no Docker engine answers `docker info`"
    except subprocess.TimeoutExpired:
        return "`docker info` did not answer in 20 s"
    return standin_images.missing_base()


@pytest.fixture(scope="module")
def image() -> str:
    why = _engine_missing()
    if why:
        pytest.skip(f"collector image not run: {why}")
    try:
        standin_images.base_images(print)  # where no registry can be reached
    except standin_images.StandInError as e:
        pytest.fail(str(e))
    # Cold on a busy machine: uv sync and the numba compile inside the build.
    r = _docker("build", "-f", "int-collector/Dockerfile", "-t", TAG, str(REPO), timeout=1800)
    assert r.returncode == 0, r.stderr[-4000:]
    return TAG


@pytest.fixture
def container(image: str) -> Iterator[tuple[str, int]]:
    name, http = f"innet-agg-test-{uuid.uuid4().hex[:8]}", free_port()
    r = _docker(
        "run", "-d", "--name", name, "-p", f"127.0.0.1:{http}:9273",
        "-e", "INT_COLLECTOR_HTTP_HOST=0.0.0.0", "-e", "INT_COLLECTOR_INFLUX_URL=http://127.0.0.1:9",
        image,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    try:
        yield name, http
    finally:
        _docker("rm", "-f", name)


def _health(http: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{http}/healthz", timeout=3) as r:
        return json.load(r)


def test_the_image_runs_as_its_user_and_stays_healthy(container: tuple[str, int]) -> None:
    name, http = container

    def running() -> bool:
        state = json.loads(_docker("inspect", name).stdout)[0]["State"]
        if not state["Running"]:
            logs = _docker("logs", name).stderr[-2000:]
            raise children.NotReady(f"the container stopped ({state['ExitCode']}): {logs}")
        return True

    children.wait_ready(
        lambda: running() and _health(http)["status"] == "ok", "the collector's /healthz",
        timeout_s=600,
    )  # fmt: skip
    assert _docker("exec", name, "id", "-un").stdout.strip() == "app"
    owner = _docker("exec", name, "stat", "-c", "%U", "/opt/numba-cache").stdout.strip()
    assert owner == "app"
    logs = _docker("logs", name).stderr
    assert "cannot cache" not in logs and "receiving after" in logs, logs[-2000:]
    # Stays up: still healthy after several of compose's 10 s health-check intervals' worth
    # of snapshots, never restarted.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        assert _health(http)["status"] == "ok"
        time.sleep(1)
    state = json.loads(_docker("inspect", name).stdout)[0]
    assert state["State"]["Running"] and state["RestartCount"] == 0
