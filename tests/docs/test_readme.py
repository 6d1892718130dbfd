"""Every command of the README runs, as written, in a test (or a doc check says why it
cannot here), so that the README cannot go stale again.

Each `sh` block of README.md is run by bash as a script, with one stand-in: `uv run X` runs
X from the synced `.venv` (what `uv run` does after `make sync`), so that the test does not
re-sync the environment it runs in. Fixed ports in a block (8080, 32766, 9273) become free
ones. `test_every_command_is_covered` fails on a README command no test here knows, so a
new command needs a test before it lands."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from int_collector import children
from int_collector.influxd import InfluxServer, free_port

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
BIN = Path(sys.executable).parent
START_S = 600.0  # a cold start on a loaded 2-core machine


def blocks() -> list[str]:
    """The README's `sh` blocks, in order."""
    return re.findall(r"```sh\n(.*?)```", README.read_text(), flags=re.S)


def commands(block: str) -> list[str]:
    """The block's commands: continuation lines joined, comments and `&` dropped, words
    normalised (shlex), so that a comment can change and the command stays known."""
    out = []
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words and words[-1] == "&":
            words = words[:-1]
        if words:
            out.append(shlex.join(words))
    return out


def block_with(first: str) -> str:
    """The one block whose first command starts with `first`."""
    found = [b for b in blocks() if commands(b) and commands(b)[0].startswith(first)]
    assert len(found) == 1, f"README: {len(found)} sh blocks start with {first!r}"
    return found[0]


# What covers each README command: a test in this file, or a doc check naming the test that
# runs what the command runs (where this test cannot run it as written).
COVERED = {
    "make demo": "test_make_targets: the target exists; tests/e2e/test_demo_lifecycle.py runs "
    "`agg-optimizer demo` (its recipe) to the end and stopped every way",
    "make test": "CI: `.ci/run` runs it on a clean clone",
    "docker compose up -d --build": "tests/deploy: compose-go loads the file and BuildKit's "
    "parser the Dockerfiles; the images run where a Docker engine exists (docs/deploy.md)",
    "uv run agg-optimizer example": "test_the_cli_block",
    "uv run agg-optimizer solve": "test_the_cli_block",
    "uv run agg-optimizer compare": "test_the_cli_block",
    "uv run agg-optimizer schema": "test_the_cli_block",
    "uv run agg-optimizer evaluate --scenario paper --seeds 1 -o": "test_the_cli_block",
    "AGG_OPTIMIZER_ONOS_URL=": "test_the_service_and_scheduling_blocks",
    "curl -XPOST http://127.0.0.1:8080/api/v1/jobs ": "test_the_service_and_scheduling_blocks",
    "curl -XPOST http://127.0.0.1:8080/api/v1/jobs/a/placement": (
        "test_the_service_and_scheduling_blocks"
    ),
    "curl -XPOST http://127.0.0.1:8080/api/v1/jobs/a/progress": (
        "test_the_service_and_scheduling_blocks"
    ),
    "curl 'http://127.0.0.1:8080/api/v1/schedule": "test_the_service_and_scheduling_blocks",
    "uv run agg-optimizer evaluate --scenario paper --seeds 1 --strategies": (
        "test_the_service_and_scheduling_blocks"
    ),
    "make p4": "test_make_targets: the target exists and says what it needs without p4c",
    "uv run agg-agent ps": "test_the_host_agent_block",
    "uv run agg-agent worker": "test_the_host_agent_block",
    "make influxdb": "test_make_targets (runs it: a no-op once built)",
    "uv run int-collector serve": "test_the_collector_block",
    "uv run int-collector generate": "test_the_collector_block",
    "uv run int-collector decode": "test_the_collector_block",
}


def test_every_command_is_covered() -> None:
    every = [c for b in blocks() for c in commands(b)]
    assert len(every) >= 20, every  # the parser found the blocks
    unknown = [c for c in every if not any(c.startswith(k) for k in COVERED)]
    assert not unknown, f"README commands no test covers (add one to tests/docs): {unknown}"
    unused = [k for k in COVERED if not any(c.startswith(k) for c in every)]
    assert not unused, f"COVERED names commands the README no longer has: {unused}"


def test_the_strategy_list_is_the_engines() -> None:
    from agg_optimizer.placement.engine import STRATEGIES

    text = README.read_text()
    para = text[text.index("Strategies: ") :].split("\n\n", 1)[0]
    named = set(re.findall(r"`([a-z][a-z-]*)`", para)) - {"evaluate", "floor"}
    assert named == set(STRATEGIES), (named ^ set(STRATEGIES), para)


def _run(script: str, *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 600):
    """A README block as a bash script (`uv run X` = X from the synced .venv)."""
    prelude = (
        'uv() { if [ "$1" != run ]; then echo "uv $1: not a README command" >&2; return 99; fi; '
        f'shift; local exe="$1"; shift; "{BIN}/$exe" "$@"; }}\n'
        "set -euo pipefail\n"
    )
    return subprocess.run(
        ["bash", "-c", prelude + script], cwd=cwd, env={**os.environ, **(env or {})},
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@contextlib.contextmanager
def _server(line: str, what: str, readyz: str, env: dict[str, str], log: Path) -> Iterator[None]:
    """A README line that starts a server, run by bash (`uv run X` = X from .venv) in its
    own process group; ready once `readyz` answers 200, stopped on leaving."""
    proc = children.spawn(
        ["bash", "-c", f'uv() {{ shift; exe="$1"; shift; exec "{BIN}/$exe" "$@"; }}\n{line}'],
        env={**os.environ, **env}, log=log,
    )  # fmt: skip
    try:
        children.wait_ready(
            lambda: urllib.request.urlopen(readyz, timeout=2).status == 200, what,
            timeout_s=START_S, proc=proc, log=log,
        )  # fmt: skip
        yield
    finally:
        children.stop(proc)


@pytest.mark.parametrize("target", ["demo", "test", "p4", "influxdb"])
def test_make_targets(target: str) -> None:
    """The targets the README names exist (a dry run parses their recipes); `make
    influxdb` runs for real (the binary is cached: it only checks it)."""
    dry = subprocess.run(["make", "-n", target], cwd=REPO, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    if target == "influxdb" and os.environ.get("INNET_AGG_INFLUXD"):
        real = subprocess.run(["make", target], cwd=REPO, capture_output=True, text=True)
        assert real.returncode == 0, real.stderr


def test_make_demo_installs_no_pytorch(tmp_path: Path) -> None:
    """The demo's sync (its arguments read from `make -n demo`) into an empty environment
    would install no torch and none of the nvidia-* wheels PyPI's torch brings; the default
    sync, which `make test` runs, would."""
    dry = subprocess.run(["make", "-n", "demo"], cwd=REPO, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    groups = re.search(r'SYNC_GROUPS="([^"]*)"', dry.stdout)
    assert groups and "--no-group train" in groups.group(1), dry.stdout
    env = {**os.environ, "UV_PROJECT_ENVIRONMENT": str(tmp_path / "venv")}
    uv = os.environ.get("UV") or "uv"

    def would_install(*extra: str) -> str:
        r = subprocess.run([uv, "sync", "--frozen", "--dry-run", *extra], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=300)  # fmt: skip
        assert r.returncode == 0, r.stderr
        return r.stdout + r.stderr

    demo = would_install(*shlex.split(groups.group(1)))
    assert " + numpy" in demo and not re.search(r"^ \+ (torch|nvidia)", demo, re.M), demo
    assert re.search(r"^ \+ torch==", would_install(), re.M)


BARE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@pytest.mark.skipif(
    not Path("/usr/lib/python3.11/EXTERNALLY-MANAGED").exists()
    or not Path("/usr/bin/python3").exists(),
    reason="the case is Debian's python3, which marks itself externally managed (PEP 668): "
    "not this machine's",
)
def test_make_installs_uv_for_a_new_user_of_debians_python(tmp_path: Path) -> None:
    """A new user: a new home, a bare PATH whose python3 is Debian's, no uv anywhere.
    `make` installs uv into ~/.local/bin from PyPI (issue 51: pip refused it, PEP 668)."""
    home = tmp_path / "home"
    home.mkdir()
    uv = home / ".local" / "bin" / "uv"
    env = {"HOME": str(home), "PATH": BARE_PATH}
    if any(Path(d, "uv").exists() for d in BARE_PATH.split(":")):
        pytest.skip("a uv on the bare PATH here would be used instead of installed")
    r = subprocess.run(["make", str(uv)], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "installing it from PyPI" in r.stdout
    v = subprocess.run([str(uv), "--version"], capture_output=True, text=True, timeout=60)
    assert v.returncode == 0 and v.stdout.startswith("uv "), v


def test_the_cli_block(tmp_path: Path) -> None:
    r = _run(block_with("uv run agg-optimizer example"), cwd=tmp_path, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "example-out"  # the block works in there: the clone stays clean
    inst = json.loads((out / "instance.json").read_text())
    assert len(inst["jobs"]) == 20
    placement = json.loads((out / "placement.json").read_text())
    assert placement["strategy"] == "agg" and len(placement["jobs"]) == 20
    assert '"$schema"' in r.stdout or '"properties"' in r.stdout  # the schema was printed
    assert any((out / "eval").iterdir()), "evaluate wrote nothing"


@pytest.fixture
def standin_onos() -> Iterator[str]:
    """The service tests' ONOS stand-in (recorded fabric, hosts 10.0.0.1-4), our ONOS app's
    resources answering as if installed."""
    sys.path.insert(0, str(REPO / "tests" / "service"))
    try:
        from onos_standin import StandinOnos
    finally:
        sys.path.pop(0)
    srv = StandinOnos()
    srv.aggregation = {}
    srv.start()
    yield srv.url
    srv.stop()


def test_the_service_and_scheduling_blocks(
    tmp_path: Path, standin_onos: str, influx: InfluxServer
) -> None:
    port = free_port()
    service, calls = block_with("AGG_OPTIMIZER_ONOS_URL="), block_with("curl -XPOST")
    start, curls = service.split("curl", 1)
    start = start.replace("http://127.0.0.1:8181/onos/v1", standin_onos)
    start = start.replace("http://127.0.0.1:8086", influx.url).replace("8080", str(port))
    env = {"AGG_OPTIMIZER_INFLUX_BUCKET": influx.bucket,
           "AGG_OPTIMIZER_DB_PATH": str(tmp_path / "db.sqlite")}  # fmt: skip
    with _server(start, "agg-optimizer serve", f"http://127.0.0.1:{port}/readyz", env,
                 tmp_path / "service.log"):  # fmt: skip
        # Each curl of both blocks, with -f: a 4xx or 5xx fails the script.
        script = (
            ("curl" + curls + calls)
            .replace("8080", str(port))
            .replace("curl ", "curl -sSf -w '\\n' ")
        )
        r = _run(script, cwd=tmp_path, timeout=1800)
        assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
        docs = [json.loads(x) for x in re.findall(r"^\{.*\}$", r.stdout, flags=re.M)]
        assert any(d.get("id") == "a" for d in docs), r.stdout[:2000]  # the job created
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/jobs/a/placement") as p:
            assert json.load(p)["status"] == "applied"


def test_the_host_agent_block(tmp_path: Path) -> None:
    block = block_with("make p4").split("\n", 1)[1]  # make p4: test_make_targets
    r = _run(block + "\nwait\n", cwd=tmp_path, timeout=300)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    # The PS completed the 5 iterations from both workers' packets (no switch: raw ones).
    ps = [m for m in re.findall(r'\{"role": "ps".*?\}', r.stdout)]
    assert len(ps) == 5 and all('"raw_packets": 64' in x for x in ps), r.stdout[-3000:]


def test_the_collector_block(tmp_path: Path, influx: InfluxServer) -> None:
    block = block_with("make influxdb")
    lines = [ln for ln in block.replace("\\\n", " ").splitlines() if ln.strip()]
    serve = next(ln for ln in lines if "int-collector serve" in ln)
    generate = next(ln for ln in lines if "int-collector generate" in ln)
    decode = next(ln for ln in lines if "int-collector decode" in ln)
    udp, http = free_port(), free_port()
    env = {
        "INT_COLLECTOR_LISTEN_PORT": str(udp),
        "INT_COLLECTOR_HTTP_PORT": str(http),
        "INT_COLLECTOR_INFLUX_URL": influx.url,
        "INT_COLLECTOR_INFLUX_BUCKET": influx.bucket,
    }
    with _server(serve, "int-collector serve", f"http://127.0.0.1:{http}/readyz", env,
                 tmp_path / "collector.log"):  # fmt: skip
        r = _run(generate.replace("32766", str(udp)), cwd=tmp_path, timeout=300)
        assert r.returncode == 0, r.stderr
        sent = int(re.search(r"sent (\d+) reports", r.stderr).group(1))  # type: ignore[union-attr]
        assert sent >= 1000, r.stderr

        def counted() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=5) as m:
                text = m.read().decode()
            got = re.search(r"^int_collector_datagrams_received_total (\S+)", text, re.M)
            return got is not None and float(got.group(1)) >= sent

        children.wait_ready(counted, "every generated report counted", timeout_s=120)
    r = _run(decode, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (report,) = json.loads(r.stdout)
    assert report["node_id"] == 3 and report["seq"] == 7
    (hop,) = report["hops"]
    assert (hop["ingress_port"], hop["egress_port"], hop["hop_latency"]) == (1, 2, 1200)
    assert hop["queue_occupancy"] == 5
