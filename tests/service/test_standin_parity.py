"""The ONOS stand-in (onos_standin.py) against the real ONOS 2.7.0: the same requests to
both, on the same topology (the stand-in is given the real ONOS's devices, links and hosts),
must give the same status codes, error messages and intent states; for the ONOS app's
traffic-class resource (`/onos/innet-agg/priority/{job}`, docs/onos-aggregation-api.md) also
the documents in force. Every behaviour the offline tests rely on is here; a difference
means the stand-in encodes a guess.

Skipped, with the reason, where the ONOS built from source is missing (docs/service.md).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import requests

from agg_optimizer.service import onosd

from .onos_standin import PIPECONF, StandinOnos

APP = "org.innetagg.parity"
UNREGISTERED = "org.innetagg.never-registered"


def answer(r: requests.Response) -> tuple[int, Any]:
    """What the service reads of a response: status, and the message of an error."""
    if r.status_code >= 400:
        try:
            return r.status_code, r.json().get("message")
        except ValueError:
            return r.status_code, None
    return r.status_code, None


class Target:
    def __init__(self, base: str) -> None:
        self.base = base
        self.root = base.rsplit("/onos/v1", 1)[0]
        self.auth = ("onos", "rocks")

    def call(self, method: str, path: str, **kw: Any) -> requests.Response:
        """`path` under /onos/v1, or from the root when it starts with /onos/."""
        kw.setdefault("auth", self.auth)
        url = (self.root if path.startswith("/onos/") else self.base) + path
        return requests.request(method, url, timeout=30, **kw)

    def state(self, key: str, timeout_s: float = 30.0) -> str:
        """The intent's state once it leaves the transient ones."""
        deadline = time.monotonic() + timeout_s
        while True:
            r = self.call("GET", f"/intents/{APP}/{key}")
            state = r.json().get("state") if r.status_code == 200 else f"HTTP {r.status_code}"
            if state in ("INSTALLED", "FAILED", "WITHDRAWN") or time.monotonic() > deadline:
                return state
            time.sleep(0.3)


@pytest.fixture(scope="module")
def pair(onos_real: onosd.OnosServer) -> Any:
    standin = StandinOnos()
    standin.devices = onos_real.get("/devices")
    standin.aggregation = {}  # our app is installed in the real ONOS
    standin.pipeconf_devices = {
        d["id"] for d in standin.devices["devices"] if PIPECONF in d.get("driver", "")
    }
    standin.links = onos_real.get("/links")
    standin.hosts = onos_real.get("/hosts")
    standin.start()
    yield Target(onos_real.url), Target(standin.url)
    standin.stop()


def p2p(onos: onosd.OnosServer, key: str, waypoints: list[str] | None = None) -> dict:
    hosts = sorted(onos.get("/hosts")["hosts"], key=lambda h: h["id"])
    src, dst = hosts[0], hosts[-1]
    body: dict[str, Any] = {
        "type": "PointToPointIntent",
        "appId": APP,
        "key": key,
        "priority": 40000,
        "selector": {
            "criteria": [
                {"type": "ETH_SRC", "mac": src["mac"]},
                {"type": "ETH_DST", "mac": dst["mac"]},
            ]
        },
        "ingressPoint": {
            "device": src["locations"][0]["elementId"],
            "port": src["locations"][0]["port"],
        },
        "egressPoint": {
            "device": dst["locations"][0]["elementId"],
            "port": dst["locations"][0]["port"],
        },
    }
    if waypoints is not None:
        body["constraints"] = [{"type": "WaypointConstraint", "waypoints": waypoints}]
    return body


def both(pair: Any, method: str, path: str, **kw: Any) -> tuple[Any, Any]:
    real, standin = pair
    return answer(real.call(method, path, **kw)), answer(standin.call(method, path, **kw))


def test_lookups_of_unknown_keys_and_apps(pair: Any) -> None:
    for t in pair:
        assert t.call("POST", f"/applications/{APP}/register").status_code == 200
    cases = [
        ("GET", f"/intents/{APP}/ia-x-000000000001"),  # 400: Long.decode of a string key
        ("GET", f"/intents/{APP}/123"),  # numeric and unknown: 404
        ("GET", f"/intents/{APP}/0x1f"),
        ("DELETE", f"/intents/{APP}/ia-x-000000000001"),
        ("DELETE", f"/intents/{APP}/123"),
        ("GET", f"/intents/{UNREGISTERED}/ia-x-000000000001"),
        ("DELETE", f"/intents/{UNREGISTERED}/ia-x-000000000001"),
        ("GET", f"/intents/application/{UNREGISTERED}"),
    ]
    for method, path in cases:
        got_real, got_standin = both(pair, method, path)
        assert got_standin == got_real, (method, path)
    bad_auth = [t.call("GET", "/intents", auth=("onos", "wrong")).status_code for t in pair]
    assert bad_auth == [401, 401]


def test_intent_life_cycle(pair: Any, onos_real: onosd.OnosServer) -> None:
    real, standin = pair
    spines = sorted(d["id"] for d in onos_real.get("/devices")["devices"])
    cases = {
        "ia-p-000000000001": p2p(onos_real, "ia-p-000000000001"),
        "ia-p-000000000002": p2p(onos_real, "ia-p-000000000002", waypoints=spines[:1]),
        "ia-p-000000000003": p2p(onos_real, "ia-p-000000000003", ["null:00000000000000ff"]),
    }
    for key, body in cases.items():
        assert both(pair, "POST", "/intents", json=body) == ((201, None), (201, None)), key
    for key in cases:
        assert real.state(key) == standin.state(key), key
    listed = [
        sorted(i["key"] for i in t.call("GET", f"/intents/application/{APP}").json()["intents"])
        for t in pair
    ]
    assert listed[0] == listed[1] == sorted(cases)
    wrong_app = {**cases["ia-p-000000000001"], "appId": UNREGISTERED}
    got_real, got_standin = both(pair, "POST", "/intents", json=wrong_app)
    assert got_standin == got_real
    not_p2p = {**cases["ia-p-000000000001"], "type": "NoSuchIntent"}
    got_real, got_standin = both(pair, "POST", "/intents", json=not_p2p)
    assert got_standin[0] == got_real[0] == 400
    for key in cases:
        assert both(pair, "DELETE", f"/intents/{APP}/{key}") == ((204, None), (204, None))


PRIORITY = "/onos/innet-agg/priority"


def tc_answer(r: requests.Response) -> tuple[int, Any]:
    """`answer`, and for a document the app returns, the document; the reason Jackson
    gives for a body that is not JSON is the parser's own (Java's or Python's), left out."""
    code, message = answer(r)
    if isinstance(message, str) and message.startswith("body: not JSON ("):
        message = "body: not JSON (...)"
    if code in (200, 201) and r.content:
        doc = r.json()
        # The job number depends on the jobs the session placed before; its presence not.
        assert isinstance(doc.pop("p4_job_id", None), int), doc
        return code, doc
    return code, message


def tc_both(pair: Any, method: str, job: str, body: Any = None, **kw: Any) -> tuple[Any, Any]:
    if body is not None:
        kw["json"] = body
    got = tuple(tc_answer(t.call(method, f"{PRIORITY}/{job}", **kw)) for t in pair)
    assert got[0] == got[1], (method, job, body, kw)
    return got[0]


def test_traffic_class_life_cycle(pair: Any, onos_real: onosd.OnosServer) -> None:
    job = "tc-parity-a"
    ours = sorted(
        d["id"]
        for d in onos_real.get("/devices")["devices"]
        if d["available"] and PIPECONF in d.get("driver", "")
    )
    try:
        assert tc_both(pair, "GET", job) == (404, f"job: no traffic class for '{job}'")
        posted = {"job_id": job, "priority_class": 3}
        assert tc_both(pair, "POST", job, posted) == (201, {**posted, "switches": ours})
        assert tc_both(pair, "GET", job) == (200, {**posted, "switches": ours})
        # Replaced: 200, the new class in force; the document is echoed as posted.
        again = {"job_id": job, "priority_class": 6, "switches": None, "note": "kept"}
        assert tc_both(pair, "POST", job, again) == (200, {**again, "switches": ours})
        assert tc_both(pair, "GET", job) == (200, {**again, "switches": ours})
        # A refused replacement leaves the class in force.
        assert tc_both(pair, "POST", job, {**posted, "priority_class": 9})[0] == 400
        assert tc_both(pair, "GET", job)[1]["priority_class"] == 6
        assert tc_both(pair, "DELETE", job) == (204, None)
        assert tc_both(pair, "GET", job) == (404, f"job: no traffic class for '{job}'")
        assert tc_both(pair, "DELETE", job) == (204, None)  # also when absent
        assert tc_both(pair, "DELETE", "never-posted") == (204, None)
    finally:
        for t in pair:
            t.call("DELETE", f"{PRIORITY}/{job}")


def test_traffic_class_refusals(pair: Any, onos_real: onosd.OnosServer) -> None:
    """Each refused document: the same status and message from both (400 naming the field,
    as the contract lists), and nothing applied."""
    job = "tc-parity-b"
    devices = onos_real.get("/devices")["devices"]
    not_ours = next((d["id"] for d in devices if PIPECONF not in d.get("driver", "")), None)
    assert not_ours, devices

    def doc(**kw: Any) -> dict[str, Any]:
        return {"job_id": job, "priority_class": 1, **kw}

    json_h = {"Content-Type": "application/json"}
    not_a_class = "priority_class: an integer 0..7 expected"
    bad_job = "does not match [A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
    cases: list[tuple[str, dict[str, Any], tuple[int, Any]]] = [
        *(
            (job, {"json": doc(priority_class=c)}, (400, f"{not_a_class}, got {shown}"))
            for c, shown in (
                (8, "8"),
                (-1, "-1"),
                ("3", '"3"'),
                (2.5, "2.5"),
                (5.0, "5.0"),
                (True, "true"),
                (None, "null"),
                (10**20, str(10**20)),
            )
        ),
        (job, {"json": {"job_id": job}}, (400, f"{not_a_class}, got null")),  # missing
        (
            job,
            {"json": doc(job_id="other")},
            (400, f"job_id: 'other' is not the job of the path, '{job}'"),
        ),
        (job, {"json": {"priority_class": 1}}, (400, "job_id: a non-empty string expected")),
        (job, {"json": doc(job_id="")}, (400, "job_id: a non-empty string expected")),
        (job, {"json": doc(job_id=7)}, (400, "job_id: a non-empty string expected")),
        ("-lead", {"json": doc(job_id="-lead")}, (400, f"job: '-lead' {bad_job}")),
        ("a%20b", {"json": doc(job_id="a b")}, (400, f"job: 'a b' {bad_job}")),
        *(
            (
                job,
                {"data": raw, "headers": json_h},
                (400, "body: a traffic-class document (JSON object) expected"),
            )
            for raw in ("", "  ", "null", "3", '"x"', "[]", '[{"job_id": "tc-parity-b"}]')
        ),
        *(
            (job, {"data": raw, "headers": json_h}, (400, "body: not JSON (...)"))
            for raw in ('{"job_id": ', '{"job_id": "tc-parity-b",}', "{'job_id': 1}", "nul")
        ),
        *(
            (job, {"data": json.dumps(doc()), "headers": {"Content-Type": media}}, (415, None))
            for media in ("text/plain", "application/x-www-form-urlencoded")  # curl -d's
        ),
        (job, {"json": doc(switches="device:x")}, (400, "switches: a list of device ids expected")),
        (job, {"json": doc(switches={})}, (400, "switches: a list of device ids expected")),
        (job, {"json": doc(switches=[1])}, (400, "switches[0]: a device id (string) expected")),
        (job, {"json": doc(switches=[""])}, (400, "switches[0]: a device id (string) expected")),
        (
            job,
            {"json": doc(switches=["device:nope"])},
            (400, "switches[0]: unknown device 'device:nope'"),
        ),
        (
            job,
            {"json": doc(switches=["not a uri"])},
            (400, "switches[0]: unknown device 'not a uri'"),
        ),
        # A switch listed twice is refused before any device is looked up.
        (
            job,
            {"json": doc(switches=["device:nope", "device:nope"])},
            (400, "switches[1]: 'device:nope' is listed twice (switches[0])"),
        ),
        (
            job,
            {"json": doc(switches=[not_ours])},
            (
                400,
                f"switches[0]: device '{not_ours}' does not run the innet-agg pipeconf"
                f" ({PIPECONF})",
            ),
        ),
    ]
    for path_job, kw, want in cases:
        got = tuple(tc_answer(t.call("POST", f"{PRIORITY}/{path_job}", **kw)) for t in pair)
        assert got == (want, want), (path_job, kw)
        assert tc_both(pair, "GET", path_job)[0] == 404, (path_job, kw)
    for method in ("GET", "POST", "DELETE"):
        got = [
            t.call(method, f"{PRIORITY}/{job}", auth=("onos", "wrong"), json=doc()) for t in pair
        ]
        assert [r.status_code for r in got] == [401, 401], method
    assert tc_both(pair, "GET", "-lead") == (404, "job: no traffic class for '-lead'")
    # No Content-Type at all: Jersey takes the body as JSON.
    try:
        raw = {"data": json.dumps(doc())}
        assert tc_both(pair, "POST", job, **raw) == (201, {**doc(), "switches": []})
    finally:
        for t in pair:
            t.call("DELETE", f"{PRIORITY}/{job}")


def test_traffic_class_job_numbers_run_out(pair: Any) -> None:
    """256 job numbers (agg_job's size): a new job past them is 503 on both; a job holding
    one keeps getting its class, and a number freed by DELETE is taken again. How many are
    free at the start depends on the session's other jobs, so only the answers are compared."""
    jobs = [f"tc-n{n}" for n in range(257)]
    try:
        for t in pair:
            answers = []
            for job in jobs:
                # No switches: nothing written, whatever devices the session has connected.
                body = {"job_id": job, "priority_class": 2, "switches": []}
                r = t.call("POST", f"{PRIORITY}/{job}", json=body)
                answers.append(answer(r))
                if r.status_code == 503:
                    break
            assert answers[-1] == (503, "job: all 256 job numbers are in use"), t.base
            assert {a for a in answers[:-1]} == {(201, None)}, t.base
            held, refused = jobs[len(answers) - 2], jobs[len(answers) - 1]
            body = {"job_id": held, "priority_class": 4, "switches": []}
            assert answer(t.call("POST", f"{PRIORITY}/{held}", json=body)) == (200, None)
            assert answer(t.call("GET", f"{PRIORITY}/{refused}"))[0] == 404
            assert t.call("DELETE", f"{PRIORITY}/{held}").status_code == 204
            body = {"job_id": refused, "priority_class": 4, "switches": []}
            r = t.call("POST", f"{PRIORITY}/{refused}", json=body)
            assert r.status_code == 201, r.text
    finally:
        for t in pair:
            for job in jobs:
                t.call("DELETE", f"{PRIORITY}/{job}")
