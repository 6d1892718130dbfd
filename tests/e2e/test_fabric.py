"""The emulated fabric on real parts: three bmv2 switches (a spine, two leaves) under a real
ONOS 2.7.0 through our pipeconf, links found by ONOS's LLDP through our packet-in/out, hosts
by their ARP, and a job placed by the service: its intents INSTALLED across the switches and
its aggregators' `agg_job` entries held by bmv2.

The first step of the closed loop (INT to the collector, re-placement under congestion and
training through it come next). Skipped, with the reason, without ONOS or bmv2.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from agg_optimizer.service import onosd
from p4 import bmv2

from .fabric import Fabric

SERVICE_APP = "org.innetagg.optimizer"  # the service's default ONOS app id
SPINE_LEAF = dict(
    switches=["s1", "l1", "l2"],
    links=[("l1", 1, "s1", 1), ("l2", 1, "s1", 2)],
    hosts={1: ("l1", 2), 2: ("l1", 3), 3: ("l2", 2), 4: ("l2", 3)},
)


@pytest.fixture(scope="module")
def fabric(onos_real: onosd.OnosServer, tmp_path_factory) -> Iterator[Fabric]:
    why = bmv2.grpc_skip_reason()
    if why:
        pytest.skip(why)
    onos_real.fast_readback()
    fab = Fabric(onos_real, log_dir=tmp_path_factory.mktemp("fabric"), **SPINE_LEAF)
    fab.start()
    try:
        yield fab
    finally:
        fab.stop()


def test_onos_sees_the_fabric_and_its_hosts(fabric: Fabric) -> None:
    hosts = fabric.announce_hosts()
    assert sorted(hosts) == [1, 2, 3, 4]
    for sw in fabric.switches.values():
        flows = fabric.onos.get(f"/flows/{sw.device}")["flows"]
        onosd.wait_for(
            lambda d=sw.device: (
                {f["state"] for f in fabric.onos.get(f"/flows/{d}")["flows"]} == {"ADDED"}
            ),
            60,
            f"{sw.device}'s entries held by bmv2: {[f['state'] for f in flows]}",
        )


def test_a_job_placed_by_the_service_lands_on_the_switches(
    fabric: Fabric, onos_service: TestClient
) -> None:
    hosts = fabric.announce_hosts()
    job = {
        "id": "e2e",
        "workers": [hosts[i]["id"] for i in (1, 2, 3)],
        "ps": hosts[4]["id"],
        "update_bytes": 10_000_000,
    }
    c = onos_service
    assert c.post("/api/v1/jobs", json=job).status_code == 201
    res = c.post("/api/v1/jobs/e2e/placement").json()
    assert res["status"] == "applied" and res["aggregation"] == "applied", res
    placed = {a["switch"] for a in res["placement"]["aggregators"]}
    assert placed and placed <= {sw.device for sw in fabric.switches.values()}

    def agg_entries() -> set[str]:
        return {
            f["deviceId"]
            for f in fabric.onos.get("/flows")["flows"]
            if str(f.get("tableName", "")).endswith(".agg_job") and f["state"] == "ADDED"
        }

    onosd.wait_for(lambda: agg_entries() == placed, 60, f"agg_job ADDED on {placed}")
    intents = fabric.onos.get(f"/intents/application/{SERVICE_APP}")["intents"]
    assert {i["state"] for i in intents} == {"INSTALLED"} and len(intents) == 6
    assert c.delete("/api/v1/jobs/e2e").status_code == 200
    onosd.wait_for(lambda: not agg_entries(), 60, "agg_job entries removed")
