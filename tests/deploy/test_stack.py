"""`docker compose up` for real (issue 32): the project's docker-compose.yml, started by a
Docker engine, every service healthy, then walked as docs/deploy.md tells a user to: the
synthetic profile's null fabric in ONOS, the app installed by the one-shot service, INT
reports in InfluxDB, a job created and placed through the API with the token compose
generated, its intents INSTALLED and its aggregators held by the app; `down` and `up`
again keep the optimizer's state.

Runs where a Docker engine answers and the images that cannot be pulled here exist
locally (tests/deploy/standins/README.md); skips naming what is missing otherwise. The
stack runs as its own compose project on free ports, and is removed (volumes too) after.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from int_collector.influxd import free_port

from . import standin_images
from .conftest import COMPOSE_FILE, REPO

OVERRIDE = REPO / "tests" / "deploy" / "compose.standins.yml"
UP_TIMEOUT_S = 1800  # image builds from cold caches on a loaded 2-core machine


def missing() -> str | None:
    """Why the stack cannot run here, or None."""
    if shutil.which("docker") is None:
        return "no docker CLI"
    try:
        if standin_images.docker("info", "--format", "{{.ServerVersion}}", timeout=30).returncode:
            return "no Docker engine answers `docker info`"
        if standin_images.docker("compose", "version", timeout=30).returncode:
            return "no `docker compose` (v2 plugin)"
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"docker did not answer: {e}"
    return standin_images.missing_inputs()


REASON = missing()
pytestmark = pytest.mark.skipif(bool(REASON), reason=str(REASON))


def compose_up(compose: Any, log: Path, timeout_s: float = UP_TIMEOUT_S) -> None:
    """`up -d --build`, then every service ready: running and, with a healthcheck, healthy;
    a one-shot (restart "no") running or exited 0. Not `up --wait`: it fails when a
    one-shot that no service waits for has already finished (compose v2.40 takes any exited
    container as a failure, pkg/compose/convergence.go `isServiceHealthy`); the emulated
    stack's onos-netcfg did so once it no longer sat out a fixed quiet time."""
    r = compose("up", "-d", "--build", timeout=timeout_s + 60)
    if r.returncode:
        logs = compose("logs", "--no-color", "--tail", "80").stdout
        raise AssertionError(f"compose up failed ({log}): {r.stderr[-1500:]}\n{logs}")
    deadline = time.monotonic() + timeout_s
    while True:
        r = compose("ps", "-a", "--format", "json", timeout=60)
        rows = [json.loads(ln) for ln in r.stdout.splitlines() if ln.strip().startswith("{")]
        pending = []
        for c in rows:
            state, health = c.get("State", ""), c.get("Health", "")
            if state == "exited" and c.get("ExitCode") != 0:
                logs = compose("logs", "--no-color", "--tail", "80", c["Service"]).stdout
                raise AssertionError(f"{c['Service']} exited {c.get('ExitCode')} ({log}):\n{logs}")
            if state == "exited" or (state == "running" and health in ("", "healthy")):
                continue
            pending.append(f"{c['Service']}: {state} {health}".strip())
        if rows and not pending:
            return
        if time.monotonic() > deadline:
            logs = compose("logs", "--no-color", "--tail", "40").stdout
            raise AssertionError(f"not ready after {timeout_s:.0f} s: {pending} ({log})\n{logs}")
        time.sleep(2)


def exit_code(compose: Any, service: str, timeout_s: float) -> int:
    """A one-shot's exit status, once it exited. Not `compose wait`: it answers "no
    containers for project" when the container has already exited (CI's first run of the
    emulated stack, whose onos-netcfg had finished before the test asked)."""

    def exited() -> int | None:
        r = compose("ps", "-a", "--format", "json", service, timeout=60)
        rows = [json.loads(ln) for ln in r.stdout.splitlines() if ln.strip().startswith("{")]
        done = [c.get("ExitCode") for c in rows if c.get("State") == "exited"]
        return done[0] if rows and len(done) == len(rows) else None

    def boxed() -> list[int] | None:  # `until` wants a true value; 0 is an exit status
        code = exited()
        return None if code is None else [code]

    return until(boxed, f"{service} to exit", timeout_s)[0]


class Stack:
    """The project's compose file plus `overrides`, one `profile`, as its own project on free
    host ports; every compose call and its output logged to tmp/compose.log."""

    def __init__(
        self,
        tmp: Path,
        profile: str = "synthetic",
        overrides: tuple[Path, ...] = (OVERRIDE,),
        name: str = "innet-agg-test",
    ) -> None:
        self.project = f"{name}-{os.getpid()}"
        self.profile = profile
        self.files = [a for f in (COMPOSE_FILE, *overrides) for a in ("-f", str(f))]
        self.ports = {
            name: free_port()
            for name in ("INFLUXDB_PORT", "ONOS_PORT", "ONOS_SSH_PORT", "INT_COLLECTOR_PORT",
                         "INT_COLLECTOR_METRICS_PORT", "OPTIMIZER_PORT", "GRAFANA_PORT")
        }  # fmt: skip
        self.env = {**os.environ, **{k: str(v) for k, v in self.ports.items()}}
        self.log = tmp / "compose.log"

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        cmd = ["compose", "-p", self.project, *self.files, "--profile", self.profile, *args]
        r = standin_images.docker(*cmd, timeout=timeout, env=self.env, cwd=REPO)
        with self.log.open("a") as f:
            f.write(f"$ docker {' '.join(cmd)}\n{r.stdout}\n{r.stderr}\n")
        return r

    def up(self) -> None:
        compose_up(self.compose, self.log)

    def url(self, port: str, path: str) -> str:
        return f"http://127.0.0.1:{self.ports[port]}{path}"


def http(
    url: str,
    *,
    body: Any = None,
    method: str | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30,
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, raw.decode(errors="replace")


def until(check: Any, what: str, timeout_s: float = 600) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except OSError as e:
            last = e
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what} (last: {last})")


ONOS_AUTH = {"Authorization": "Basic b25vczpyb2Nrcw=="}  # onos:rocks, the defaults


def app_answers(stack: Stack) -> bool:
    """The app's REST resource is mounted: an unknown job gets the app's own 404 ("job: ..."),
    not the servlet's. ACTIVE is the app's state; it does not say the web context is mounted."""
    url = stack.url("ONOS_PORT", "/onos/innet-agg/aggregation/no-such-job")
    code, body = http(url, headers=ONOS_AUTH)
    said = str(body.get("message", "")) if isinstance(body, dict) else ""
    return code == 404 and said.startswith("job:")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("stack")
    standin_images.remove_stale_projects()
    try:
        standin_images.build_all()
    except standin_images.StandInError as e:
        pytest.fail(str(e))
    s = Stack(tmp)
    try:
        s.up()
        yield s
    finally:
        s.compose("down", "-v", "--remove-orphans", timeout=300)


def test_the_stack_places_a_job_end_to_end_and_keeps_it_across_down_and_up(stack: Stack) -> None:
    onos = lambda p: stack.url("ONOS_PORT", "/onos/v1" + p)  # noqa: E731
    # The null fabric of the synthetic profile (the one-shot exits 0 once its devices,
    # links and hosts are all there), and our app, active.
    code = exit_code(stack.compose, "onos-fabric", 900)
    said = stack.compose("logs", "--no-color", "onos-fabric").stdout
    assert code == 0, f"onos-fabric exited {code}: {said}"
    assert "5 devices, 12 links, 6 hosts" in said, said
    devices = http(onos("/devices"), headers=ONOS_AUTH)[1]["devices"]
    assert len(devices) == 5, devices
    code, app = http(onos("/applications/org.innetagg.app"), headers=ONOS_AUTH)
    assert code == 200 and app["state"] == "ACTIVE", app
    until(lambda: app_answers(stack), "the app's REST resource")
    hosts = until(lambda: http(onos("/hosts"), headers=ONOS_AUTH)[1]["hosts"], "hosts")
    # INT reports from the generator, through the collector, in InfluxDB: the query
    # docs/deploy.md gives users (Flux over the v2 HTTP API, as InfluxDB 2 serves it).
    until(lambda: int_points(stack), "INT points in InfluxDB through the documented query")
    # `up -d` again, as a user does: nothing that runs is touched (the app never leaves).
    watch = AppWatch(stack)
    with watch:
        stack.up()
        assert exit_code(stack.compose, "onos-app", 900) == 0
    assert watch.seen == {"ACTIVE"}, watch.seen
    said = stack.compose("logs", "--no-color", "onos-app").stdout
    assert "already active" in said, said
    # A job through the API with the generated token.
    r = stack.compose("exec", "-T", "optimizer", "cat", "/data/api-token")
    assert r.returncode == 0, r.stderr
    auth = {"Authorization": f"Bearer {r.stdout.strip()}"}
    api = lambda p: stack.url("OPTIMIZER_PORT", "/api/v1" + p)  # noqa: E731
    ids = [h["id"] for h in hosts]
    job = {"id": "deploy-a", "workers": ids[:3], "ps": ids[3], "update_bytes": 10_000_000}
    code, body = http(api("/jobs"), body=job, headers=auth)
    assert code == 201, body
    code, placed = http(api("/jobs/deploy-a/placement"), body={}, method="POST", headers=auth,
                        timeout=300)  # fmt: skip
    assert code == 200 and placed["status"] == "applied", placed
    assert all(i["state"] == "INSTALLED" for i in placed["intents"]), placed["intents"]
    code, agg = http(stack.url("ONOS_PORT", "/onos/innet-agg/aggregation/deploy-a"),
                     headers=ONOS_AUTH)  # fmt: skip
    assert code == 200, agg
    # Down and up again: the optimizer's state volume keeps the job and its placement.
    assert stack.compose("down", timeout=300).returncode == 0
    stack.up()
    code, again = http(api("/jobs/deploy-a/placement"))
    assert code == 200 and again["job_id"] == "deploy-a", again
    # ONOS came back empty: its fabric, the app (the one-shots may still be at them) and the
    # job's intents come back; reconcile and the loop re-apply the job, aggregation with it
    # once the app answers. Until then the status may be intents-only or failed.
    assert exit_code(stack.compose, "onos-app", 900) == 0
    until(lambda: app_answers(stack), "the app's REST resource")

    # The stored status alone says nothing yet (it is the last life's until reconcile runs):
    # what counts is ONOS holding the job's aggregation and intents again.
    def aggregating() -> Any:
        code, agg = http(stack.url("ONOS_PORT", "/onos/innet-agg/aggregation/deploy-a"),
                         headers=ONOS_AUTH)  # fmt: skip
        return agg if code == 200 else None

    # Meanwhile the job never reads `applied` while ONOS lacks any of its intents.
    lied: list[Any] = []

    def aggregating_truthfully() -> Any:
        code, cur = http(api("/jobs/deploy-a/placement"))
        if code == 200 and cur["status"] == "applied":
            code, held = http(onos("/intents"), headers=ONOS_AUTH)
            states = [i["state"] for i in held.get("intents", [])] if code == 200 else []
            if len(states) < len(placed["intents"]) or set(states) != {"INSTALLED"}:
                lied.append((cur["status"], states))
        return aggregating()

    agg = until(aggregating_truthfully, "the job's aggregation in ONOS again after down and up",
                600)  # fmt: skip
    assert not lied, lied
    assert [a["switch"] for j in agg["jobs"] for a in j["aggregators"]], agg
    code, now = http(api("/jobs/deploy-a/placement"))
    assert code == 200 and now["status"] == "applied", now
    code, intents = http(onos("/intents"), headers=ONOS_AUTH)
    assert code == 200 and intents["intents"], intents
    assert all(i["state"] == "INSTALLED" for i in intents["intents"]), intents


def int_points(stack: Stack) -> bool:
    """docs/deploy.md's InfluxDB 2 query (its curl, in Python): INT link points."""
    flux = (
        'from(bucket: "telemetry") |> range(start: -5m) '
        '|> filter(fn: (r) => r._measurement == "int_link") |> limit(n: 3)'
    )
    req = urllib.request.Request(
        stack.url("INFLUXDB_PORT", "/api/v2/query?org=innet-agg"), data=flux.encode(),
        headers={"Authorization": "Token innet-agg-dev-token", "Accept": "application/csv",
                 "Content-Type": "application/vnd.flux"},
    )  # fmt: skip
    with urllib.request.urlopen(req, timeout=30) as r:
        return "int_link" in r.read().decode()


class AppWatch:
    """The app's state in ONOS read every second while a block runs."""

    def __init__(self, stack: Stack) -> None:
        self.stack, self.seen = stack, set[str]()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        url = self.stack.url("ONOS_PORT", "/onos/v1/applications/org.innetagg.app")
        while not self._stop.wait(1.0):
            try:
                code, app = http(url, headers=ONOS_AUTH)
            except OSError:
                continue
            self.seen.add(app.get("state", "?") if code == 200 else f"HTTP {code}")

    def __enter__(self) -> AppWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


def test_a_collector_that_dies_comes_back_by_itself(stack: Stack) -> None:
    """Its process SIGKILLed (as a crash or the OOM killer would): `restart: unless-stopped`
    brings the container back and healthy with no one's help. (`docker kill` is an
    operator's stop, which Docker does not undo: docs/deploy.md.)"""
    r = stack.compose("ps", "-q", "int-collector")
    cid = r.stdout.strip()
    assert cid, r.stderr
    pid = standin_images.docker("inspect", "-f", "{{.State.Pid}}", cid).stdout.strip()
    before = standin_images.docker("inspect", "-f", "{{.RestartCount}}", cid).stdout.strip()
    # the container's init (init: true) ends with its child, the collector
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    assert children, f"no collector process under the container's init {pid}"
    os.kill(int(children[0]), 9)

    def back() -> bool:
        state = standin_images.docker(
            "inspect", "-f", "{{.RestartCount}} {{.State.Status}} {{.State.Health.Status}}", cid
        ).stdout.split()
        return len(state) == 3 and state[0] != before and state[1:] == ["running", "healthy"]

    until(back, "the collector restarted and healthy", 300)


def test_the_optimizers_image_loads_the_routing_search_its_build_compiled(stack: Stack) -> None:
    """The image has no C compiler (python:3.11-slim), so a large fabric routes with numba's
    kernel: compiled by the image's build into /opt/numba-cache, which the service's user
    owns, and loaded from there by a process in the container, not compiled again."""
    probe = (
        "import json; from agg_optimizer import shortest_paths as s; ok = s.preload(); "
        "st = s._compiled.stats if s.kernel_name == 'numba' else None; "
        "print(json.dumps({'ok': ok, 'kernel': s.kernel_name, 'failed': s._failed, "
        "'hits': sum(st.cache_hits.values()) if st else None, "
        "'misses': sum(st.cache_misses.values()) if st else None}))"
    )
    r = stack.compose("exec", "-T", "optimizer", "python", "-c", probe, timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {"ok": True, "kernel": "numba", "failed": None, "hits": 1, "misses": 0}, got
    r = stack.compose("exec", "-T", "optimizer", "stat", "-c", "%U", "/opt/numba-cache")
    assert r.stdout.strip() == "app", r
