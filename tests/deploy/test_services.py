"""Our services in docker-compose.yml against their own code: every environment variable is
a setting the service has, with a value it accepts; commands parse with its CLI; URLs and
ports point at the services that serve them; healthchecks ask routes that exist."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import typer
from fastapi.testclient import TestClient

from agg_optimizer.cli import app as optimizer_cli
from agg_optimizer.service.app import create_app
from agg_optimizer.service.settings import Settings as OptimizerSettings
from int_collector.cli import _host_port
from int_collector.cli import app as collector_cli
from int_collector.service import start_http
from int_collector.settings import Settings as CollectorSettings
from int_collector.settings import load_settings

from .conftest import REPO

SETTINGS = {  # service -> (settings class, environment prefix)
    "int-collector": (CollectorSettings, "INT_COLLECTOR_"),
    "optimizer": (OptimizerSettings, "AGG_OPTIMIZER_"),
}
CLIS = {"int-collector": collector_cli, "int-generator": collector_cli, "optimizer": optimizer_cli}


def parse_cli(app: typer.Typer, argv: list[str]) -> dict[str, Any]:
    """The subcommand's parameters, parsed and converted by click as the CLI would."""
    group: Any = typer.main.get_command(app)  # typer's own (vendored) click
    parent = group.context_class(group, info_name="cli")
    sub = group.get_command(parent, argv[0])
    assert sub is not None, f"no subcommand {argv[0]!r}"
    return sub.make_context(argv[0], list(argv[1:]), parent=parent).params


def settings_of(service: str, svc: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Any:
    cls, prefix = SETTINGS[service]
    for k in list(os.environ):
        if k.startswith(prefix):
            monkeypatch.delenv(k)
    for k, v in svc["environment"].items():
        monkeypatch.setenv(k, v)
    return load_settings(None) if cls is CollectorSettings else cls()


def container_ports(svc: dict[str, Any], protocol: str = "tcp") -> set[int]:
    return {p["target"] for p in svc.get("ports", []) if p["protocol"] == protocol}


def points_at(url: str, model: dict[str, Any], service: str, protocol: str = "tcp") -> None:
    u = urlsplit(url)
    assert u.hostname == service, url
    assert u.port in container_ports(model["services"][service], protocol), url


def healthcheck_url(svc: dict[str, Any]) -> str:
    test = svc["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"], test
    m = re.search(r"urlopen\('([^']+)'", test[3])
    assert m, test
    return m.group(1)


@pytest.mark.parametrize("service", SETTINGS)
def test_environment_names_are_settings_of_the_service(service: str, model: dict[str, Any]) -> None:
    cls, prefix = SETTINGS[service]
    for key in model["services"][service]["environment"]:
        assert key.startswith(prefix), f"{service}: {key} is not one of its {prefix}* settings"
        assert key.removeprefix(prefix).lower() in cls.model_fields, f"{service}: no {key}"


@pytest.mark.parametrize("service", SETTINGS)
def test_services_accept_their_environment_and_find_influxdb(
    service: str, model: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    s = settings_of(service, model["services"][service], monkeypatch)
    init = model["services"]["influxdb"]["environment"]
    points_at(s.influx_url, model, "influxdb")
    token = s.influx_token if isinstance(s.influx_token, str) else s.influx_token.get_secret_value()
    assert token == init["DOCKER_INFLUXDB_INIT_ADMIN_TOKEN"]
    assert s.influx_org == init["DOCKER_INFLUXDB_INIT_ORG"]
    assert s.influx_bucket == init["DOCKER_INFLUXDB_INIT_BUCKET"]


def test_optimizer_finds_onos_keeps_its_state_and_keeps_a_generated_token_in_it(
    model: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = model["services"]["optimizer"]
    s = settings_of("optimizer", svc, monkeypatch)
    points_at(s.onos_url, model, "onos")
    default = urlsplit(OptimizerSettings.model_fields["onos_url"].default)
    assert urlsplit(s.onos_url).path == default.path == "/onos/v1"
    assert s.decisions_bucket in (None, s.influx_bucket)  # where the dashboard looks
    mounts = [v["target"] for v in svc["volumes"] if v["type"] == "volume"]
    assert str(Path(s.db_path).parent) in mounts, "the SQLite state would die with the container"
    # No token given: one is generated into the state volume, so the published port is
    # never open to anyone (the service refuses 0.0.0.0 without a token).
    assert not (s.api_token and s.api_token.get_secret_value())
    assert s.api_token_file is not None and str(s.api_token_file.parent) in mounts


def test_onos_setup_services_use_the_onos_rest_base(model: dict[str, Any]) -> None:
    for name in ("onos-app", "onos-fabric", "onos-netcfg"):
        url = model["services"][name]["environment"]["ONOS_URL"]
        points_at(url, model, "onos")
        assert urlsplit(url).path == "/onos/v1"


@pytest.mark.parametrize("service", CLIS)
def test_commands_parse_with_the_services_cli(service: str, model: dict[str, Any]) -> None:
    parse_cli(CLIS[service], model["services"][service]["command"])


def test_collector_receives_where_switches_and_the_generator_send(
    model: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = model["services"]["int-collector"]
    listen = parse_cli(collector_cli, svc["command"])["listen"]
    host, port = _host_port(listen, "--listen")
    assert host == "0.0.0.0"
    assert container_ports(svc, "udp") == {port}
    # The port the P4 pipeline's tests and the protocol document use for reports.
    assert port == CollectorSettings.model_fields["listen_port"].default
    protocols = (REPO / "docs" / "protocols.md").read_text()
    assert re.search(rf"default port {port}\b", protocols)
    gen = parse_cli(collector_cli, model["services"]["int-generator"]["command"])
    points_at("udp://" + gen["target"], model, "int-collector", "udp")
    s = settings_of("int-collector", svc, monkeypatch)
    assert s.http_host == "0.0.0.0"  # the published metrics port reaches it
    assert s.http_port in container_ports(svc)


def test_collector_healthcheck_asks_its_health_route_and_fails_on_503(
    model: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = model["services"]["int-collector"]
    url = urlsplit(healthcheck_url(svc))
    s = settings_of("int-collector", svc, monkeypatch)
    assert (url.hostname, url.port) == ("127.0.0.1", s.http_port)
    status = [200]
    local = s.model_copy(update={"http_host": "127.0.0.1", "http_port": 0})
    http = start_http(local, lambda: {}, lambda: (status[0], {"status": "x"}))
    try:
        port = http.server_address[1]
        probe = svc["healthcheck"]["test"][3].replace(f":{url.port}/", f":{port}/")
        assert probe != svc["healthcheck"]["test"][3]

        def check() -> int:
            return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode

        assert check() == 0
        status[0] = 503  # degraded: a worker not receiving or InfluxDB failing
        assert check() != 0
        wrong = probe.replace(url.path, "/nothing-here")
        status[0] = 200
        assert subprocess.run([sys.executable, "-c", wrong], capture_output=True).returncode != 0
    finally:
        http.shutdown()
        http.server_close()


def test_optimizer_listens_where_published_and_its_healthcheck_route_exists(
    model: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    svc = model["services"]["optimizer"]
    args = parse_cli(optimizer_cli, svc["command"])
    assert args["host"] == "0.0.0.0"
    assert container_ports(svc) == {args["port"]}
    url = urlsplit(healthcheck_url(svc))
    assert (url.hostname, url.port) == ("127.0.0.1", args["port"])
    s = settings_of("optimizer", svc, monkeypatch).model_copy(
        update={"db_path": tmp_path / "db", "api_token_file": tmp_path / "api-token"}
    )
    app = create_app(s, loop=False)
    assert url.path in {getattr(r, "path", None) for r in app.routes}
    assert TestClient(app).get(url.path).status_code == 200  # liveness: no ONOS needed
    app.state.service.close()
