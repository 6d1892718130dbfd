"""onos-app/docker/onos_setup.py, the one-shot ONOS set-up of docker-compose.yml, against a
stand-in serving the part of ONOS 2.7's REST API it uses (ApplicationsWebResource,
NullProviders configuration, hosts, devices, network configuration); and the compose file's
ONOS wiring against the app's sources (pom.xml, the pipeconf id, the P4 CPU port).

The app in a real ONOS 2.7.0 (built from source where it exists) is tests/onos's business.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from .conftest import REPO

SCRIPT = REPO / "onos-app" / "docker" / "onos_setup.py"
_spec = importlib.util.spec_from_file_location("onos_setup", SCRIPT)
assert _spec and _spec.loader
setup = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(setup)

APP = "org.innetagg.app"
BMV2 = "org.onosproject.drivers.bmv2"


def oar(version: str = "0.1.0-SNAPSHOT", requires: str = BMV2) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(
            "app.xml",
            f'<?xml version="1.0"?>\n<app name="{APP}" origin="innet-agg" version="{version}"'
            f' features="innet-agg-onos" apps="{requires}"><description>x</description></app>',
        )
        z.writestr("m2/org/innetagg/x.jar", b"jar")
    return buf.getvalue()


class StandIn:
    """ONOS's REST as far as onos_setup uses it; answers 503 for the first `starting` calls
    (Karaf still starting), checks basic auth like ONOS (401)."""

    def __init__(self, starting: int = 0, cluster: StandIn | None = None) -> None:
        # `cluster`: another node of the same cluster, whose application store this one
        # shares (ONOS's is distributed); its disk, web context and log are its own.
        self.apps: dict[str, dict[str, Any]] = (
            cluster.apps
            if cluster is not None
            else {
                BMV2: {"name": BMV2, "version": "2.7.0", "state": "INSTALLED"},
                setup.NULL_APP: {"name": setup.NULL_APP, "version": "2.7.0", "state": "INSTALLED"},
            }
        )
        # After a DELETE ONOS drops the app from its store at once and deletes its archive
        # from the disk in its own time (DistributedApplicationStore's listener): meanwhile
        # an upload is refused, 409 "already installed", as the archive is still there.
        self.archive_lingers = 0
        self.archive: set[str] = set()
        # calls of the app's REST resource answered by Jetty (HTML 404) before the app's
        # web context is up on this node, although the store says ACTIVE
        self.web_late = 0
        self.states_seen: list[str] = []  # the app's state at every call, for the tests
        self.starting = starting
        # uploads answered 503 as a starting ONOS 2.7 answered one: the first one after the
        # app was installed (the answer failed to encode), the others without doing anything
        self.codec_missing = 0
        # uploads answered 404 as ONOS 2.7 answered one while its REST context restarted
        # (activating drivers.bmv2 and friends); nothing installed
        self.restarting = 0
        self.log: list[tuple[str, str]] = []
        self.uploads: list[bytes] = []
        self.null_config: dict[str, Any] | None = None
        self.netcfg: dict[str, Any] | None = None
        self.hosts: list[dict[str, str]] = []
        self.devices: list[dict[str, str]] = []
        self.links: list[dict[str, Any]] = []
        self.null_posts = 0
        self.config_lost = 0
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, code: int, doc: Any = None) -> None:
                page = isinstance(doc, str)  # Jetty's own HTML page
                body = (
                    doc.encode() if page else json.dumps(doc).encode() if doc is not None else b""
                )
                self.send_response(code)
                self.send_header("Content-Type", "text/html" if page else "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _handle(self, method: str) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                u = urlsplit(self.path)
                stand_in.log.append((method, self.path))
                stand_in.states_seen.append(stand_in.apps.get(APP, {}).get("state", "absent"))
                if stand_in.starting > 0:
                    stand_in.starting -= 1
                    return self._reply(503)
                if self.headers.get("Authorization") != "Basic b25vczpyb2Nrcw==":  # onos:rocks
                    return self._reply(401)
                code, doc = stand_in.route(method, u.path, parse_qs(u.query), body, self.headers)
                self._reply(code, doc)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def do_DELETE(self) -> None:
                self._handle("DELETE")

            def log_message(self, *a: Any) -> None:
                return

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(
            target=self.http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/onos/v1"

    def route(self, method: str, path: str, query: dict, body: bytes, headers: Any) -> tuple:
        if path.startswith("/onos/innet-agg/"):
            if self.apps.get(APP, {}).get("state") != "ACTIVE" or self.web_late > 0:
                self.web_late = max(0, self.web_late - 1)
                return 404, "<html><body>Not Found</body></html>"  # Jetty's, not the app's
            return 404, {"code": 404, "message": f"job: {path.rsplit('/', 1)[1]}"}
        p = path.removeprefix("/onos/v1")
        m = re.fullmatch(r"/applications/([\w.]+)(/active)?", p)
        if p == "/applications" and method == "GET":
            return 200, {"applications": list(self.apps.values())}
        if p == "/applications" and method == "POST" and self.codec_missing > 0:
            self.codec_missing -= 1
            self.uploads.append(body)
            if APP not in self.apps:
                version = ET.fromstring(zipfile.ZipFile(io.BytesIO(body)).read("app.xml")).get(
                    "version", ""
                )
                self.apps[APP] = {"name": APP, "version": setup.onos_version(version),
                                  "state": "INSTALLED"}  # fmt: skip
            msg = "Service org.onosproject.codec.CodecService not found"
            return 503, {"code": 503, "message": msg}
        if p == "/applications" and method == "POST" and self.restarting > 0:
            self.restarting -= 1
            return 404, {"code": 404, "message": "Not Found"}
        if p == "/applications" and method == "POST" and self.archive:
            self.archive_lingers -= 1
            if self.archive_lingers <= 0:
                self.archive.clear()
        if p == "/applications" and method == "POST":
            assert headers.get("Content-Type") == "application/octet-stream"
            self.uploads.append(body)
            root = ET.fromstring(zipfile.ZipFile(io.BytesIO(body)).read("app.xml"))
            name, version = root.get("name"), root.get("version")
            if name in self.apps or name in self.archive:  # ONOS refuses: see archive_lingers
                return 409, {"code": 409, "message": f"Application {name} already installed"}
            active = query.get("activate") == ["true"]
            # as ONOS's Version: at most four fields split at . and -, joined by .
            fields = re.split(r"[.-]", version, maxsplit=3)
            self.apps[name] = {"name": name, "version": ".".join(fields)}
            self.apps[name]["state"] = "ACTIVE" if active else "INSTALLED"
            return 200, self.apps[name]
        if m and method == "GET":
            app = self.apps.get(m.group(1))
            return (
                (200, app) if app else (404, {"code": 404, "message": "Application is not found"})
            )
        if m and m.group(2) and method == "POST":
            self.apps[m.group(1)]["state"] = "ACTIVE"
            return 200, self.apps[m.group(1)]
        if m and method == "DELETE":
            self.apps.pop(m.group(1), None)
            if self.archive_lingers > 0:
                self.archive.add(m.group(1))
            return 204, None
        if p == setup.NULL_CONFIG and method == "POST":
            assert self.apps[setup.NULL_APP]["state"] == "ACTIVE"
            self.null_posts += 1
            if self.config_lost > 0:  # answered 200, then lost as ONOS 2.7 lost one
                self.config_lost -= 1
                return 200, None
            self.null_config = json.loads(body)
            spines, leaves, per_leaf = map(int, self.null_config["topoShape"].split(",")[1:])
            self.devices = [{"id": f"null:{i:016x}"} for i in range(spines + leaves)]
            self.links = [{"src": {}, "dst": {}} for _ in range(2 * spines * leaves)]
            self.hosts = [{"id": f"00:00:00:00:00:{i:02x}/None"} for i in range(leaves * per_leaf)]
            return 200, None
        if p == setup.NULL_CONFIG and method == "GET":
            props = {"topoShape": "configured", "enabled": "false", **(self.null_config or {})}
            return 200, {setup.NULL_CONFIG.rsplit("/", 1)[1]: props}
        if p == "/hosts":
            return 200, {"hosts": self.hosts}
        if p == "/devices":
            return 200, {"devices": self.devices}
        if p == "/links":
            return 200, {"links": self.links}
        if p == "/network/configuration" and method == "POST":
            self.netcfg = json.loads(body)
            return 200, None
        return 404, {"code": 404, "message": "not in the stand-in"}

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def onos(monkeypatch: pytest.MonkeyPatch) -> Iterator[StandIn]:
    srv = StandIn(starting=2)
    monkeypatch.setenv("ONOS_URL", srv.url)
    monkeypatch.setenv("ONOS_POLL_S", "0.02")
    monkeypatch.setenv("ONOS_WAIT_S", "5")
    monkeypatch.delenv("ONOS_USER", raising=False)
    monkeypatch.delenv("ONOS_PASSWORD", raising=False)
    yield srv
    srv.close()


def test_install_waits_for_onos_activates_requirements_then_uploads(
    onos: StandIn, tmp_path: Path
) -> None:
    f = tmp_path / "app.oar"
    f.write_bytes(oar())
    env = {"PATH": "/usr/bin:/bin", "ONOS_URL": onos.url, "ONOS_POLL_S": "0.02"}
    r = subprocess.run(  # as the image runs it
        [sys.executable, str(SCRIPT), "install", str(f)], capture_output=True, text=True, env=env
    )
    assert r.returncode == 0, r.stderr
    assert "installed and active" in r.stdout
    assert onos.uploads == [f.read_bytes()]
    assert onos.apps[APP]["state"] == "ACTIVE" and onos.apps[BMV2]["state"] == "ACTIVE"
    calls = [c for c in onos.log if c[0] == "POST"]
    assert calls == [("POST", f"/onos/v1/applications/{BMV2}/active"),
                     ("POST", "/onos/v1/applications?activate=true")]  # fmt: skip


def test_install_retries_an_upload_a_starting_onos_answers_503(
    onos: StandIn, tmp_path: Path
) -> None:
    # The first real `docker compose up`: /applications answered 200, then the upload got
    # 503 "Service org.onosproject.codec.CodecService not found" and the one-shot exited 1;
    # retried as it was, the next upload got 409: the 503'd one had installed the app.
    onos.codec_missing = 1
    f = tmp_path / "app.oar"
    f.write_bytes(oar())
    assert setup.main(["install", str(f)]) == 0
    assert onos.apps[APP]["state"] == "ACTIVE" and len(onos.uploads) == 1
    assert ("POST", f"/onos/v1/applications/{APP}/active") in onos.log


def test_install_retries_an_upload_answered_404_while_onos_restarts_its_rest(
    onos: StandIn, tmp_path: Path
) -> None:
    # The stack test's first run: the upload got 404 "Not Found" while ONOS restarted its
    # REST context; onos-app exited 1 and the synthetic fabric never came.
    onos.restarting = 2
    f = tmp_path / "app.oar"
    f.write_bytes(oar())
    assert setup.main(["install", str(f)]) == 0
    assert onos.apps[APP]["state"] == "ACTIVE" and onos.restarting == 0
    assert len(onos.uploads) == 1


def test_install_leaves_an_active_app_of_the_same_version(onos: StandIn, tmp_path: Path) -> None:
    f = tmp_path / "app.oar"
    f.write_bytes(oar())
    assert setup.main(["install", str(f)]) == 0
    assert setup.main(["install", str(f)]) == 0
    assert len(onos.uploads) == 1
    assert not [c for c in onos.log if c[0] == "DELETE"]


def test_a_snapshot_is_the_version_onos_reports(onos: StandIn, tmp_path: Path) -> None:
    """ONOS reports 0.1.0-SNAPSHOT as 0.1.0.SNAPSHOT: a second run (a second `docker
    compose up`) must still see its own version, and neither delete nor re-upload it (on
    the cluster the delete removed the app from every node)."""
    f = tmp_path / "app.oar"
    f.write_bytes(oar("0.1.0-SNAPSHOT"))
    assert setup.main(["install", str(f)]) == 0
    assert onos.apps[APP]["version"] == "0.1.0.SNAPSHOT"
    assert setup.main(["install", str(f)]) == 0
    assert len(onos.uploads) == 1 and not [c for c in onos.log if c[0] == "DELETE"]
    assert setup.onos_version("2.7.0") == "2.7.0"
    assert setup.onos_version("1.2.3-rc-1") == "1.2.3.rc-1"


def test_install_replaces_another_version(onos: StandIn, tmp_path: Path) -> None:
    old, new = tmp_path / "old.oar", tmp_path / "new.oar"
    old.write_bytes(oar("0.1.0"))
    new.write_bytes(oar("0.2.0"))
    assert setup.main(["install", str(old)]) == 0
    # As ONOS 2.7 does: the removed app's archive stays on the disk a little after the
    # DELETE returned, and the uploads meanwhile get 409 "already installed". Counted as
    # installed, the activation that followed got 404 "Application is not found" for the
    # installer's 600 s, and a cluster was left without the app.
    onos.archive_lingers = 3
    assert setup.main(["install", str(new)]) == 0
    assert onos.apps[APP] == {"name": APP, "version": "0.2.0", "state": "ACTIVE"}
    assert ("DELETE", f"/onos/v1/applications/{APP}") in onos.log
    assert len(onos.uploads) == 2 + 2  # the first install, two refused, the accepted one
    assert setup.main(["install", "--reinstall", str(new)]) == 0
    assert len(onos.uploads) == 5


def test_install_twice_on_a_cluster_never_deactivates(
    onos: StandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cluster profile's one-shot against three nodes, run twice (a second `docker
    compose up`, or `compose start` of an optimizer depending on it): the second run
    neither deletes nor uploads, and the app is ACTIVE at every call of it; the first
    waits for the app's REST on every node (node 3's web context comes late)."""
    n2, n3 = StandIn(cluster=onos), StandIn(cluster=onos)
    try:
        n3.web_late = 3
        monkeypatch.setenv("ONOS_URL", ",".join(n.url for n in (onos, n2, n3)))
        f = tmp_path / "app.oar"
        f.write_bytes(oar())
        probe = "/onos/innet-agg/aggregation/onos-setup-probe"
        assert setup.main(["install", str(f), "--probe", probe]) == 0
        assert n3.web_late == 0 and ("GET", probe) in n2.log and ("GET", probe) in n3.log
        assert not n2.uploads and not n3.uploads  # written through the first node only
        for n in (onos, n2, n3):
            n.log.clear()
            n.states_seen.clear()
        env = {"PATH": "/usr/bin:/bin", "ONOS_URL": os.environ["ONOS_URL"], "ONOS_POLL_S": "0.02"}
        r = subprocess.run(  # as the image runs it
            [sys.executable, str(SCRIPT), "install", str(f), "--probe", probe],
            capture_output=True, text=True, env=env,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert "already active" in r.stdout
        assert len(onos.uploads) == 1
        for n in (onos, n2, n3):
            assert [m for m, _ in n.log if m != "GET"] == []
            assert n.states_seen and set(n.states_seen) == {"ACTIVE"}
    finally:
        n2.close()
        n3.close()


def test_install_waits_for_the_removal_on_every_node(
    onos: StandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    n2 = StandIn(cluster=onos)
    try:
        monkeypatch.setenv("ONOS_URL", f"{onos.url},{n2.url}")
        old, new = tmp_path / "old.oar", tmp_path / "new.oar"
        old.write_bytes(oar("0.1.0"))
        new.write_bytes(oar("0.2.0"))
        assert setup.main(["install", str(old)]) == 0
        onos.archive_lingers = 2
        assert setup.main(["install", str(new), "--probe", "/onos/innet-agg/x"]) == 0
        assert onos.apps[APP]["version"] == "0.2.0"
        # node 2 was asked whether the old app was gone, then whether the new one is ACTIVE
        gets = [path for m, path in n2.log if m == "GET"]
        assert f"/onos/v1/applications/{APP}" in gets and "/onos/innet-agg/x" in gets
    finally:
        n2.close()


def test_install_fails_in_one_line(
    onos: StandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    bad = tmp_path / "bad.oar"
    bad.write_bytes(b"not a zip")
    assert setup.main(["install", str(bad)]) == 1
    assert "not an ONOS application archive" in capsys.readouterr().err
    good = tmp_path / "app.oar"
    good.write_bytes(oar())
    monkeypatch.setenv("ONOS_PASSWORD", "wrong")
    monkeypatch.setenv("ONOS_WAIT_S", "0.3")
    assert setup.main(["install", str(good)]) == 1
    assert "check ONOS_USER/ONOS_PASSWORD" in capsys.readouterr().err
    monkeypatch.setenv("ONOS_URL", "http://127.0.0.1:9/onos/v1")  # nothing listens
    assert setup.main(["install", str(good)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("onos-setup: error: gave up after 0.3 s waiting for ONOS REST")
    assert err.endswith("(last: no answer)") and "\n" not in err


def test_null_fabric_activates_the_null_providers_and_waits_for_the_fabric(
    onos: StandIn, capsys: pytest.CaptureFixture
) -> None:
    assert setup.main(["null-fabric", "spineleaf,2,3,2"]) == 0
    assert onos.apps[setup.NULL_APP]["state"] == "ACTIVE"
    assert onos.null_config == {"topoShape": "spineleaf,2,3,2", "enabled": "true"}
    assert onos.null_posts == 1
    out = capsys.readouterr().out
    assert "5 devices, 12 links, 6 hosts" in out
    assert setup.expected_fabric("spineleaf,2,3,2") == (5, 12, 6)


def test_null_fabric_posts_again_a_configuration_onos_lost(onos: StandIn) -> None:
    # The stack test's first runs: the POST was answered 200, ONOS restarted its component
    # configuration while activating the null app, the providers started with their
    # defaults (enabled=false), and onos-fabric waited for hosts that never came.
    onos.config_lost = 2
    assert setup.main(["null-fabric", "spineleaf,2,3,2"]) == 0
    assert onos.null_posts == 3 and len(onos.hosts) == 6


def test_null_fabric_gives_up_saying_what_it_saw(
    onos: StandIn, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    onos.config_lost = 10**6
    monkeypatch.setenv("ONOS_WAIT_S", "0.5")
    assert setup.main(["null-fabric", "spineleaf,2,3,2"]) == 1
    err = capsys.readouterr().err
    assert "5 devices, 12 links and 6 hosts" in err and "'hosts': 0" in err


def p4mn_netcfg(switch: str, port: int) -> dict[str, Any]:
    """What p4mn's bmv2.py writes to /tmp/bmv2-<switch>-netcfg.json."""
    return {
        "devices": {
            f"device:bmv2:{switch}": {
                "basic": {
                    "managementAddress": f"grpc://localhost:{port}?device_id=1",
                    "driver": "bmv2",
                    "pipeconf": "org.onosproject.pipelines.basic",
                },
                "ports": {"1": {"number": 1, "name": f"{switch}-eth1", "enabled": True}},
            }
        }
    }


def test_netcfg_points_onos_at_the_mininet_container(onos: StandIn, tmp_path: Path) -> None:
    for i in (1, 2):
        (tmp_path / f"bmv2-s{i}-netcfg.json").write_text(
            json.dumps(p4mn_netcfg(f"s{i}", 50000 + i))
        )
    (tmp_path / "bmv2-s1-log").write_text("not a netcfg file")
    argv = ["netcfg", str(tmp_path), "--grpc-host", "mininet", "--pipeconf", "org.innetagg.bmv2"]
    assert setup.main([*argv, "--settle-s", "0.05"]) == 0
    devices = onos.netcfg["devices"]
    assert set(devices) == {"device:bmv2:s1", "device:bmv2:s2"}
    s2 = devices["device:bmv2:s2"]
    assert s2["basic"]["managementAddress"] == "grpc://mininet:50002?device_id=1"
    assert s2["basic"]["pipeconf"] == "org.innetagg.bmv2" and s2["basic"]["driver"] == "bmv2"
    assert s2["ports"]["1"]["name"] == "s2-eth1"


def test_netcfg_with_a_ready_file_pushes_exactly_the_files_it_lists(
    onos: StandIn, tmp_path: Path
) -> None:
    # The runs of the emulated stack left a race open: onos-netcfg took whatever files had
    # stopped changing for 5 s, so a restarted mininet's files could be pushed before
    # their intReportPort annotation, or with a stale file of an earlier, larger topology.
    for i in (1, 2, 3):
        (tmp_path / f"bmv2-s{i}-netcfg.json").write_text(
            json.dumps(p4mn_netcfg(f"s{i}", 50000 + i))
        )
    argv = ["netcfg", str(tmp_path), "--grpc-host", "mininet", "--ready-file", "ready.json"]
    done: list[int] = []
    t = threading.Thread(target=lambda: done.append(setup.main(argv)))
    t.start()
    time.sleep(0.3)
    assert onos.netcfg is None and t.is_alive()  # no ready file yet: nothing pushed
    (tmp_path / "ready.json").write_text(
        json.dumps({"files": ["bmv2-s1-netcfg.json", "bmv2-s2-netcfg.json"]})
    )
    t.join(timeout=10)
    assert done == [0]
    assert set(onos.netcfg["devices"]) == {"device:bmv2:s1", "device:bmv2:s2"}  # s3: stale


def test_the_ready_file_is_the_one_int_report_writes(model: dict[str, Any]) -> None:
    args = setup.parser().parse_args(model["services"]["onos-netcfg"]["command"])
    script = (REPO / "p4" / "mininet" / "int_report.py").read_text()
    ready = re.search(r'^READY = "([^"]+)"', script, re.M)
    assert ready and Path(ready.group(1)).parent == Path("/tmp")  # the mininet-tmp volume
    assert Path(ready.group(1)).name == args.ready_file


def test_compose_commands_parse_with_the_setup_tool(model: dict[str, Any]) -> None:
    for name in ("onos-app", "onos-fabric", "onos-netcfg", "onos-cluster-app"):
        setup.parser().parse_args(model["services"][name]["command"])


def test_onos_starts_the_apps_ours_requires(model: dict[str, Any]) -> None:
    pom = (REPO / "onos-app" / "pom.xml").read_text()
    requires = re.search(r"<onos.app.requires>([^<]*)</onos.app.requires>", pom)
    assert requires
    for node in ("onos", "onos-1", "onos-2", "onos-3"):
        apps = model["services"][node]["environment"]["ONOS_APPS"].split(",")
        full = {a if a.startswith("org.") else f"org.onosproject.{a}" for a in apps}
        assert {r.strip() for r in requires.group(1).split(",")} <= full, node
        assert "org.onosproject.gui2" in full, node  # the GUI the mission points users to


def test_emulated_fabric_uses_our_pipeconf_and_cpu_port(model: dict[str, Any]) -> None:
    loader = (
        REPO / "onos-app/src/main/java/org/innetagg/onos/pipeconf/PipeconfLoader.java"
    ).read_text()
    pipeconf = re.search(r'PIPECONF_ID\s*=\s*new PiPipeconfId\("([^"]+)"\)', loader)
    assert pipeconf
    args = setup.parser().parse_args(model["services"]["onos-netcfg"]["command"])
    assert args.pipeconf == pipeconf.group(1)
    assert args.grpc_host == "mininet" and "mininet" in model["services"]
    # onos-netcfg reads the directory where the mininet container's /tmp volume is mounted.
    mn_tmp = {v["source"] for v in model["services"]["mininet"]["volumes"] if v["target"] == "/tmp"}
    mounts = {v["target"]: v["source"] for v in model["services"]["onos-netcfg"]["volumes"]}
    assert mn_tmp == {mounts[str(args.directory)]}
    cmd = model["services"]["mininet"]["command"]
    switch = cmd[cmd.index("--switch") + 1]
    cpu = re.search(r"cpuport=(\d+)", switch)
    defines = (REPO / "p4" / "include" / "defines.p4").read_text()
    assert cpu and cpu.group(1) == re.search(r"CPU_PORT = (\d+);", defines).group(1)
    assert model["services"]["mininet"]["privileged"] is True


def test_the_built_oar_is_what_the_tool_reads(model: dict[str, Any]) -> None:
    built = sorted((REPO / "onos-app" / "target").glob("innet-agg-onos-*.oar"))
    if not built:
        pytest.skip("no onos-app/target/*.oar: `make onos-app` builds it (JDK 17 and Maven)")
    name, version, required = setup.oar_metadata(built[-1])
    pom = (REPO / "onos-app" / "pom.xml").read_text()
    assert name == re.search(r"<onos.app.name>([^<]+)<", pom).group(1)
    assert f"<version>{version}</version>" in pom
    assert required == [re.search(r"<onos.app.requires>([^<]+)<", pom).group(1)]


def manifest_header(manifest: str, name: str) -> list[str]:
    """One header of a JAR manifest (continuation lines joined), split at the commas that
    separate its clauses (not those inside quoted attributes such as version ranges)."""
    text = re.sub(r"\r?\n ", "", manifest)
    value = next((ln.split(":", 1)[1] for ln in text.splitlines() if ln.startswith(name + ":")), "")
    clauses, depth, cur = [], False, ""
    for ch in value:
        if ch == '"':
            depth = not depth
        if ch == "," and not depth:
            clauses.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return [c for c in [*clauses, cur.strip()] if c]


def test_the_built_bundle_imports_no_java_packages() -> None:
    # Karaf 4.2.9's OSGi framework (ONOS 2.7) refuses a bundle importing java.*: ONOS marks
    # the app ACTIVE while its feature stays Uninstalled and no bundle exists.
    built = sorted((REPO / "onos-app" / "target").glob("innet-agg-onos-*.oar"))
    if not built:
        pytest.skip("no onos-app/target/*.oar: `make onos-app` builds it (JDK 17 and Maven)")
    with zipfile.ZipFile(built[-1]) as oar_zip:
        (jar_name,) = [n for n in oar_zip.namelist() if n.startswith("m2/") and n.endswith(".jar")]
        with zipfile.ZipFile(io.BytesIO(oar_zip.read(jar_name))) as jar:
            manifest = jar.read("META-INF/MANIFEST.MF").decode()
    imports = [c.split(";")[0] for c in manifest_header(manifest, "Import-Package")]
    assert "org.onosproject.net.pi.model" in imports  # the header was found and parsed
    assert [p for p in imports if p == "java" or p.startswith("java.")] == []
