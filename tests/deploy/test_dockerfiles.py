"""The Dockerfiles as BuildKit parses them: what they copy exists and is sent in the build
context, their stages fit together, and the Python images' build steps work: the
`uv sync` commands of each Dockerfile run here on a copy of exactly the files it copies.

Not checked (no Docker engine here): that the base images pull, that `apt-get`/`pip` in them
succeed, that Maven builds inside the image (`make onos-app` builds the same sources here).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.specifiers import SpecifierSet

from . import standin_images
from .conftest import REPO, docker_missing, dockerfile, ignored

PYTHON_IMAGES = {  # Dockerfile -> the workspace member it packages
    "optimizer-service/Dockerfile": "optimizer-service",
    "int-collector/Dockerfile": "int-collector",
}
ALL = [*PYTHON_IMAGES, "onos-app/Dockerfile", "onos-app/atomix/Dockerfile"]


def builds(model: dict[str, Any]) -> dict[str, list[str]]:
    """Dockerfile (relative to the repository) -> compose services built from it."""
    out: dict[str, list[str]] = {}
    for name, svc in model["services"].items():
        if "build" in svc:
            out.setdefault(svc["build"]["dockerfile"], []).append(name)
    return out


def ignore_file(path: str) -> Path:
    return REPO / f"{path}.dockerignore"


def copies(df: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for st in df["stages"] for c in st["commands"] if c["instruction"] in ("copy", "add")]


def arg_default(df: dict[str, Any], name: str) -> str:
    return next(a["default"] for a in df["args"] if a["name"] == name)


def final_cmd(df: dict[str, Any], which: str) -> list[str]:
    return next(c["cmd"] for c in df["stages"][-1]["commands"] if c["instruction"] == which)


def test_every_build_is_one_of_ours_with_the_repository_as_context(model: dict[str, Any]) -> None:
    assert set(builds(model)) == set(ALL)
    for svc in model["services"].values():
        if "build" in svc:
            assert Path(svc["build"]["context"]) == REPO


@pytest.mark.parametrize("path", ALL)
def test_parses_without_buildkit_warnings(path: str) -> None:
    df = dockerfile(path)
    assert df["warnings"] == []
    assert df["stages"][0]["name"] == "build"


@pytest.mark.parametrize("path", ALL)
def test_copy_sources_exist_and_are_in_the_context(path: str) -> None:
    df = dockerfile(path)
    assert ignore_file(path).is_file(), "without it the whole repository (.venv too) is sent"
    sources = [s for c in copies(df) if not c.get("from") for s in c["sources"]]
    assert sources
    for s in sources:
        assert list(REPO.glob(s)), f"{path}: COPY {s}: not in the repository"
    excluded = ignored(ignore_file(path), sources)
    assert not [s for s, x in excluded.items() if x], f"{path}: excluded by its .dockerignore"


def test_ignore_files_keep_the_bulk_out() -> None:
    for path in ALL:
        got = ignored(ignore_file(path), [".venv", "onos-app/target", "docs", "tests", ".git"])
        assert all(got.values()), (path, got)


@pytest.mark.parametrize("path", ALL)
def test_copy_from_names_an_earlier_stage(path: str) -> None:
    df = dockerfile(path)
    names: list[str] = []
    for st in df["stages"]:
        for c in st["commands"]:
            if c["instruction"] == "copy" and c.get("from"):
                assert c["from"] in names, f"{path}: COPY --from={c['from']}"
        names.append(st["name"])


@pytest.mark.parametrize("path", PYTHON_IMAGES)
def test_venv_moves_between_stages_to_the_same_path(path: str) -> None:
    df = dockerfile(path)
    build, final = df["stages"][0], df["stages"][-1]
    env = {
        k: v for c in build["commands"] if c["instruction"] == "env" for k, v in c["env"].items()
    }
    venv = env["UV_PROJECT_ENVIRONMENT"]
    moved = [c for c in final["commands"] if c["instruction"] == "copy" and c.get("from")]
    assert [(c["sources"], c["dest"]) for c in moved if c["sources"] == [venv]] == [([venv], venv)]
    # Besides the venv, only the image's numba cache moves (what its build compiled), to the
    # folder its ENV names and owned by the user the image runs as (numba refuses a cache
    # folder it cannot write).
    others = [c for c in moved if c["sources"] != [venv]]
    if others:
        final_env_ = {
            k: v
            for c in final["commands"]
            if c["instruction"] == "env"
            for k, v in c["env"].items()
        }
        user = next(c for c in final["commands"] if c["instruction"] == "user")["value"]
        cache = final_env_["NUMBA_CACHE_DIR"]
        assert [(c["sources"], c["dest"], c.get("chown")) for c in others] == [
            ([cache], cache, f"{user}:{user}")
        ]
    final_env = {
        k: v for c in final["commands"] if c["instruction"] == "env" for k, v in c["env"].items()
    }
    assert final_env["PATH"].split(":")[0] == f"{venv}/bin"
    # Both stages start from the same image, so the venv's interpreter path exists in both.
    assert build["base"] == final["base"] == "${PYTHON_IMAGE}"


@pytest.mark.parametrize("path", PYTHON_IMAGES)
def test_base_python_satisfies_the_workspace(path: str) -> None:
    tag = arg_default(dockerfile(path), "PYTHON_IMAGE")
    m = re.fullmatch(r"python:(\d+\.\d+)(\.\d+)?-slim(-\w+)?", tag)
    assert m, tag
    version = m.group(1) + ".0"
    for pyproject in (REPO / "pyproject.toml", REPO / PYTHON_IMAGES[path] / "pyproject.toml"):
        spec = tomllib.loads(pyproject.read_text())["project"]["requires-python"]
        assert version in SpecifierSet(spec), (pyproject, spec)


@pytest.mark.parametrize("path", PYTHON_IMAGES)
def test_entrypoint_is_the_packages_console_script(path: str) -> None:
    project = tomllib.loads((REPO / PYTHON_IMAGES[path] / "pyproject.toml").read_text())
    assert final_cmd(dockerfile(path), "entrypoint") == list(project["project"]["scripts"])


def _copy_into(src: Path, dest: str, workdir: Path, root: Path, many: bool) -> None:
    target = (root / dest.lstrip("/")) if dest.startswith("/") else workdir / dest
    if src.is_dir():  # COPY dir dest: the directory's contents into dest
        shutil.copytree(
            src, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__")
        )
    elif dest.endswith("/") or many:
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target / src.name)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)


@pytest.mark.parametrize("path", PYTHON_IMAGES)
def test_build_stage_runs_here_and_gives_the_commands_compose_runs(
    path: str, model: dict[str, Any], tmp_path: Path
) -> None:
    """Replays the build stage: WORKDIR, ENV, COPY of exactly the listed files, then each
    `uv sync` RUN in order, on a copy of the context. uv is the one on this machine, not
    the pinned one the image installs with pip; the venv links files from uv's cache
    (UV_LINK_MODE=symlink) and skips bytecode, for speed. Then the entrypoint runs with
    every command compose gives a service of this image, plus --help (click rejects an
    unknown option or subcommand before printing help)."""
    df = dockerfile(path)
    root = tmp_path / "root"
    workdir = root
    env = {
        k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")
    }
    # this machine's uv where the RUN lines look for it: `uv run` names itself in $UV, also
    # when uv is not on PATH (a new user's make test)
    uv = os.environ.get("UV") or shutil.which("uv")
    if uv:
        env["PATH"] = f"{Path(uv).parent}{os.pathsep}{env.get('PATH', '')}"
    python = re.match(r"python:(\d+\.\d+)", arg_default(df, "PYTHON_IMAGE"))
    assert python
    ran = []
    for c in df["stages"][0]["commands"]:
        kind = c["instruction"]
        if kind == "workdir":
            workdir = root / c["value"].lstrip("/")
            workdir.mkdir(parents=True, exist_ok=True)
        elif kind == "env":
            env.update(c["env"])
            env["UV_PROJECT_ENVIRONMENT"] = str(root / env["UV_PROJECT_ENVIRONMENT"].lstrip("/"))
            env.update(UV_LINK_MODE="symlink", UV_COMPILE_BYTECODE="0", UV_PYTHON=python.group(1))
        elif kind == "copy" and not c.get("from"):
            for s in c["sources"]:
                _copy_into(REPO / s, c["dest"], workdir, root, len(c["sources"]) > 1)
        elif kind == "run" and c["cmd"][0].lstrip().startswith("uv "):
            r = subprocess.run(
                c["cmd"][0], shell=True, cwd=workdir, env=env, capture_output=True, text=True,
                timeout=300,
            )  # fmt: skip
            assert r.returncode == 0, f"{path}: RUN {c['cmd'][0]}\n{r.stderr[-3000:]}"
            ran.append(c["cmd"][0])
    assert len(ran) == 2, ran  # dependencies, then the package itself
    venv_bin = Path(env["UV_PROJECT_ENVIRONMENT"]) / "bin"
    entry = final_cmd(df, "entrypoint")
    commands = [final_cmd(df, "cmd")]
    commands += [model["services"][s]["command"] for s in builds(model)[path]]
    for cmd in dict.fromkeys(map(tuple, commands)):
        argv = [str(venv_bin / entry[0]), *entry[1:], *cmd, "--help"]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
        assert r.returncode == 0, f"{shlex.join(cmd)}: {r.stdout[-1000:]}{r.stderr[-1000:]}"
        assert "Usage" in r.stdout


def test_onos_app_build_copies_what_maven_reads() -> None:
    df = dockerfile("onos-app/Dockerfile")
    pom = (REPO / "onos-app" / "pom.xml").read_text()
    copied = {
        os.path.normpath(
            os.path.join("/src", c["dest"], Path(s).name if c["dest"].endswith("/") else "")
        )
        for c in copies(df)
        if not c.get("from")
        for s in c["sources"]
    }
    needed = {m for m in re.findall(r"\$\{project\.basedir\}/\.\./([\w./-]+)", pom)}
    assert needed, "pom.xml names no ../p4 paths any more: update this test"
    for rel in needed:
        target = f"/src/{rel}"
        assert any(target == c or target.startswith(c + "/") for c in copied), rel


def test_onos_app_image_ships_the_oar_maven_names_and_the_setup_tool(model: dict[str, Any]) -> None:
    df = dockerfile("onos-app/Dockerfile")
    pom = (REPO / "onos-app" / "pom.xml").read_text()
    artifact = re.search(r"<artifactId>(innet-agg[\w-]*)</artifactId>", pom)
    assert artifact
    package = next(
        c["cmd"][0] for c in df["stages"][0]["commands"] if "package" in " ".join(c.get("cmd", []))
    )
    glob = re.search(r"cp target/(\S+\.oar) (\S+)", package)
    assert glob and glob.group(1).startswith(f"{artifact.group(1)}-"), package
    final = df["stages"][-1]["commands"]
    oar = next(c for c in final if c["instruction"] == "copy" and c.get("from") == "build")
    assert oar["sources"] == [glob.group(2)]
    tool = next(c for c in final if c["instruction"] == "copy" and not c.get("from"))
    assert tool["sources"] == ["onos-app/docker/onos_setup.py"]
    assert final_cmd(df, "entrypoint")[-1] == tool["dest"]
    assert final_cmd(df, "cmd") == ["install", oar["dest"]]
    assert model["services"]["onos-app"]["command"][:2] == ["install", oar["dest"]]


def base_images_of(path: str) -> set[str]:
    """The images a Dockerfile builds FROM, by its ARG defaults (what `--check` resolves)."""
    text = (REPO / path).read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", text, re.M))
    refs = re.findall(r"^FROM (\S+)", text, re.M)
    return {args.get(ref.removeprefix("${").removesuffix("}"), ref) for ref in refs}


@pytest.mark.parametrize("path", ALL)
def test_buildkit_checks_each_dockerfile_where_an_engine_runs(path: str) -> None:
    why = docker_missing("engine")
    if why:
        pytest.skip(f"no Docker engine to build with: {why}; BuildKit's parser checked it instead")
    # `--check` resolves the `# syntax` frontend and every base image: a Docker user pulls
    # them; where no registry answers they are the stand-ins built here (standins/README.md).
    why = standin_images.missing_base()
    if why:
        pytest.skip(f"{why}; BuildKit's parser checked the file instead")
    bases = base_images_of(path)
    assert bases <= {standin_images.PYTHON, standin_images.MAVEN, standin_images.ONOS}, bases
    try:
        standin_images.base_images(print)
        if standin_images.ONOS in bases:
            why = standin_images.missing_inputs()
            if why:
                pytest.skip(f"{why}; BuildKit's parser checked the file instead")
            standin_images.services(print)
    except standin_images.StandInError as e:
        pytest.fail(str(e))
    r = subprocess.run(
        ["docker", "buildx", "build", "--check", "-f", str(REPO / path), str(REPO)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
