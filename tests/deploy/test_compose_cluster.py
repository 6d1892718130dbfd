"""The compose profile `cluster` as compose-go loads it, against the code it configures: the
ONOS nodes' cluster.json names the Atomix nodes as they run, the Atomix nodes agree on
their members, the optimizer replicas' settings validate, point at the three ONOS nodes and
at the database compose creates, and share the token. tests/deploy/test_stack_cluster.py
runs it on a Docker engine."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlsplit

import pytest

from .conftest import load_compose
from .test_services import points_at, settings_of

ATOMIX = ("atomix-1", "atomix-2", "atomix-3")
ONOS = ("onos-1", "onos-2", "onos-3")
REPLICAS = ("optimizer-1", "optimizer-2")
ATOMIX_PORT = 5679  # the launcher's --address port; onos-app/atomix/README.md


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return load_compose(tmp_path_factory.mktemp("cluster"), profiles=("cluster",))


def options(command: list[str]) -> dict[str, str]:
    assert len(command) % 2 == 0, command
    return {command[i]: command[i + 1] for i in range(0, len(command), 2)}


def cluster_json(model: dict[str, Any], node: str) -> dict[str, Any]:
    (cfg,) = model["services"][node]["configs"]
    assert cfg["target"] == "/root/onos/config/cluster.json"  # ../config from Karaf's home
    return json.loads(model["configs"][cfg["source"]]["content"])


def test_atomix_nodes_agree_on_their_members_and_each_is_one(cluster: dict[str, Any]) -> None:
    opts = [options(cluster["services"][a]["command"]) for a in ATOMIX]
    assert len({o["--members"] for o in opts}) == 1
    assert len({o["--cluster"] for o in opts}) == 1
    members = opts[0]["--members"].split(",")
    assert members == [f"{a}@{a}:{ATOMIX_PORT}" for a in ATOMIX]
    for a, o in zip(ATOMIX, opts, strict=True):
        assert f"{o['--id']}@{o['--address']}" == f"{a}@{a}:{ATOMIX_PORT}"
        vols = cluster["services"][a]["volumes"]
        assert [v["target"] for v in vols] == [o["--data"]]  # Raft logs survive a restart
    assert len({v["source"] for a in ATOMIX for v in cluster["services"][a]["volumes"]}) == 3


def test_onos_nodes_name_themselves_and_the_atomix_nodes(cluster: dict[str, Any]) -> None:
    name = options(cluster["services"]["atomix-1"]["command"])["--cluster"]
    for node in ONOS:
        c = cluster_json(cluster, node)
        assert c["name"] == name
        # the healthcheck asks ONOS about the node named by the container's hostname
        assert c["node"]["id"] == c["node"]["host"] == cluster["services"][node]["hostname"]
        assert c["node"]["host"] == node
        assert c["storage"] == [{"id": a, "host": a, "port": ATOMIX_PORT} for a in ATOMIX]
        assert cluster["services"][node]["image"] == cluster["services"]["onos"]["image"]
        deps = cluster["services"][node]["depends_on"]
        assert {a: d["condition"] for a, d in deps.items()} == dict.fromkeys(
            ATOMIX, "service_healthy"
        )


def test_the_app_is_installed_once_every_node_is_ready(cluster: dict[str, Any]) -> None:
    svc = cluster["services"]["onos-cluster-app"]
    assert svc["command"] == cluster["services"]["onos-app"]["command"]
    # written through onos-1; every node checked to serve the app's REST at the end
    urls = svc["environment"]["ONOS_URL"].split(",")
    assert len(urls) == len(ONOS)
    for url, node in zip(urls, ONOS, strict=True):
        points_at(url, cluster, node)
        assert urlsplit(url).path == "/onos/v1"
    assert "--probe" in svc["command"]
    assert {n: d["condition"] for n, d in svc["depends_on"].items()} == dict.fromkeys(
        ONOS, "service_healthy"
    )


@pytest.mark.parametrize("replica", REPLICAS)
def test_replicas_share_postgres_and_reach_every_onos_node(
    replica: str, cluster: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = cluster["services"][replica]
    for key in svc["environment"]:
        assert key.startswith("AGG_OPTIMIZER_"), key
    s = settings_of("optimizer", svc, monkeypatch)
    urls = s.onos_urls()
    assert len(urls) == 3
    for url, node in zip(urls, ONOS, strict=True):
        points_at(url, cluster, node)
        assert urlsplit(url).path == "/onos/v1"
    assert s.database_url is not None
    db = urlsplit(s.database_url.get_secret_value())
    pg = cluster["services"]["postgres"]["environment"]
    assert (db.hostname, db.port) == ("postgres", 5432)
    assert (db.username, db.password, db.path) == (
        pg["POSTGRES_USER"],
        pg["POSTGRES_PASSWORD"],
        "/" + pg["POSTGRES_DB"],
    )
    deps = svc["depends_on"]
    assert deps["postgres"]["condition"] == "service_healthy"
    assert deps["onos-cluster-app"]["condition"] == "service_completed_successfully"
    # one token for both: the file on the volume they share, written by optimizer-1 first
    assert s.api_token_file is not None
    mounts = {v["target"]: v["source"] for v in svc["volumes"]}
    assert mounts == {str(s.api_token_file.parent): "optimizer-cluster-data"}


def test_replicas_lead_the_same_fabric(
    cluster: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One leader per fabric name (docs/service.md, "Replicas"): they must agree on it."""
    names = {settings_of("optimizer", cluster["services"][r], monkeypatch).fabric_name()
             for r in REPLICAS}  # fmt: skip
    assert len(names) == 1
    assert cluster["services"]["optimizer-2"]["depends_on"]["optimizer-1"]["condition"] == (
        "service_healthy"
    )


def test_postgres_healthcheck_asks_over_tcp_for_the_database(cluster: dict[str, Any]) -> None:
    svc = cluster["services"]["postgres"]
    test = svc["healthcheck"]["test"]
    assert test[:2] == ["CMD", "pg_isready"], test
    args = options(test[2:])
    env = svc["environment"]
    assert args == {"-h": "127.0.0.1", "-U": env["POSTGRES_USER"], "-d": env["POSTGRES_DB"]}


def test_every_long_running_cluster_service_has_a_healthcheck(cluster: dict[str, Any]) -> None:
    for name, svc in cluster["services"].items():
        if "cluster" in svc.get("profiles", []) and svc.get("restart", "no") != "no":
            assert "healthcheck" in svc, name


def test_onos_nodes_are_restarted_when_not_ready_within_their_start_period(
    cluster: dict[str, Any],
) -> None:
    """The entrypoint's watchdog and the healthcheck use one probe, and the watchdog gives
    a node the healthcheck's start period (docs/deploy.md, "Cluster profile")."""
    for node in ONOS:
        svc = cluster["services"][node]
        script = svc["entrypoint"][2]
        assert svc["entrypoint"][:2] == ["bash", "-c"]
        assert svc["healthcheck"]["test"] == ["CMD", "bash", "/tmp/onos-ready"]
        assert "cat > /tmp/onos-ready" in script and "bash /tmp/onos-ready" in script
        assert "rm -rf apache-karaf-*/data" in script  # every start from a clean cache
        assert svc["command"] == ["server"]  # the image's own command
        assert float(svc["environment"]["ONOS_READY_S"]) == seconds(
            svc["healthcheck"]["start_period"]
        )


def seconds(duration: str) -> float:
    """A Go duration as compose-go writes it ("15m0s")."""
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:([\d.]+)s)?", duration)
    assert parts and duration, duration
    h, m, sec = (float(g or 0) for g in parts.groups())
    return 3600 * h + 60 * m + sec
