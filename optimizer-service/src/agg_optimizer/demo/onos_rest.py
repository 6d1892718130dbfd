"""The part of ONOS 2.7's REST API the optimizer service uses, served over real HTTP by a
fabric that is not ONOS: the simulated fabric of `make demo` (`demo.live`), and the tests'
stand-in for machines without the ONOS 2.7.0 built from source (docs/service.md).

Where that ONOS exists, `tests/service/test_standin_parity.py` sends the same requests to it
and to this server and compares the answers, so what follows is checked against ONOS, not
only read from its sources: `IntentCodec` / `PointToPointIntentCodec` decoding (type, appId
registered or 404 "Application ID is not found", key, ingress/egress points,
WaypointConstraint); intent states (INSTALLED when a path through the waypoints exists over
ACTIVE links, else FAILED; recomputed when links change); `GET`/`DELETE
/intents/{app}/{key}` answering 400 "For input string" for an unknown non-numeric key (ONOS
falls back to `Long.decode(key)`), 404 (GET) or 204 (DELETE) for an unknown numeric key,
404 for an unregistered app; `GET /intents/application/{app}` 404 for an unregistered app;
basic auth (401). The aggregation app's resource (`/onos/innet-agg/aggregation/{job}`) is
served when `aggregation` is a dict, and answers 404 (app not installed) when it is None;
so is its traffic-class resource (`/onos/innet-agg/priority/{job}`, kept in `priority`),
validated as the contract says (docs/onos-aggregation-api.md), as the app's JUnit tests
check the app. `on_change(kind, key, body)` is called, outside the request lock, after
every accepted change of intents ("intent", "withdraw"), aggregation ("aggregation") or a
job's class ("priority"; body None when removed).
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

import networkx as nx

from agg_optimizer.model.pools import doc_claims

# IntentsWebResource's own message; decoding a posted intent (IntentCodec) says "Application
# ID is not found" instead.
APP_ID_NOT_FOUND = "Application Id not found"
# The innet-agg app's traffic-class resource (TrafficClassWebResource, JobClass,
# TrafficClassManager, JobNumberRegistry).
PRIORITY_PATH = "/onos/innet-agg/priority/"
PIPECONF = "org.innetagg.bmv2"  # PipeconfLoader.PIPECONF_ID
JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # JobPlacement.JOB_ID
OWNER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")  # OwnerWebResource.NAME
JOB_NUMBERS = 256  # JobNumberRegistry.JOB_NUMBERS (agg_job's size)
MAX_CLASS = 7


def _bad(status: int, message: str) -> tuple[int, Any]:
    return status, {"code": status, "message": message}


def _java(value: Any) -> str:
    """A JSON value as Jackson's JsonNode.toString() writes it (`null` for a missing one)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _decodes_as_long(s: str) -> bool:
    """Java's Long.decode: optional sign, then 0x/0X/# (hex), 0 (octal) or decimal digits."""
    body = s[1:] if s[:1] in "+-" else s
    for prefix, base in (("0x", 16), ("0X", 16), ("#", 16)):
        if body.startswith(prefix):
            body, radix = body[len(prefix) :], base
            break
    else:
        radix = 8 if body.startswith("0") and len(body) > 1 else 10
    if not body or body[0] in "+-":
        return False
    try:
        int(body, radix)
    except ValueError:
        return False
    return True


class OnosRest:
    def __init__(
        self,
        devices: dict[str, Any],
        links: dict[str, Any],
        hosts: dict[str, Any],
        *,
        port: int = 0,
        aggregation: bool = False,
        user: str = "onos",
        password: str = "rocks",
        on_change: Callable[[str, str, Any], None] | None = None,
    ) -> None:
        self.devices, self.links, self.hosts = devices, links, hosts
        self.credentials = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.on_change = on_change
        self.apps: set[str] = set()
        self.intents: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        # None: the ONOS app is not installed (its resource answers 404)
        self.aggregation: dict[str, Any] | None = {} if aggregation else None
        self.priority: dict[str, dict[str, Any]] = {}  # job -> document in force
        # OwnerWebResource's claim: (owner, holder, expiry on `clock`), or None.
        self.owner: tuple[str, str, float] | None = None
        self.clock: Callable[[], float] = time.monotonic
        # Ids of the devices running the innet-agg pipeconf; None: every device.
        self.pipeconf_devices: set[str] | None = None
        self.job_numbers: dict[str, int] = {}  # job -> its number at the switches
        # ONOS accepts an intent (201) before its store holds it; until then a lookup of the
        # key fails as for an unknown key. Lookups a new intent stays unknown for:
        self.unknown_lookups = 0
        self.unseen: dict[tuple[str, str], int] = {}
        self.lock = threading.Lock()
        self._changes: list[tuple[str, str, Any]] = []
        self.port = port
        self.server: ThreadingHTTPServer | None = None
        # links changed through set_link / set_device (code that edits `links` itself and
        # then calls neither must bump it)
        self._links_version = 0
        self._comp: tuple[tuple[int, int, int], dict[str, int]] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/onos/v1"

    def start(self) -> None:
        rest = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: Any = None) -> None:
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                if self.headers.get("Authorization", "") != rest.credentials:
                    self._send(401, {"code": 401, "message": "Unauthorized"})
                    return
                if (
                    method == "POST"
                    and self.path.startswith(PRIORITY_PATH)
                    and rest.aggregation is not None
                ):
                    refused = self._refusal(raw)
                    if refused is not None:
                        self._send(*refused)
                        return
                    raw = raw if raw.strip() else b""  # a blank body is no document
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    self._send(400, {"code": 400, "message": "Unexpected character"})
                    return
                with rest.lock:
                    rest.requests.append((method, self.path))
                    code, out = rest.route(method, self.path, body)
                    changes, rest._changes = rest._changes, []
                if rest.on_change is not None:
                    for change in changes:
                        rest.on_change(*change)
                self._send(code, out)

            def _refusal(self, raw: bytes) -> tuple[int, Any] | None:
                """What Jersey and the traffic-class resource answer before the document
                is looked at: 415 for a body declared of another type than JSON (the
                resource @Consumes JSON; Jetty's HTML page), 400 naming `body` for one
                that does not parse as JSON; a body of no declared type is read."""
                media = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
                if media not in ("", "application/json"):
                    return 415, None
                try:
                    if raw.strip():
                        json.loads(raw)
                except ValueError as e:
                    return _bad(400, f"body: not JSON ({getattr(e, 'msg', e)})")
                return None

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def do_DELETE(self) -> None:
                self._handle("DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    # --- the API ------------------------------------------------------------------------

    def route(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        parts = [unquote(p) for p in path.split("?")[0].strip("/").split("/")]
        if parts[:2] == ["onos", "innet-agg"]:
            if self.aggregation is None:
                return 404, {"code": 404, "message": "HTTP 404 Not Found"}
            if parts[2:3] == ["priority"] and len(parts) == 4:
                return self._priority(method, parts[3], body)
            if parts[2:3] == ["aggregation"] and len(parts) == 4:
                return self._aggregation(method, parts[3], body)
            if parts[2:] == ["owner"]:
                return self._owner(method, path.partition("?")[2], body)
            return 404, {"code": 404, "message": "HTTP 404 Not Found"}
        if parts[:2] != ["onos", "v1"]:
            return 404, {"code": 404, "message": "HTTP 404 Not Found"}
        p = parts[2:]
        if method == "GET" and p == ["devices"]:
            return 200, self.devices
        if method == "GET" and p == ["links"]:
            return 200, self.links
        if method == "GET" and p == ["hosts"]:
            return 200, self.hosts
        if method == "POST" and len(p) == 3 and p[0] == "applications" and p[2] == "register":
            self.apps.add(p[1])
            return 200, {"name": p[1], "id": len(self.apps)}
        if p[:1] == ["intents"]:
            detail = "detail=true" in path.partition("?")[2].lower().split("&")
            return self._intents(method, p[1:], body, detail)
        return 404, {"code": 404, "message": "HTTP 404 Not Found"}

    def _ours(self, device: dict[str, Any]) -> bool:
        if self.pipeconf_devices is None:
            return True
        return device["id"] in self.pipeconf_devices

    def _aggregation(self, method: str, job: str, body: Any) -> tuple[int, Any]:
        """AggregationWebResource: POST replaces the job's placement (201 new, 200
        replaced, the document echoed with `p4_job_id`), GET shows it (404 when none),
        DELETE removes it (204, also when absent)."""
        assert self.aggregation is not None
        if method == "GET":
            doc = self.aggregation.get(job)
            if doc is None:
                return _bad(404, f"job: no placement for '{job}'")
            return 200, doc
        if method == "DELETE":
            if self.aggregation.pop(job, None) is not None:
                if job not in self.priority:
                    self.job_numbers.pop(job, None)
                self._changes.append(("aggregation", job, None))
            return 204, None
        if method != "POST":
            return 405, None
        if not JOB_ID.fullmatch(job):
            return _bad(400, f"job: '{job}' does not match {JOB_ID.pattern}")
        if not isinstance(body, dict):
            return _bad(400, "body: a placement document (JSON object) expected")
        clash = self._overlap(job, body)
        if clash is not None:
            return _bad(409, clash)
        number = self._job_number(job)
        if number is None:
            return _bad(503, f"job: all {JOB_NUMBERS} job numbers are in use")
        new = job not in self.aggregation
        doc = {**body, "p4_job_id": number}
        self.aggregation[job] = doc
        self._changes.append(("aggregation", job, doc))
        return (201 if new else 200), doc

    def _overlap(self, job: str, body: dict[str, Any]) -> str | None:
        """AggregationManager's refusal of a pool that shares slots with another job's on
        a switch (409, naming both jobs)."""
        assert self.aggregation is not None
        mine = [c for jp in body.get("jobs", []) for c in doc_claims(job, jp)]
        for other, doc in sorted(self.aggregation.items()):
            if other == job:
                continue
            for o in (c for jp in doc.get("jobs", []) for c in doc_claims(other, jp)):
                for i, c in enumerate(mine):
                    if c[1] == o[1] and c[2] < o[3] and o[2] < c[3]:
                        return (
                            f"jobs[0].aggregators[{i}].pool: slots [{c[2]}, {c[3]}) of job "
                            f"'{job}' overlap job '{other}' slots [{o[2]}, {o[3]}) on '{c[1]}'"
                        )
        return None

    def _owner(self, method: str, query: str, body: Any) -> tuple[int, Any]:
        """OwnerWebResource: POST takes or renews the claim (409 while another owner's is in
        force), GET shows it (404 when none), DELETE ?owner= lets go of it (204)."""
        now = self.clock()
        held = self.owner if self.owner and self.owner[2] > now else None
        if method == "GET":
            if held is None:
                return _bad(404, "owner: none")
            return 200, {"owner": held[0], "holder": held[1], "expires_in_s": held[2] - now}
        if method == "DELETE":
            who = dict(kv.partition("=")[::2] for kv in query.split("&") if kv).get("owner")
            if self.owner and self.owner[0] == who:
                self.owner = None
            return 204, None
        if method != "POST":
            return 405, None
        if not isinstance(body, dict):
            return _bad(400, "body: a JSON object expected")
        owner, holder, ttl = body.get("owner"), body.get("holder"), body.get("ttl_s")
        for name, v in (("owner", owner), ("holder", holder)):
            if not isinstance(v, str) or not OWNER_NAME.fullmatch(v):
                return _bad(400, f"{name}: expected {OWNER_NAME.pattern}")
        if not isinstance(ttl, int) or isinstance(ttl, bool) or not 1 <= ttl <= 3600:
            return _bad(400, "ttl_s: an integer from 1 to 3600 expected")
        if held is not None and held[0] != owner:
            left = int(held[2] - now + 0.999)
            return _bad(
                409,
                f"owner: ONOS is written by optimizer store '{held[0]}' (instance "
                f"'{held[1]}') for {left} s more unless it renews its claim",
            )
        self.owner = (owner, holder, now + ttl)
        return 200, {"owner": owner, "holder": holder, "expires_in_s": float(ttl)}

    def _job_number(self, job: str) -> int | None:
        """JobNumberRegistry: the job's number, the lowest free one if it has none, None
        when all are taken. Both resources share it; it is freed when neither holds the job."""
        number = self.job_numbers.get(job)
        if number is None:
            free = sorted(set(range(JOB_NUMBERS)) - set(self.job_numbers.values()))
            if not free:
                return None
            number = self.job_numbers[job] = free[0]
        return number

    def _priority(self, method: str, job: str, body: Any) -> tuple[int, Any]:
        """The app's checks in the app's order, with its statuses and messages; the posted
        document is echoed with the switches written and `p4_job_id`."""
        if method == "GET":
            doc = self.priority.get(job)
            if doc is None:
                return _bad(404, f"job: no traffic class for '{job}'")
            return 200, doc
        if method == "DELETE":
            if self.priority.pop(job, None) is not None:
                if job not in (self.aggregation or {}):
                    self.job_numbers.pop(job, None)
                self._changes.append(("priority", job, None))
            return 204, None
        if method != "POST":
            return 405, None
        # JobClass.decode: everything that needs no devices, in this order.
        if not JOB_ID.fullmatch(job):
            return _bad(400, f"job: '{job}' does not match {JOB_ID.pattern}")
        if not isinstance(body, dict):
            return _bad(400, "body: a traffic-class document (JSON object) expected")
        jid = body.get("job_id")
        if not isinstance(jid, str) or not jid:
            return _bad(400, "job_id: a non-empty string expected")
        if jid != job:
            return _bad(400, f"job_id: '{jid}' is not the job of the path, '{job}'")
        cls = body.get("priority_class")
        if isinstance(cls, bool) or not isinstance(cls, int) or not 0 <= cls <= MAX_CLASS:
            got = _java(cls)
            return _bad(400, f"priority_class: an integer 0..{MAX_CLASS} expected, got {got}")
        listed = body.get("switches")
        if listed is not None:
            if not isinstance(listed, list):
                return _bad(400, "switches: a list of device ids expected")
            for i, sw in enumerate(listed):
                if not isinstance(sw, str) or not sw:
                    return _bad(400, f"switches[{i}]: a device id (string) expected")
                if sw in listed[:i]:
                    before = listed.index(sw)
                    return _bad(400, f"switches[{i}]: '{sw}' is listed twice (switches[{before}])")
        # TrafficClassManager: the listed switches (every 400 before any 503), or by default
        # every available device of ours, by id.
        devices = {d["id"]: d for d in self.devices.get("devices", [])}
        if listed is None:
            switches = sorted(
                i for i, d in devices.items() if d.get("available", True) and self._ours(d)
            )
        else:
            for i, sw in enumerate(listed):
                if sw not in devices:
                    return _bad(400, f"switches[{i}]: unknown device '{sw}'")
                if not self._ours(devices[sw]):
                    return _bad(
                        400,
                        f"switches[{i}]: device '{sw}' does not run the innet-agg pipeconf"
                        f" ({PIPECONF})",
                    )
            for i, sw in enumerate(listed):
                if not devices[sw].get("available", True):
                    return _bad(503, f"switches[{i}]: device '{sw}' is not available")
            switches = list(listed)
        number = self._job_number(job)
        if number is None:
            return _bad(503, f"job: all {JOB_NUMBERS} job numbers are in use")
        new = job not in self.priority
        doc = {**body, "switches": switches, "p4_job_id": number}
        self.priority[job] = doc
        self._changes.append(("priority", job, doc))
        return (201 if new else 200), doc

    def _intents(
        self, method: str, p: list[str], body: Any, detail: bool = False
    ) -> tuple[int, Any]:
        if method == "POST" and not p:
            if body.get("type") != "PointToPointIntent":
                return 400, {"code": 400, "message": f"Intent type {body.get('type')} ..."}
            if body.get("appId") not in self.apps:
                return 404, {"code": 404, "message": "Application ID is not found"}
            key = body.get("key")
            self.intents[(body["appId"], key)] = body
            self._changes.append(("intent", key, body))
            if self.unknown_lookups:
                self.unseen[(body["appId"], key)] = self.unknown_lookups
            return 201, None
        if method == "GET" and len(p) == 2 and p[0] == "application":
            if p[1] not in self.apps:
                return 404, {"code": 404, "message": APP_ID_NOT_FOUND}
            # `?detail=true`: each intent as its own codec encodes it (IntentsWebResource).
            return 200, {
                "intents": [
                    self._encode(k, b, full=detail) for k, b in self.intents.items() if k[0] == p[1]
                ]
            }
        if len(p) == 2 and method in ("GET", "DELETE"):
            # IntentsWebResource: the app must be registered; the key is looked up as a string,
            # then as Long.decode(key), whose NumberFormatException answers 400.
            if p[0] not in self.apps:
                return 404, {"code": 404, "message": APP_ID_NOT_FOUND}
            key = (p[0], p[1])
            if self.unseen.get(key):
                self.unseen[key] -= 1
                key = (p[0], "")
            if key not in self.intents and not _decodes_as_long(p[1]):
                return 400, {"code": 400, "message": f'For input string: "{p[1]}"'}
            if method == "GET":
                if key not in self.intents:
                    return 404, {"code": 404, "message": "Intent is not found"}
                return 200, self._encode(key, self.intents[key], full=True)
            if self.intents.pop(key, None) is not None:
                self._changes.append(("withdraw", key[1], None))
            self.unseen.pop(key, None)
            return 204, None
        return 404, {"code": 404, "message": "HTTP 404 Not Found"}

    def _encode(
        self, key: tuple[str, str], body: dict[str, Any], full: bool = False
    ) -> dict[str, Any]:
        """As IntentCodec: the list gives the common fields; one intent by key also its
        PointToPointIntentCodec fields (selector, priority, constraints, points)."""
        out = {
            "type": body["type"],
            "id": hex(abs(hash(key)) % (1 << 32)),
            "key": key[1],
            "appId": key[0],
            "resources": [],
            "state": self._state(body),
        }
        if full:
            for k in ("selector", "priority", "constraints", "ingressPoint", "egressPoint"):
                if k in body:
                    out[k] = body[k]
            out.setdefault("constraints", [])
        return out

    def _components(self) -> dict[str, int]:
        """Each device's connected component over the ACTIVE links, kept until the links
        change (`set_link`, `set_device`, another list): building it per intent made a list
        of 4,000 intents on a k=32 fat-tree take minutes (issue 33's service at scale)."""
        key = (id(self.links["links"]), len(self.links["links"]), self._links_version)
        if self._comp is None or self._comp[0] != key:
            g = nx.Graph()
            for ln in self.links["links"]:
                if ln.get("state", "ACTIVE") == "ACTIVE":
                    g.add_edge(ln["src"]["device"], ln["dst"]["device"])
            comp = {v: i for i, c in enumerate(nx.connected_components(g)) for v in c}
            self._comp = (key, comp)
        return self._comp[1]

    def _state(self, body: dict[str, Any]) -> str:
        comp = self._components()
        stops = [body["ingressPoint"]["device"]]
        for c in body.get("constraints", []):
            if c["type"] == "WaypointConstraint":
                stops += c["waypoints"]
        stops.append(body["egressPoint"]["device"])
        for a, b in itertools.pairwise(stops):
            if a != b and not (a in comp and b in comp and comp[a] == comp[b]):
                return "FAILED"
        return "INSTALLED"

    def set_link(self, a: str, b: str, state: str) -> None:
        with self.lock:
            self._links_version += 1
            for ln in self.links["links"]:
                if {ln["src"]["device"], ln["dst"]["device"]} == {a, b}:
                    ln["state"] = state

    def set_device(self, device: str, available: bool) -> None:
        """A switch leaving (or returning) as ONOS shows it: the device unavailable and
        every link at it INACTIVE (ACTIVE again on its return)."""
        with self.lock:
            self._links_version += 1
            for d in self.devices["devices"]:
                if d["id"] == device:
                    d["available"] = available
            for ln in self.links["links"]:
                if device in (ln["src"]["device"], ln["dst"]["device"]):
                    ln["state"] = "ACTIVE" if available else "INACTIVE"
