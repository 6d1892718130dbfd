"""The fabric always matches the record: an intent changed inside ONOS under one of our keys
(a second writer, an operator, another app) is put back by the next reconcile (every loop
pass) and by re-applying the job. Before, "unchanged" was decided from the store's digest of
what the service had sent, so neither repaired it. Against the real ONOS:
tests/service/test_onos_real.py."""

from __future__ import annotations

import copy
from typing import Any

from fastapi.testclient import TestClient

from agg_optimizer.service.onos import intent_shape

from .onos_standin import StandinOnos
from .test_slot_ledger import job

APP = "org.innetagg.optimizer"


def _ours(onos: StandinOnos) -> dict[str, dict[str, Any]]:
    return {k: b for (app, k), b in onos.intents.items() if app == APP}


def _tamper(onos: StandinOnos, key: str, how: str) -> dict[str, Any]:
    """Replace our intent under `key` inside ONOS, as another writer would."""
    body = copy.deepcopy(onos.intents[(APP, key)])
    if how == "waypoints":
        body["constraints"] = []
    elif how == "priority":
        body["priority"] = 12345
    else:
        body["selector"]["criteria"] = body["selector"]["criteria"][:1]
    with onos.lock:
        onos.intents[(APP, key)] = body
    return body


def test_an_intent_changed_in_onos_is_put_back_by_the_loop_and_by_re_applying(
    client: TestClient, onos: StandinOnos
) -> None:
    assert client.post("/api/v1/jobs", json=job("a", "agg")).status_code == 201
    r = client.post("/api/v1/jobs/a/placement")
    assert r.status_code == 200 and r.json()["status"] == "applied", r.text
    svc = client.app.state.service
    want = {k: intent_shape(b) for k, b in svc.store.desired("a")["a"]["bodies"].items()}
    assert {k: intent_shape(b) for k, b in _ours(onos).items()} == want
    keys = sorted(want)
    for how in ("waypoints", "priority", "selector"):
        key = keys[0] if how != "priority" else keys[-1]
        _tamper(onos, key, how)
        assert intent_shape(_ours(onos)[key]) != want[key]
        out = svc.step()  # one loop pass
        assert "a" in out["repaired"], (how, out)
        assert {k: intent_shape(b) for k, b in _ours(onos).items()} == want, how
    # Re-applying the job repairs it too (its placement unchanged, the intent resubmitted).
    _tamper(onos, keys[1], "waypoints")
    r = client.post("/api/v1/jobs/a/placement")
    assert r.status_code == 200, r.text
    assert keys[1] in r.json()["changes"]["submit"], r.json()["changes"]
    assert {k: intent_shape(b) for k, b in _ours(onos).items()} == want
    # Nothing differs: a pass repairs nothing.
    assert svc.step()["repaired"] == []
