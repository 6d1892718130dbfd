"""Fixtures for the deployment checks: the compose model as compose-go loads it, Dockerfiles
as BuildKit parses them (tests/deploy/composecheck, built by `make compose-check`), and a
real InfluxDB 1.8.10 for the dashboard's queries.

No Docker engine runs here, so no image is built or started: these tests check what can be
checked without one (docs/deploy.md says which parts that leaves unverified).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
TOOL_DIR = REPO / "tests" / "deploy" / "composecheck"
PROFILES = ("synthetic", "emulated", "cluster")


def composecheck_path() -> Path:
    """Where `make compose-check` puts the tool: keyed by a hash of its sources, as the
    Makefile computes it (`cat go.mod go.sum main.go | sha256sum | cut -c1-12`)."""
    env = os.environ.get("INNET_AGG_COMPOSECHECK")
    if env:
        return Path(env)
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum", "main.go"):
        digest.update((TOOL_DIR / name).read_bytes())
    cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache_home / "innet-agg" / f"composecheck-{digest.hexdigest()[:12]}" / "composecheck"


@cache
def _tool() -> Path | str:
    path = composecheck_path()
    if path.is_file():
        return path
    if os.environ.get("INNET_AGG_COMPOSECHECK"):  # under `make test`: the build must have run
        return f"FAIL:composecheck missing at {path}: `make compose-check` should have built it"
    return f"no composecheck at {path}: run `make compose-check` (needs Go) to run this test"


def tool() -> Path:
    t = _tool()
    if isinstance(t, str):
        if t.startswith("FAIL:"):
            pytest.fail(t.removeprefix("FAIL:"))
        pytest.skip(t)
    return t


def run_tool(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # A clean environment: compose interpolates from the process environment, and the
    # developer's own variables must not decide what the test sees.
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(Path.home())}
    return subprocess.run(
        [str(tool()), *args],
        capture_output=True,
        text=True,
        env={**base, **(env or {})},
        timeout=60,
    )


def load_compose(
    tmp_dir: Path,
    *,
    profiles: tuple[str, ...] = (),
    env_file: dict[str, str] | None = None,
    compose_file: Path = COMPOSE_FILE,
) -> dict[str, Any]:
    """The normalised project (`docker compose config --format json` equivalent). An
    explicit env file (empty by default) keeps a developer's .env out of the test."""
    tmp_dir.mkdir(parents=True, exist_ok=True)
    env_path = tmp_dir / f"env-{len(list(tmp_dir.glob('env-*')))}"
    env_path.write_text("".join(f"{k}={v}\n" for k, v in (env_file or {}).items()))
    args = ["compose", "-f", str(compose_file), "--project-directory", str(REPO)]
    args += ["--env-file", str(env_path)]
    for p in profiles:
        args += ["--profile", p]
    r = run_tool(*args)
    if r.returncode != 0:
        raise ComposeError(r.stderr.strip())
    return json.loads(r.stdout)


class ComposeError(Exception):
    pass


@cache
def _default_model() -> str:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        return json.dumps(load_compose(Path(d), profiles=("*",)))


@pytest.fixture
def model() -> dict[str, Any]:
    """Every service of every profile, with the default values of all variables."""
    tool()
    return json.loads(_default_model())


@cache
def dockerfile(path: str) -> dict[str, Any]:
    r = run_tool("dockerfile", str(REPO / path))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def ignored(ignore_file: Path, paths: list[str]) -> dict[str, bool]:
    r = run_tool("ignored", str(ignore_file), *paths)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _first_line(r: subprocess.CompletedProcess[str]) -> str:
    return (r.stderr or r.stdout).strip().splitlines()[0] if (r.stderr or r.stdout).strip() else ""


@cache
def docker_missing(need: str) -> str | None:
    """Why `need` ("compose": the compose plugin; "engine": a daemon with buildx) cannot be
    used here, or None. These tests add Docker's own verdict where Docker runs."""
    docker = shutil.which("docker")
    if docker is None:
        return "no docker client on PATH"
    probes = {
        "compose": [[docker, "compose", "version"]],
        "engine": [
            [docker, "info", "--format", "{{.ServerVersion}}"],
            [docker, "buildx", "version"],
        ],
    }
    for argv in probes[need]:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            return f"`{' '.join(argv[1:3])}` fails here ({_first_line(r)})"
    return None
