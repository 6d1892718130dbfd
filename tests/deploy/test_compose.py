"""docker-compose.yml as compose-go (the loader of `docker compose`) reads it: it loads and
validates with and without profiles, variables interpolate, and the stack hangs together
(pinned images, ports, mounts, dependencies)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .conftest import COMPOSE_FILE, PROFILES, REPO, ComposeError, docker_missing, load_compose

DEFAULT_SERVICES = {"influxdb", "onos", "onos-app", "int-collector", "optimizer", "grafana"}
PROFILE_SERVICES = {
    "synthetic": {"onos-fabric", "int-generator"},
    "emulated": {"mininet", "onos-netcfg"},
    "cluster": {
        *(f"atomix-{i}" for i in (1, 2, 3)),
        *(f"onos-{i}" for i in (1, 2, 3)),
        "onos-cluster-app",
        "postgres",
        "optimizer-1",
        "optimizer-2",
    },
}


def test_default_up_is_the_six_services_of_the_mission(tmp_path: Path) -> None:
    m = load_compose(tmp_path)
    assert m["name"] == "innet-agg"
    assert set(m["services"]) == DEFAULT_SERVICES


@pytest.mark.parametrize("profile", PROFILES)
def test_each_profile_adds_its_services_and_loads_alone(profile: str, tmp_path: Path) -> None:
    m = load_compose(tmp_path, profiles=(profile,))
    assert set(m["services"]) == DEFAULT_SERVICES | PROFILE_SERVICES[profile]


def test_all_profiles_load_together(model: dict[str, Any]) -> None:
    assert set(model["services"]) == DEFAULT_SERVICES.union(*PROFILE_SERVICES.values())


def test_images_are_the_ones_architecture_names(model: dict[str, Any]) -> None:
    s = model["services"]
    assert s["onos"]["image"] == "onosproject/onos:2.7.0"
    # Users get InfluxDB 2; tests run the same Flux on 1.8.10 (architecture.md).
    assert re.fullmatch(r"influxdb:2\.\d+(\.\d+)?", s["influxdb"]["image"])
    for name, svc in s.items():
        if "build" not in svc:
            tag = svc["image"].rpartition(":")[2]
            assert ":" in svc["image"] and tag not in ("", "latest"), f"{name}: pin a tag"


def test_variables_interpolate_everywhere_they_are_used(tmp_path: Path) -> None:
    env = {
        "OPTIMIZER_PORT": "18080",
        "ONOS_PORT": "18181",
        "GRAFANA_PORT": "13000",
        "INT_COLLECTOR_PORT": "42766",
        "INFLUXDB_TOKEN": "t0ken",
        "INFLUXDB_ORG": "lab",
        "INFLUXDB_BUCKET": "int",
        "ONOS_PASSWORD": "s3cret",
    }
    m = load_compose(tmp_path, env_file=env, profiles=("*",))
    s = m["services"]

    def published(svc: str, target: int) -> str:
        return next(p["published"] for p in s[svc]["ports"] if p["target"] == target)

    assert published("optimizer", 8080) == "18080"
    assert published("onos", 8181) == "18181"
    assert published("grafana", 3000) == "13000"
    assert published("int-collector", 32766) == "42766"
    # One variable feeds InfluxDB's set-up and every client of it.
    values = [
        s["influxdb"]["environment"]["DOCKER_INFLUXDB_INIT_ADMIN_TOKEN"],
        s["int-collector"]["environment"]["INT_COLLECTOR_INFLUX_TOKEN"],
        s["optimizer"]["environment"]["AGG_OPTIMIZER_INFLUX_TOKEN"],
        s["grafana"]["environment"]["INFLUXDB_TOKEN"],
    ]
    assert values == ["t0ken"] * 4
    assert s["optimizer"]["environment"]["AGG_OPTIMIZER_INFLUX_ORG"] == "lab"
    assert s["int-collector"]["environment"]["INT_COLLECTOR_INFLUX_BUCKET"] == "int"
    for name in ("onos-app", "onos-fabric", "onos-netcfg"):
        assert s[name]["environment"]["ONOS_PASSWORD"] == "s3cret"
    assert s["optimizer"]["environment"]["AGG_OPTIMIZER_ONOS_PASSWORD"] == "s3cret"


def test_the_loader_rejects_what_docker_compose_rejects(tmp_path: Path) -> None:
    """The checks are live: the same file with one mistake each does not load."""
    text = COMPOSE_FILE.read_text()
    broken = {  # mistake -> what the loader says
        "inti": text.replace("    init: true\n", "    inti: true\n", 1),
        'undefined service "influx"': text.replace(
            "      influxdb:\n        condition: service_healthy",
            "      influx:\n        condition: service_healthy",
            1,
        ),
        'invalid duration "soon"': text.replace("interval: 5s", "interval: soon", 1),
        "undefined volume optimiser-data": text.replace(
            "- optimizer-data:/data", "- optimiser-data:/data", 1
        ),
    }
    for i, (said, variant) in enumerate(broken.items()):
        assert variant != text, said
        f = tmp_path / f"broken-{i}.yml"
        f.write_text(variant)
        with pytest.raises(ComposeError, match=re.escape(said)):
            load_compose(tmp_path, compose_file=f)


def test_host_ports_are_distinct(model: dict[str, Any]) -> None:
    seen: dict[tuple[str, str], str] = {}
    for name, svc in model["services"].items():
        for p in svc.get("ports", []):
            key = (p["published"], p["protocol"])
            assert key not in seen, f"{name} and {seen[key]} both publish {key}"
            seen[key] = name


def test_bind_mounts_exist_in_the_repository(model: dict[str, Any]) -> None:
    """compose would create a missing bind source as an empty directory, silently."""
    for name, svc in model["services"].items():
        for v in svc.get("volumes", []):
            if v["type"] == "bind":
                src = Path(v["source"])
                assert src.exists(), f"{name}: {src} does not exist"
                assert REPO in src.parents, f"{name}: {src} is outside the repository"


def test_one_shot_services_do_not_restart_and_others_do(model: dict[str, Any]) -> None:
    one_shot = {"onos-app", "onos-fabric", "onos-netcfg", "mininet", "onos-cluster-app"}
    for name, svc in model["services"].items():
        if name in one_shot:
            assert svc.get("restart", "no") == "no", name
        else:
            assert svc.get("restart") in ("unless-stopped", "on-failure"), name


def test_services_sharing_an_image_share_its_build(model: dict[str, Any]) -> None:
    """Otherwise compose would try to pull a local image name from a registry."""
    by_image: dict[str, list[dict[str, Any]]] = {}
    for svc in model["services"].values():
        by_image.setdefault(svc["image"], []).append(svc)
    for image, svcs in by_image.items():
        builds = [s.get("build") for s in svcs]
        if any(builds):
            assert all(b == builds[0] for b in builds), image


def test_waits_are_on_conditions_that_exist(model: dict[str, Any]) -> None:
    s = model["services"]
    for name, svc in s.items():
        for dep, cond in svc.get("depends_on", {}).items():
            if cond["condition"] == "service_healthy":
                assert "healthcheck" in s[dep], f"{name} waits for {dep}'s health: it has none"
            if cond["condition"] == "service_completed_successfully":
                assert s[dep].get("restart", "no") == "no", f"{dep} must be one-shot"


def test_docs_list_every_variable_with_its_one_default() -> None:
    """docs/deploy.md's table is the user's list of knobs: it must match the file, and a
    variable used in several places must have the same default everywhere."""
    defaults: dict[str, set[str]] = {}
    for name, default in re.findall(r"\$\{(\w+):-([^}]*)\}", COMPOSE_FILE.read_text()):
        defaults.setdefault(name, set()).add(default)
    assert {k: v for k, v in defaults.items() if len(v) > 1} == {}
    docs = (REPO / "docs" / "deploy.md").read_text().split("\n## Variables\n")[1].split("\n## ")[0]
    rows = re.findall(r"^\| `(\w+)` \| (?:`([^`]+)`|\(empty\)) \|", docs, re.M)
    assert dict(rows) == {k: v.pop() for k, v in defaults.items()}


def test_influxdb_first_start_values_are_ones_its_setup_accepts(model: dict[str, Any]) -> None:
    init = model["services"]["influxdb"]["environment"]
    assert len(init["DOCKER_INFLUXDB_INIT_PASSWORD"]) >= 8  # `influx setup` refuses shorter
    assert re.fullmatch(r"\d+[hdw]", init["DOCKER_INFLUXDB_INIT_RETENTION"])
    assert init["DOCKER_INFLUXDB_INIT_MODE"] == "setup"


def test_docker_compose_itself_reads_the_same_stack(model: dict[str, Any], tmp_path: Path) -> None:
    why = docker_missing("compose")
    if why:
        pytest.skip(f"docker compose not available: {why}; compose-go checked the file instead")
    empty = tmp_path / "empty.env"
    empty.write_text("")
    r = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE_FILE), "--env-file", str(empty), "--profile", "*",
         "config", "--format", "json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    theirs = json.loads(r.stdout)["services"]
    assert set(theirs) == set(model["services"])
    for name, svc in theirs.items():
        ports = {(p["target"], p.get("published"), p.get("protocol")) for p in svc.get("ports", [])}
        ours = model["services"][name].get("ports", [])
        assert ports == {(p["target"], p["published"], p["protocol"]) for p in ours}, name
