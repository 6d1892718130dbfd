#!/usr/bin/env python3
"""One-shot set-up of ONOS for docker-compose.yml (docs/deploy.md); the onos-setup image's
entrypoint.

    onos-setup install OAR [--reinstall] [--probe PATH]
        wait for ONOS, activate the apps the .oar requires, install and activate the .oar
        (unless that version is already active: then nothing is touched), wait until every
        node says ACTIVE and, with --probe, until PATH (the app's REST, from the root)
        answers JSON on every node. Another version is replaced: uninstalled, its removal
        waited for on every node, the new one uploaded and activated.
    onos-setup null-fabric SHAPE
        ONOS's null providers simulate a fabric, e.g. spineleaf,2,3,2 (spines, leaves,
        hosts per leaf); wait until its devices, links and hosts are all known
    onos-setup netcfg DIR --grpc-host HOST [--pipeconf ID]
        push the netcfg files p4mn writes for its bmv2 switches (DIR/bmv2-*-netcfg.json),
        with their P4Runtime address pointing at HOST instead of localhost

Environment: ONOS_URL (default http://onos:8181/onos/v1; a cluster's nodes separated by commas,
the first one is written to, every one is checked), ONOS_USER, ONOS_PASSWORD
(onos/rocks), ONOS_WAIT_S (how long to wait for ONOS and its apps, 600), ONOS_POLL_S (3).
Exit status 0 when done, 1 with one line saying what failed (compose shows it, and services
that depend on this one with `service_completed_successfully` do not start).

Standard library only: the image is the plain Python base image.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

NULL_APP = "org.onosproject.null"
NULL_CONFIG = "/configuration/org.onosproject.provider.nil.NullProviders"


# What a starting ONOS answers for a while to calls that succeed later (see Onos.ok).
STARTING = (404, 503)


class SetupError(Exception):
    """Something ONOS or the input did not do; one line."""


class Onos:
    def __init__(self, url: str, user: str, password: str, wait_s: float, poll_s: float) -> None:
        self.url = url.rstrip("/")
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        self.auth = f"Basic {token}"
        self.wait_s = wait_s
        self.poll_s = poll_s

    def call(
        self, method: str, path: str, body: bytes | None = None, ctype: str | None = None
    ) -> tuple[int, Any]:
        """(status, decoded JSON or None); status 0 when ONOS does not answer."""
        req = urllib.request.Request(self.url + path, data=body, method=method)
        req.add_header("Authorization", self.auth)
        req.add_header("Accept", "application/json")
        if ctype:
            req.add_header("Content-Type", ctype)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                status, raw = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        except (urllib.error.URLError, OSError):
            return 0, None
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, None

    def ok(
        self, method: str, path: str, body: bytes | None = None, ctype: str | None = None
    ) -> Any:
        # While ONOS starts, its REST answers 503 until the services a resource needs are up
        # ("Service org.onosproject.codec.CodecService not found", seen after /applications
        # already answered 200, in the first real `docker compose up`): that passes, so a
        # 503 is retried until `wait_s`. So is a 404 "Not Found": activating the apps ONOS
        # starts with restarts its REST context, and a call in between finds no resource
        # (the stack test's first run: the upload got 404 while ONOS logged "Started
        # HttpServiceContext onos-rest" again). Only for calls that may be repeated: the
        # answer can come after the work was done (it failed to encode); see `upload`.
        deadline = time.monotonic() + self.wait_s
        while True:
            status, doc = self.call(method, path, body, ctype)
            if status not in STARTING or time.monotonic() > deadline:
                break
            time.sleep(self.poll_s)
        if not 200 <= status < 300:
            detail = (doc or {}).get("message", "") if isinstance(doc, dict) else ""
            said = f"HTTP {status}" if status else "no answer"
            raise SetupError(f"{method} {path}: {said}{': ' + detail if detail else ''}")
        return doc

    def wait(self, what: str, check: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self.wait_s
        while not check():
            if time.monotonic() > deadline:
                raise SetupError(f"gave up after {self.wait_s:g} s waiting for {what}")
            time.sleep(self.poll_s)

    def app(self, name: str) -> dict[str, Any] | None:
        status, doc = self.call("GET", f"/applications/{name}")
        return doc if status == 200 and isinstance(doc, dict) else None

    def state(self, name: str) -> str | None:
        return (self.app(name) or {}).get("state")

    def serves(self, url: str) -> bool:
        """`url` answers JSON (any status): the app's resource is there; Jetty's own 404
        while the app's web context is absent is HTML."""
        req = urllib.request.Request(url, headers={"Authorization": self.auth})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                ctype = r.headers.get("Content-Type", "")
        except urllib.error.HTTPError as e:
            ctype = e.headers.get("Content-Type", "")
        except (urllib.error.URLError, OSError):
            return False
        return ctype.startswith("application/json")

    def up(self) -> None:
        # REST answers once Karaf has started the web bundles, well before the apps are.
        # A 401 may be transient while Karaf starts, so it is only reported on giving up.
        last = [0]

        def answers() -> bool:
            last[0] = self.call("GET", "/applications")[0]
            return last[0] == 200

        try:
            self.wait(f"ONOS REST at {self.url}", answers)
        except SetupError as e:
            said = {0: "no answer", 401: "HTTP 401: check ONOS_USER/ONOS_PASSWORD"}
            raise SetupError(f"{e} (last: {said.get(last[0], f'HTTP {last[0]}')})") from None

    def activate(self, name: str) -> None:
        """Activate an app ONOS ships (installed at start, possibly later than REST)."""
        self.wait(f"ONOS to know {name}", lambda: self.app(name) is not None)
        if self.state(name) != "ACTIVE":
            self.ok("POST", f"/applications/{name}/active")
        self.wait(f"{name} to be ACTIVE", lambda: self.state(name) == "ACTIVE")


def oar_metadata(oar: Path) -> tuple[str, str, list[str]]:
    """(name, version, required apps) from the .oar's app.xml."""
    try:
        with zipfile.ZipFile(oar) as z:
            root = ET.fromstring(z.read("app.xml"))
    except (OSError, KeyError, zipfile.BadZipFile, ET.ParseError) as e:
        raise SetupError(f"{oar}: not an ONOS application archive ({e})") from None
    name, version = root.get("name"), root.get("version")
    if not name or not version:
        raise SetupError(f"{oar}: app.xml has no name or version")
    required = [a.strip() for a in (root.get("apps") or "").split(",") if a.strip()]
    return name, version, required


def onos_version(version: str) -> str:
    """A version as ONOS reports it: `org.onosproject.core.Version` splits the text at `.`
    and `-` into at most four fields and joins them with `.` (0.1.0-SNAPSHOT is
    0.1.0.SNAPSHOT), so the .oar's own text never equals what ONOS says."""
    return ".".join(re.split(r"[.-]", version, maxsplit=3))


def install(
    onos: Onos,
    oar: Path,
    reinstall: bool,
    nodes: list[Onos] | None = None,
    probe: str | None = None,
) -> str:
    """Idempotent: a second run with the same .oar touches nothing (a `docker compose up`
    again, `compose start` of a service depending on the one-shot). `nodes`: every node of
    a cluster, `onos` among them, each checked at the end."""
    name, version, required = oar_metadata(oar)
    want = onos_version(version)
    nodes = nodes or [onos]
    onos.up()
    for req in required:
        onos.activate(req)
    current = onos.app(name)
    replaced = ""
    if current is not None and (reinstall or current.get("version") != want):
        # ONOS 2.7 cannot install over an installed app ("Application ... already
        # installed"): the old one goes first, everywhere, and its archive with it. A DELETE
        # returns once the store has dropped the app; each node removes the archive from its
        # disk afterwards, in its own time, and an upload meanwhile is refused (409).
        replaced = f" (replacing {current.get('version')})"
        onos.ok("DELETE", f"/applications/{name}")
        for n in nodes:
            n.wait(f"{name} to be uninstalled at {n.url}", lambda n=n: n.app(name) is None)
        current = None
    if current is None:
        upload(onos, name, oar.read_bytes(), want)
    elif current.get("state") == "ACTIVE":
        verify(nodes, name, want, probe)
        return f"{name} {version} already active"
    if onos.state(name) != "ACTIVE":
        onos.ok("POST", f"/applications/{name}/active")
    verify(nodes, name, want, probe)
    return f"{name} {version} installed and active{replaced}"


def verify(nodes: list[Onos], name: str, version: str, probe: str | None) -> None:
    """Every node reports the app ACTIVE at `version` and, with `probe`, serves its REST."""

    def active(n: Onos) -> bool:
        app = n.app(name) or {}
        return app.get("state") == "ACTIVE" and app.get("version") == version

    for n in nodes:
        n.wait(f"{name} {version} to be ACTIVE at {n.url}", lambda n=n: active(n))
        if probe is not None:
            root = n.url.rsplit("/onos/", 1)[0]
            n.wait(f"{probe} to answer at {root}", lambda n=n, root=root: n.serves(root + probe))


def upload(onos: Onos, name: str, data: bytes, version: str) -> None:
    """Install the .oar once. A starting ONOS answered 503 ("Service
    org.onosproject.codec.CodecService not found") to an upload it had carried out: the
    app was installed, and the retry got 409 "already installed"; another time 404 while
    its REST context restarted. So after a 503 or 404 the app is looked up before the
    upload is tried again. A 409 is "installed" only when ONOS then knows the app at this
    version; otherwise it is the archive of an app just removed, not yet deleted from the
    node's disk, and the upload is tried again (counting a 409 as done after a DELETE is
    what left a cluster without the app: the activation then got 404 "Application is not
    found" until the installer gave up)."""
    ctype = "application/octet-stream"

    def done() -> bool:
        status, doc = onos.call("POST", "/applications?activate=true", data, ctype)
        if 200 <= status < 300:
            return True
        if status in (*STARTING, 409):
            return (onos.app(name) or {}).get("version") == version
        detail = (doc or {}).get("message", "") if isinstance(doc, dict) else ""
        said = f"HTTP {status}" if status else "no answer"
        raise SetupError(
            f"POST /applications?activate=true: {said}{': ' + detail if detail else ''}"
        )

    onos.wait(f"ONOS to take {name}", done)


def expected_fabric(shape: str) -> tuple[int, int, int]:
    """(devices, directed links, hosts) the null providers create for a spine-leaf shape
    (spines, leaves, hosts per leaf); for other shapes at least one device and one host."""
    parts = shape.split(",")
    if parts[0] == "spineleaf" and len(parts) == 4 and all(p.isdigit() for p in parts[1:]):
        spines, leaves, per_leaf = map(int, parts[1:])
        return spines + leaves, 2 * spines * leaves, leaves * per_leaf
    return 1, 0, 1


def expected_hosts(shape: str) -> int:
    return expected_fabric(shape)[2]


def null_fabric(onos: Onos, shape: str, repost_s: float = 30.0) -> str:
    """Desired state, then reconcile: ONOS's null providers configured with `shape` and
    enabled, until its devices, links and hosts are all there. The configuration is posted
    again whenever ONOS does not show it, and every `repost_s` while the fabric is
    incomplete: the stack test's first runs saw a POST answered 200 and lost (activating the
    app restarted ONOS's component configuration; the providers came up with their defaults,
    enabled=false), so the one-shot waited for hosts that never came."""
    onos.up()
    onos.activate(NULL_APP)
    want = {"topoShape": shape, "enabled": "true"}
    body = json.dumps(want).encode()
    devices, links, hosts = expected_fabric(shape)
    posted = [float("-inf")]
    last: dict[str, int] = {}

    def count(path: str) -> int:
        status, doc = onos.call("GET", path)
        return len((doc or {}).get(path.strip("/"), [])) if status == 200 else 0

    def configured() -> bool:
        status, doc = onos.call("GET", NULL_CONFIG)
        props = (doc or {}).get(NULL_CONFIG.rsplit("/", 1)[1], {}) if status == 200 else {}
        return all(str(props.get(k, "")).lower() == v for k, v in want.items())

    def complete() -> bool:
        last.update(devices=count("/devices"), links=count("/links"), hosts=count("/hosts"))
        if last["devices"] >= devices and last["links"] >= links and last["hosts"] >= hosts:
            return True
        if not configured() or time.monotonic() - posted[0] > repost_s:
            onos.ok("POST", NULL_CONFIG, body, "application/json")
            posted[0] = time.monotonic()
        return False

    try:
        onos.wait(f"{devices} devices, {links} links and {hosts} hosts", complete)
    except SetupError as e:
        raise SetupError(f"{e} (last: {last})") from None
    d, n, h = last["devices"], last["links"], last["hosts"]
    return f"null fabric {shape}: {d} devices, {n} links, {h} hosts"


def merged_netcfg(files: list[Path], grpc_host: str, pipeconf: str | None) -> dict[str, Any]:
    """One netcfg document from p4mn's per-switch files, reachable from ONOS's container."""
    devices: dict[str, Any] = {}
    for f in files:
        try:
            doc = json.loads(f.read_text())
        except (OSError, ValueError) as e:
            raise SetupError(f"{f}: not a netcfg file ({e})") from None
        for dev_id, cfg in doc.get("devices", {}).items():
            basic = cfg.setdefault("basic", {})
            addr = str(basic.get("managementAddress", ""))
            if addr.startswith("grpc://localhost:"):
                basic["managementAddress"] = f"grpc://{grpc_host}:" + addr.split(":", 2)[2]
            if pipeconf:
                basic["pipeconf"] = pipeconf
            devices[dev_id] = cfg
    return {"devices": devices}


def netcfg(
    onos: Onos,
    directory: Path,
    grpc_host: str,
    pipeconf: str | None,
    settle_s: float,
    ready_file: str | None = None,
) -> str:
    def files() -> list[Path]:
        return sorted(directory.glob("bmv2-*-netcfg.json"))

    if ready_file:
        # Written by p4/mininet/int_report.py once every switch's file is complete: exactly
        # this run's files (stale ones of an earlier, larger topology stay out).
        ready = directory / ready_file
        listed: list[Path] = []

        def complete() -> bool:
            try:
                names = json.loads(ready.read_text())["files"]
            except (OSError, ValueError, KeyError, TypeError):
                return False
            listed[:] = [directory / n for n in names]
            return bool(listed) and all(p.exists() for p in listed)

        onos.wait(f"{ready} naming this run's netcfg files", complete)
        seen = listed
    else:
        onos.wait(f"p4mn's netcfg files in {directory}", lambda: bool(files()))
        # p4mn writes one file per switch as each starts; take them once no new one came
        # for a while.
        seen, since = files(), time.monotonic()
        while time.monotonic() - since < settle_s:
            time.sleep(min(onos.poll_s, settle_s))
            now = files()
            if now != seen:
                seen, since = now, time.monotonic()
    doc = merged_netcfg(seen, grpc_host, pipeconf)
    onos.up()
    onos.ok("POST", "/network/configuration", json.dumps(doc).encode(), "application/json")
    return f"netcfg pushed for {len(doc['devices'])} devices: {', '.join(sorted(doc['devices']))}"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="onos-setup", description="One-shot set-up of ONOS.")
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("install", help="install and activate an ONOS app (.oar)")
    i.add_argument("oar", type=Path)
    i.add_argument("--reinstall", action="store_true", help="even if this version is active")
    i.add_argument(
        "--probe",
        help="a path of the app's REST (from the root, e.g. "
        "/onos/innet-agg/aggregation/probe) that must answer JSON on every node",
    )
    n = sub.add_parser("null-fabric", help="simulated fabric from ONOS's null providers")
    n.add_argument("shape", help="e.g. spineleaf,2,3,2")
    c = sub.add_parser("netcfg", help="push p4mn's netcfg files to ONOS")
    c.add_argument("directory", type=Path)
    c.add_argument("--grpc-host", required=True, help="host name of the p4mn container")
    c.add_argument("--pipeconf", help="pipeconf id to set on every device")
    c.add_argument("--settle-s", type=float, default=5.0, help="quiet time before pushing")
    c.add_argument("--ready-file", help="wait for this file in DIR listing the files to push")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    env = os.environ
    try:
        urls = [u.strip() for u in env.get("ONOS_URL", "http://onos:8181/onos/v1").split(",")]
        nodes = [
            Onos(
                u,
                env.get("ONOS_USER", "onos"),
                env.get("ONOS_PASSWORD", "rocks"),
                float(env.get("ONOS_WAIT_S", "600")),
                float(env.get("ONOS_POLL_S", "3")),
            )
            for u in urls
            if u
        ]
        if not nodes:
            raise SetupError("ONOS_URL names no node")
        onos = nodes[0]
        if args.cmd == "install":
            done = install(onos, args.oar, args.reinstall, nodes, args.probe)
        elif args.cmd == "null-fabric":
            done = null_fabric(onos, args.shape)
        else:
            done = netcfg(onos, args.directory, args.grpc_host, args.pipeconf, args.settle_s,
                          args.ready_file)  # fmt: skip
    except (SetupError, ValueError) as e:
        print(f"onos-setup: error: {e}", file=sys.stderr)
        return 1
    print(f"onos-setup: {done}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
