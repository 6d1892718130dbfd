"""ONOS REST client: topology, host resolution, intents, and the aggregation app's resource.

A placement becomes two PointToPointIntents per (job, worker):
- `ia-<job>-<worker MAC>`: the worker's MAC as source and the PS's MAC as destination, from
  the worker's attachment point to the PS's, with a WaypointConstraint listing every switch
  of the worker's placed path in order, so ONOS routes exactly that path through the job's
  aggregators;
- `ia-<job>-<worker MAC>-ack`: the reverse, PS to worker, through the same switches in
  reverse order, for the PS's acknowledgements (unicast to each worker, docs/protocols.md).
Codecs: ONOS 2.7 `IntentCodec`, `PointToPointIntentCodec`, `DecodeConstraintCodecHelper`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from agg_optimizer.model.documents import JobPlacement, Placement, Topology
from agg_optimizer.model.topology import from_onos

log = logging.getLogger(__name__)

MAC_RE = re.compile(r"^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}$")
IP_RE = re.compile(r"^\d{1,3}(\.\d{1,3}){3}$|^[0-9A-Fa-f:]*:[0-9A-Fa-f:]*$")
AGGREGATION_PATH = "/onos/innet-agg/aggregation"
PRIORITY_PATH = "/onos/innet-agg/priority"


class OnosUnavailable(RuntimeError):
    """ONOS did not answer (connection refused, timeout, 5xx after retries)."""


class OnosError(RuntimeError):
    """ONOS answered with an error for one request."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"ONOS {status}: {message}")
        self.status = status


@dataclass(frozen=True)
class HostInfo:
    id: str
    mac: str
    ips: tuple[str, ...]
    device: str
    port: str


@dataclass
class IntentResult:
    key: str
    state: str
    reason: str | None = None


def intent_key(job_id: str, worker_mac: str, ack: bool = False) -> str:
    """Key of the worker→PS intent, or (`ack`) of the PS→worker one."""
    return f"ia-{job_id}-{worker_mac.replace(':', '').lower()}" + ("-ack" if ack else "")


def job_of_key(key: str) -> str | None:
    """The job of either key form; `-ack` is not hex, so the two forms never collide."""
    m = re.match(r"^ia-(.+)-[0-9a-f]{12}(?:-ack)?$", key)
    return m.group(1) if m else None


def intent_shape(doc: Mapping[str, Any]) -> tuple:
    """What decides where an intent's traffic goes, from our body or from ONOS's encoding
    of the intent it holds: selector, priority, ingress and egress points, waypoints. Two
    equal shapes route alike; ONOS's spelling (MAC case, criteria order, port as a string)
    does not count."""

    def point(p: Any) -> tuple[str, str]:
        p = p or {}
        return str(p.get("device", "")), str(p.get("port", ""))

    criteria = sorted(
        (str(c.get("type")), json.dumps({k: str(v).lower() for k, v in c.items() if k != "type"}))
        for c in (doc.get("selector") or {}).get("criteria", [])
    )
    constraints = sorted(json.dumps(c, sort_keys=True) for c in doc.get("constraints") or [])
    return (
        tuple(criteria),
        int(doc.get("priority", -1)),
        point(doc.get("ingressPoint")),
        point(doc.get("egressPoint")),
        tuple(constraints),
    )


def intent_digest(body: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


class OnosClient:
    def __init__(
        self,
        base_url: str,
        user: str,
        password: str,
        *,
        app_id: str = "org.innetagg.optimizer",
        timeout_s: float = 5.0,
        retries: int = 2,
        priority: int = 40000,
        capacity_gbps: float = 10.0,
    ) -> None:
        # An ONOS cluster's nodes (commas): calls go to the node that answered last, and
        # on to the next when it cannot be reached; every node serves the same stores.
        self.nodes = [u.strip().rstrip("/") for u in base_url.split(",") if u.strip()]
        self._node = 0
        self.base = self.nodes[0]
        self.root = self.base.rsplit("/onos/", 1)[0]
        self.app_id = app_id
        self.timeout = timeout_s
        self.priority = priority
        self.capacity_gbps = capacity_gbps
        self.session = requests.Session()
        # The password stays inside the session; it is never formatted into a message.
        self.session.auth = (user, password)
        retry = Retry(
            total=retries,
            connect=retries,
            read=retries,
            status=retries,
            backoff_factor=0.2,
            status_forcelist=(502, 503, 504),
            allowed_methods=frozenset({"GET", "DELETE", "PUT"}),
            raise_on_status=False,
        )
        self.session.mount("http://", HTTPAdapter(max_retries=retry))
        self.session.mount("https://", HTTPAdapter(max_retries=retry))
        self._registered = False

    # --- transport ------------------------------------------------------------------------

    def _request(
        self, method: str, url: str, *, app_errors: bool = False, **kw: Any
    ) -> requests.Response:
        """`app_errors`: a 503 that carries a JSON message is the app's answer about the
        request (a device of the document not available), returned, not an outage."""
        r = self._on_a_live_node(method, url, **kw)
        if app_errors and r.status_code == 503 and _json_message(r):
            return r
        if r.status_code >= 500:
            raise OnosUnavailable(f"ONOS at {self.root} answered {r.status_code}")
        if r.status_code == 401:
            raise OnosUnavailable(f"ONOS at {self.root} rejected the credentials (401)")
        return r

    def _on_a_live_node(self, method: str, url: str, **kw: Any) -> requests.Response:
        """`url` (on the current node) on the current node, or on the next ones in turn
        when it cannot be reached or answers 503 (a node that is starting or has lost its
        cluster); the node that answers becomes the current one."""
        tail = url[len(self.root) :] if url.startswith(self.root) else None
        last = ""
        for i in range(len(self.nodes)):
            n = (self._node + i) % len(self.nodes)
            node_root = self.nodes[n].rsplit("/onos/", 1)[0]
            target = node_root + tail if tail is not None else url
            try:
                r = self.session.request(method, target, timeout=self.timeout, **kw)
            except requests.RequestException as e:
                last = f"ONOS at {node_root} unreachable: {type(e).__name__}"
                continue
            if r.status_code == 503 and len(self.nodes) > 1 and not _json_message(r):
                last = f"ONOS at {node_root} answered 503"
                continue
            if n != self._node:
                self._node, self.base, self.root = n, self.nodes[n], node_root
            return r
        if len(self.nodes) > 1:
            last = f"no ONOS node answered ({last}; tried {len(self.nodes)} nodes)"
        raise OnosUnavailable(last)

    def _get_json(self, path: str) -> dict[str, Any]:
        r = self._request("GET", self.base + path)
        if r.status_code != 200:
            raise OnosError(r.status_code, _message(r))
        return r.json()

    def ping(self) -> None:
        self._get_json("/devices")

    def app_missing(self) -> list[str]:
        """The nodes on which the innet-agg app does not serve its REST (not installed, not
        active, or its web context not up there): each node is asked, as a switch's
        aggregation is written through whichever node answers. The app answers an unknown
        job with 404 "job: no placement for ..."; any other answer (Jetty's or ONOS's own
        404) means it is not there."""
        out = []
        for node in self.nodes:
            root = node.rsplit("/onos/", 1)[0]
            try:
                r = self.session.request(
                    "GET", f"{root}{AGGREGATION_PATH}/readyz-probe", timeout=self.timeout
                )
            except requests.RequestException as e:
                out.append(f"{root} ({type(e).__name__})")
                continue
            if not (r.status_code == 404 and (_json_message(r) or "").startswith("job:")):
                out.append(f"{root} (HTTP {r.status_code}, not the app's answer)")
        return out

    # --- topology -------------------------------------------------------------------------

    def snapshot(self) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        return self._get_json("/devices"), self._get_json("/links"), self._get_json("/hosts")

    def topology(self) -> tuple[Topology, dict[str, HostInfo], dict[str, Any]]:
        devices, links, hosts = self.snapshot()
        topo = from_onos(devices, links, hosts, capacity_gbps=self.capacity_gbps)
        infos: dict[str, HostInfo] = {}
        for h in hosts.get("hosts", []):
            locs = h.get("locations") or []
            if not locs:
                continue
            infos[h["id"]] = HostInfo(
                id=h["id"],
                mac=h.get("mac", h["id"].split("/")[0]),
                ips=tuple(h.get("ipAddresses", [])),
                device=locs[0]["elementId"],
                port=str(locs[0]["port"]),
            )
        return topo, infos, devices

    # --- intents --------------------------------------------------------------------------

    def register_app(self) -> None:
        if self._registered:
            return
        r = self._request("POST", f"{self.base}/applications/{quote(self.app_id)}/register")
        if r.status_code not in (200, 201):
            raise OnosError(r.status_code, _message(r))
        self._registered = True

    def intent_bodies(
        self, placement: JobPlacement, hosts: Mapping[str, HostInfo], ps: str
    ) -> dict[str, dict[str, Any]]:
        """The intents that pin each worker's path, and its reverse for the PS's
        acknowledgements, by key."""
        dst = hosts[ps]
        out: dict[str, dict[str, Any]] = {}
        for worker, path in placement.worker_paths.items():
            src = hosts[worker]
            switches = [n for n in path if n not in hosts]
            for ack in (False, True):
                a, b, way = (dst, src, switches[::-1]) if ack else (src, dst, switches)
                body = self._p2p(intent_key(placement.job_id, src.mac, ack), a, b, way)
                out[body["key"]] = body
        return out

    def _p2p(self, key: str, src: HostInfo, dst: HostInfo, waypoints: list[str]) -> dict:
        return {
            "type": "PointToPointIntent",
            "appId": self.app_id,
            "key": key,
            "priority": self.priority,
            "selector": {
                "criteria": [
                    {"type": "ETH_SRC", "mac": src.mac},
                    {"type": "ETH_DST", "mac": dst.mac},
                ]
            },
            "ingressPoint": {"device": src.device, "port": src.port},
            "egressPoint": {"device": dst.device, "port": dst.port},
            "constraints": [{"type": "WaypointConstraint", "waypoints": waypoints}]
            if waypoints
            else [],
        }

    def submit(self, body: Mapping[str, Any]) -> None:
        r = self._request("POST", self.base + "/intents", json=body)
        if _app_unknown(r):
            # ONOS restarted without its state: the registration we cached is gone.
            log.warning(
                "ONOS does not know application %s any more: registering again", self.app_id
            )
            self._registered = False
            self.register_app()
            r = self._request("POST", self.base + "/intents", json=body)
        if r.status_code not in (200, 201):
            raise OnosError(r.status_code, _message(r))

    def intent(self, key: str) -> tuple[str | None, list[Any] | None]:
        """The intent's state and the constraints ONOS holds for it (None if not said)."""
        r = self._request("GET", f"{self.base}/intents/{quote(self.app_id)}/{quote(key)}")
        if r.status_code == 404 or _unknown_string_key(r):
            return None, None
        if r.status_code != 200:
            raise OnosError(r.status_code, _message(r))
        doc = r.json()
        return doc.get("state"), doc.get("constraints")

    def wait_installed(
        self,
        keys: list[str],
        timeout_s: float,
        unknown_grace_s: float = 5.0,
        bodies: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> list[IntentResult]:
        """Poll until every key is INSTALLED, FAILED, CORRUPT or WITHDRAWN. ONOS answers a
        submission before its intent store holds the intent, so a key it does not know yet
        stays pending for `unknown_grace_s` before it is reported MISSING; and a key it knew
        answers with the old intent's state meanwhile (a CORRUPT one through a switch that
        left, when the new one goes around it): with `bodies`, a state counts only once
        ONOS holds the submitted constraints (ONOS 2.7 says them), else only after the
        grace unless it is INSTALLED."""
        pending = set(keys)
        results: dict[str, IntentResult] = {}
        last: dict[str, str | None] = {}
        start = time.monotonic()
        deadline = start + timeout_s
        while pending:
            grace_over = time.monotonic() - start >= min(unknown_grace_s, timeout_s)
            for key in sorted(pending):
                state, held = self.intent(key)
                last[key] = state
                if bodies is not None and key in bodies and state is not None:
                    want = list(bodies[key].get("constraints", []))
                    if held is not None and held != want:
                        continue  # still the old intent
                    if held is None and state != "INSTALLED" and not grace_over:
                        continue
                # CORRUPT: ONOS failed to install it and retries (its IntentCleanup
                # resubmits such intents): seen on a resubmitted key whose old path lost a
                # switch, INSTALLED a few seconds later. Final only at the deadline.
                if state in ("INSTALLED", "FAILED", "WITHDRAWN") or (state is None and grace_over):
                    reason = None
                    if state == "FAILED":
                        reason = "ONOS could not compile or install it (no path meets them)"
                    elif state is None:
                        reason = "ONOS does not know the intent"
                    results[key] = IntentResult(key, state or "MISSING", reason)
                    pending.discard(key)
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        for key in pending:
            state = last.get(key)
            why = f"not INSTALLED within {timeout_s} s" + (f" ({state})" if state else "")
            results[key] = IntentResult(key, state if state == "CORRUPT" else "TIMEOUT", why)
        return [results[k] for k in keys]

    def delete_intent(self, key: str) -> None:
        r = self._request("DELETE", f"{self.base}/intents/{quote(self.app_id)}/{quote(key)}")
        if r.status_code not in (200, 204, 404) and not _unknown_string_key(r):
            raise OnosError(r.status_code, _message(r))

    def our_intents(self) -> dict[str, str]:
        """Keys of this application's intents in ONOS, with their state."""
        return {k: i.get("state", "") for k, i in self._our_intents(False).items()}

    def our_intent_docs(self) -> dict[str, dict[str, Any]]:
        """This application's intents in ONOS as ONOS holds them, by key: state, selector,
        priority, points, constraints (`?detail=true`: ONOS 2.7's IntentsWebResource
        encodes each with its own codec)."""
        return self._our_intents(True)

    def _our_intents(self, detail: bool) -> dict[str, dict[str, Any]]:
        url = f"{self.base}/intents/application/{quote(self.app_id)}"
        r = self._request("GET", url + ("?detail=true" if detail else ""))
        if r.status_code == 404:  # the application id is not registered (ONOS restarted?)
            self._registered = False
            return {}
        if r.status_code != 200:
            raise OnosError(r.status_code, _message(r))
        return {i["key"]: i for i in r.json().get("intents", [])}


class _JobResource:
    """A per-job resource of the ONOS app (docs/onos-aggregation-api.md): POST a document,
    DELETE it; ONOS answers 404 for every path of an app that is not installed."""

    path = ""

    def __init__(self, client: OnosClient) -> None:
        self.client = client

    def _url(self, job_id: str) -> str:
        return f"{self.client.root}{self.path}/{quote(job_id, safe='')}"

    def _post(self, job_id: str, body: dict[str, Any]) -> str:
        """Returns `applied`, or `app-not-installed` when ONOS has no such resource."""
        return self._post_doc(job_id, body)[0]

    def _post_doc(self, job_id: str, body: dict[str, Any]) -> tuple[str, Any]:
        """`_post`, with the document ONOS answered (None when it sent none)."""
        r = self.client._request("POST", self._url(job_id), json=body, app_errors=True)
        if r.status_code == 404:
            return "app-not-installed", None
        if r.status_code not in (200, 201, 204):
            raise OnosError(r.status_code, _message(r))
        try:
            return "applied", r.json()
        except ValueError:
            return "applied", None

    def remove(self, job_id: str) -> str:
        r = self.client._request("DELETE", self._url(job_id))
        if r.status_code == 404:
            return "app-not-installed-or-absent"
        if r.status_code not in (200, 204):
            raise OnosError(r.status_code, _message(r))
        return "removed"


class AggregationApi(_JobResource):
    """The ONOS app's aggregation resource: a job's aggregators on its switches."""

    path = AGGREGATION_PATH

    def apply(self, job: JobPlacement, strategy: str) -> str:
        doc = Placement(
            strategy=strategy,
            jobs=[job],
            objective_s=job.surrogate_s,
            mean_predicted_cct_s=job.predicted_cct_s,
            stats={"path": "heuristic"},
        )
        return self._post(job.job_id, doc.model_dump(mode="json"))


class PriorityApi(_JobResource):
    """The ONOS app's traffic-class resource: one strict-priority class per job on every
    switch running our pipeconf."""

    path = PRIORITY_PATH

    def apply(self, job_id: str, priority_class: int) -> tuple[str, list[str] | None]:
        """The outcome and the switches the app wrote the class to (None if it did not
        say). The app answers 201 with `switches: []` when no device runs our pipeconf:
        accepted, held by nobody."""
        status, doc = self._post_doc(job_id, {"job_id": job_id, "priority_class": priority_class})
        switches = doc.get("switches") if isinstance(doc, dict) else None
        return status, [str(x) for x in switches] if isinstance(switches, list) else None


def _app_unknown(r: requests.Response) -> bool:
    """ONOS's 404 for an intent of an application id it does not know (`IntentCodec`:
    "Application ID is not found"; `IntentsWebResource`: "Application Id not found")."""
    return r.status_code == 404 and "application id" in _message(r).lower()


def _unknown_string_key(r: requests.Response) -> bool:
    """ONOS 2.7's `IntentsWebResource` looks a key up as a string, then, not finding it, as
    `Long.decode(key)`: an unknown non-numeric key (all of ours) answers 400 with the
    NumberFormatException's "For input string", not 404."""
    return r.status_code == 400 and "For input string" in _message(r)


def _json_message(r: requests.Response) -> str | None:
    try:
        body = r.json()
    except ValueError:
        return None
    return str(body["message"]) if isinstance(body, dict) and "message" in body else None


def _message(r: requests.Response) -> str:
    try:
        body = r.json()
        return str(body.get("message", body))[:300]
    except ValueError:
        return (r.text or r.reason or "")[:300]


class HostIndex:
    """ONOS host id, MAC or IP -> the host id, by dict lookups: built once per view (a k=64
    fat-tree has 65,536 hosts, and a scan of them per reference made each registration
    slow). Where hosts share a MAC or an IP, the first in ONOS's order wins."""

    def __init__(self, hosts: Mapping[str, HostInfo]) -> None:
        self.hosts = hosts
        self.macs: dict[str, str] = {}
        self.ips: dict[str, str] = {}
        for h in hosts.values():
            self.macs.setdefault(h.mac.lower(), h.id)
            for ip in h.ips:
                self.ips.setdefault(ip, h.id)

    def resolve(self, ref: str) -> str | None:
        if ref in self.hosts:
            return ref
        if MAC_RE.match(ref):
            return self.macs.get(ref.lower())
        return self.ips.get(ref)
