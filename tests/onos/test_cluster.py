"""The app on an ONOS 2.7 cluster (issue 33, item 1): three Atomix 3.1.9 nodes (our
launcher, `onos-app/atomix/`) and two ONOS nodes from the source build on one machine
(`cluster.py`), the null providers' spine-leaf, our app installed through node 1.

Every piece of the app's state is in ONOS's distributed stores, so: a placement posted to
node 1 is read and deleted through node 2; job numbers handed out by both nodes at once
are unique; a node SIGKILLed loses nothing, the survivor serves and keeps the rules, and
the node restarted converges. Skipped, saying why, where ONOS or the launcher is not built.
Slow (two ONOS nodes boot in minutes on 2 cores): one cluster for the module.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agg_optimizer.service import onosd

from . import cluster
from .test_app import ONOS_APP, RESOURCE, fabric_ids, fixture

REPO = Path(__file__).resolve().parents[2]

PRIORITY = "/onos/innet-agg/priority"
OWNER = "/onos/innet-agg/owner"
JSON = {"Content-Type": "application/json"}
SHAPE = "spineleaf,2,3,2"

pytestmark = pytest.mark.skipif(
    cluster.skip_reason() is not None, reason=str(cluster.skip_reason())
)


@pytest.fixture(scope="module")
def onos_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cluster.OnosCluster]:
    built = sorted((REPO / "onos-app" / "target").glob("innet-agg-onos-*.oar"))
    if not built:
        pytest.skip("no onos-app/target/*.oar to install: `make onos-app` builds it")
    oar = built[-1]
    base = tmp_path_factory.mktemp("cluster")
    with cluster.AtomixCluster(base) as atomix, cluster.OnosCluster(atomix, 2) as oc:
        print(f"cluster up, seconds from launch: {oc.timings}")
        n1, n2 = oc.nodes
        n1.shape = SHAPE
        n1._start_null_topology(time.monotonic() + cluster.START_S)
        hosts = 3 * 2
        for n in oc.nodes:
            onosd.wait_for(lambda n=n: len(n.get("/hosts")["hosts"]) >= hosts, 300,
                           f"{hosts} hosts seen by {n.node_id}")  # fmt: skip
        n1.install_app(oar, ONOS_APP, timeout_s=600, probe=f"{RESOURCE}/absent")
        probe_json(n2, f"{RESOURCE}/absent")
        yield oc


def probe_json(node: cluster.OnosNode, path: str, timeout_s: float = 300) -> None:
    """Until the app's resource answers JSON on `node` (its web context is up there)."""
    onosd.wait_for(
        lambda: node.request("GET", path).headers.get("Content-Type", "").startswith(
            "application/json"),
        timeout_s, f"{path} answering JSON on {node.node_id}",
    )  # fmt: skip


def job_doc(ids: dict[str, str], job: str, k: int) -> str:
    """valid.json for job `job`, its pools moved to slots of its own (16 * k onwards)."""
    doc = json.loads(fixture("valid.json", ids))
    jp = doc["jobs"][0]
    jp["job_id"] = job
    for i, a in enumerate(jp["aggregators"]):
        a["pool"] = {"base": 16 * (2 * k + i), "size": 16}
    return json.dumps(doc)


def agg_rules(node: cluster.OnosNode) -> set[str]:
    return {f["deviceId"] for f in node.table_flows(".agg_job")}


def test_the_nodes_form_one_cluster_on_atomix(onos_cluster: cluster.OnosCluster) -> None:
    for n in onos_cluster.nodes:
        assert onos_cluster.active_nodes(n) == {"onos-1", "onos-2"}
        assert n.get(f"/applications/{ONOS_APP}")["state"] == "ACTIVE"
    # devices are mastered across the cluster, and both nodes see all of them
    ids = [{d["id"] for d in n.get("/devices")["devices"]} for n in onos_cluster.nodes]
    assert ids[0] == ids[1] and len(ids[0]) == 5


def test_placed_through_one_node_read_and_deleted_through_the_other(
    onos_cluster: cluster.OnosCluster,
) -> None:
    n1, n2 = onos_cluster.nodes
    ids = fabric_ids(n1)
    doc = job_doc(ids, "across", 0)
    switches = {a["switch"] for a in json.loads(doc)["jobs"][0]["aggregators"]}
    r = n1.request("POST", f"{RESOURCE}/across", data=doc, headers=JSON)
    assert r.status_code == 201, r.text
    posted = r.json()
    try:
        onosd.wait_for(lambda: n2.request("GET", f"{RESOURCE}/across").status_code == 200, 60)
        assert n2.request("GET", f"{RESOURCE}/across").json() == posted
        onosd.wait_for(lambda: agg_rules(n2) == switches, 120, "agg_job rules seen by node 2")
        # a traffic class too, through node 2, read through node 1
        r = n2.request("POST", f"{PRIORITY}/across", data=json.dumps(
            {"job_id": "across", "priority_class": 5}), headers=JSON)  # fmt: skip
        assert r.status_code in (200, 201), r.text
        got = n1.request("GET", f"{PRIORITY}/across")
        assert got.status_code == 200 and got.json()["priority_class"] == 5, got.text
        assert got.json()["p4_job_id"] == posted["p4_job_id"]
    finally:
        assert n2.request("DELETE", f"{PRIORITY}/across").status_code in (204, 404)
        assert n2.request("DELETE", f"{RESOURCE}/across").status_code == 204
    assert n1.request("GET", f"{RESOURCE}/across").status_code == 404
    onosd.wait_for(lambda: not agg_rules(n1), 120, "agg_job rules gone")


def test_job_numbers_from_both_nodes_at_once_are_unique(
    onos_cluster: cluster.OnosCluster,
) -> None:
    nodes = onos_cluster.nodes
    ids = fabric_ids(nodes[0])
    jobs = [f"race-{k}" for k in range(8)]
    answers: dict[str, dict] = {}

    def post(k: int) -> None:
        node = nodes[k % 2]
        r = node.request("POST", f"{RESOURCE}/{jobs[k]}", data=job_doc(ids, jobs[k], k + 1),
                         headers=JSON)  # fmt: skip
        answers[jobs[k]] = {"status": r.status_code, **(r.json() if r.content else {})}

    threads = [threading.Thread(target=post, args=(k,)) for k in range(len(jobs))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert {j: a["status"] for j, a in answers.items()} == dict.fromkeys(jobs, 201), answers
        numbers = [a["p4_job_id"] for a in answers.values()]
        assert len(set(numbers)) == len(jobs), numbers
        for n in nodes:  # the same numbers on each node
            assert {j: n.request("GET", f"{RESOURCE}/{j}").json()["p4_job_id"] for j in jobs} == {
                j: a["p4_job_id"] for j, a in answers.items()
            }
    finally:
        for j in jobs:
            nodes[1].request("DELETE", f"{RESOURCE}/{j}")
    onosd.wait_for(lambda: not agg_rules(nodes[0]), 120, "agg_job rules gone")


def test_a_killed_node_loses_nothing_and_converges_when_back(
    onos_cluster: cluster.OnosCluster,
) -> None:
    n1, n2 = onos_cluster.nodes
    ids = fabric_ids(n1)
    doc = job_doc(ids, "survivor", 20)
    switches = {a["switch"] for a in json.loads(doc)["jobs"][0]["aggregators"]}
    r = n2.request("POST", f"{RESOURCE}/survivor", data=doc, headers=JSON)
    assert r.status_code == 201, r.text
    posted = r.json()
    try:
        onosd.wait_for(lambda: agg_rules(n1) == switches, 120, "rules before the kill")
        n2.kill()  # SIGKILL the node the placement went through
        onosd.wait_for(lambda: onos_cluster.active_nodes(n1) == {"onos-1"}, 180,
                       "node 1 seeing node 2 gone")  # fmt: skip
        # The survivor serves: the placement, its rules, and new changes
        assert n1.request("GET", f"{RESOURCE}/survivor").json() == posted
        onosd.wait_for(lambda: agg_rules(n1) == switches, 180, "rules after the kill")
        late = job_doc(ids, "late", 21)
        r = n1.request("POST", f"{RESOURCE}/late", data=late, headers=JSON)
        assert r.status_code == 201, r.text
        assert r.json()["p4_job_id"] != posted["p4_job_id"]
        # The node back: it converges on everything, including what changed while it was down
        n2.launch(fresh_cache=True)  # as a container recreated (cluster.py says why)
        n2.wait_ready(cluster.START_S)
        onos_cluster.wait_formed(cluster.START_S)
        probe_json(n2, f"{RESOURCE}/absent")
        assert n2.request("GET", f"{RESOURCE}/survivor").json() == posted
        assert n2.request("GET", f"{RESOURCE}/late").json() == r.json()
        onosd.wait_for(lambda: agg_rules(n2) == switches, 180, "rules seen by node 2 again")
    finally:
        for j in ("survivor", "late"):
            n1.request("DELETE", f"{RESOURCE}/{j}")
        if n2.proc is None:  # failed while node 2 was down: back for the tests after this one
            n2.launch(fresh_cache=True)
            n2.wait_ready(cluster.START_S)
            onos_cluster.wait_formed(cluster.START_S)
            probe_json(n2, f"{RESOURCE}/absent")
    onosd.wait_for(lambda: not agg_rules(n1), 120, "agg_job rules gone")


def test_cluster_logs_have_no_app_errors(onos_cluster: cluster.OnosCluster) -> None:
    for n in onos_cluster.nodes:
        log = n.karaf_log()
        assert "org.innetagg" in log
        bad = [ln for ln in log.splitlines() if "ERROR" in ln and "innetagg" in ln]
        assert not bad, bad[:5]


def test_two_nodes_at_once_never_both_take_overlapping_pools(
    onos_cluster: cluster.OnosCluster,
) -> None:
    """The pool check and the write are one step across the cluster (each switch's claims
    written by compare-and-set, under ONOS's distributed lock too): two jobs whose pools
    overlap, posted to the two nodes at once, one accepted, the other 409 naming both."""
    nodes = onos_cluster.nodes
    ids = fabric_ids(nodes[0])
    answers: dict[str, int] = {}
    refused: list[str] = []
    for rnd in range(3):
        jobs = (f"pool-a{rnd}", f"pool-b{rnd}")
        docs = [json.loads(job_doc(ids, j, 30)) for j in jobs]  # the same slots
        start = threading.Barrier(2)

        def post(
            k: int, jobs: tuple[str, ...] = jobs, docs: list = docs,
            start: threading.Barrier = start,
        ) -> None:  # fmt: skip
            start.wait()
            r = nodes[k].request("POST", f"{RESOURCE}/{jobs[k]}", data=json.dumps(docs[k]),
                                 headers=JSON)  # fmt: skip
            answers[jobs[k]] = r.status_code
            if r.status_code == 409:
                refused.append(r.json()["message"])

        threads = [threading.Thread(target=post, args=(k,)) for k in (0, 1)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            codes = sorted(answers[j] for j in jobs)
            assert codes == [201, 409], answers
            assert all(f"'{j}'" in refused[-1] for j in jobs), refused
        finally:
            for j in jobs:
                nodes[0].request("DELETE", f"{RESOURCE}/{j}")


# bmv2 1.15.5's P4Runtime server crashed under the cluster once, in the full suite (CI, beside
# the session's ONOS; dmesg: `grpcpp_sync_ser segfault ... in libpip4info.so`, the p4info
# NULL crash seen before when a write meets a switch whose pipeline is being set): with two
# ONOS nodes driving one switch, one node's write can meet the other's pipeline push. The
# test passed 3 of 3 runs of this module alone; it runs where asked, not by default.
BMV2_OPT_IN = "INNET_AGG_CLUSTER_BMV2"


@pytest.fixture(scope="module")
def bmv2_device(onos_cluster: cluster.OnosCluster, tmp_path_factory) -> Iterator[dict]:
    """One simple_switch_grpc running nothing until ONOS pushes our pipeline, attached to
    the cluster through node 1's network configuration; its two hosts learned."""
    import os

    if os.environ.get(BMV2_OPT_IN) != "1":
        pytest.skip(
            "bmv2 1.15.5's P4Runtime server segfaulted (libpip4info, p4info NULL) once under "
            "two ONOS nodes in the full suite; passed 3/3 alone. " + BMV2_OPT_IN + "=1 runs it"
        )

    from p4 import bmv2

    from .test_bmv2_device import HOST_MAC, arp_request

    why = bmv2.grpc_skip_reason()
    if why:
        pytest.skip(why)
    log = tmp_path_factory.mktemp("bmv2c") / "switch"
    n1 = onos_cluster.nodes[0]
    with bmv2.GrpcSwitch("iac1", log) as sw:
        try:
            cfg = sw.netcfg(BMV2, "org.innetagg.bmv2")
            assert n1.request("POST", "/network/configuration", json=cfg).status_code == 200
            for n in onos_cluster.nodes:
                onosd.wait_for(
                    lambda n=n: n.request("GET", f"/devices/{BMV2}").json().get("available"),
                    300, f"the bmv2 device available on {n.node_id}",
                )  # fmt: skip

            def learned() -> bool:
                for i in (1, 2):
                    sw.ports[i].send(arp_request(i))
                macs = {h["mac"].upper() for h in n1.get("/hosts")["hosts"]}
                return all(m in macs for m in HOST_MAC.values())

            onosd.wait_for(learned, 300, "both hosts learned")
            yield {"thrift_port": sw.thrift_port, "hosts": [f"{HOST_MAC[i]}/None" for i in (1, 2)]}
        finally:
            live = next((n for n in onos_cluster.nodes if n.proc is not None), None)
            if live is not None:
                live.remove_devices([BMV2])  # before bmv2 stops


BMV2 = "device:bmv2:cluster1"


def test_a_bmv2_switch_keeps_its_entries_when_its_master_dies(
    onos_cluster: cluster.OnosCluster, bmv2_device: dict
) -> None:
    """A bmv2 fabric under the cluster: the device's master writes the placement's agg_job
    entry (posted to the other node); the master SIGKILLed, the survivor becomes master, the
    entry stays on the switch (read from bmv2 itself), and a placement posted to the survivor
    lands on the switch too."""

    def master(via: cluster.OnosNode) -> str:
        return str(via.get(f"/mastership/{BMV2}/master").get("nodeId"))

    h1, h2 = bmv2_device["hosts"]

    def doc(job: str, base: int) -> dict:
        return {"strategy": "agg", "jobs": [{"job_id": job, "aggregators": [
            {"switch": BMV2, "children": [h1], "fan_in": 1, "next_hop": h2,
             "pool": {"base": base, "size": 64}}],
            "worker_paths": {h1: [h1, BMV2, h2]}}]}  # fmt: skip

    def on_switch() -> int:
        return entries_on_switch(bmv2_device["thrift_port"], "IngressPipe.aggregation.agg_job")

    owner = master(onos_cluster.nodes[0])
    by_id = {n.node_id: n for n in onos_cluster.nodes}
    other = next(n for n in onos_cluster.nodes if n.node_id != owner)
    r = other.request("POST", f"{RESOURCE}/bmv2-a", json=doc("bmv2-a", 0))
    assert r.status_code == 201, r.text
    onosd.wait_for(lambda: on_switch() == 1, 120, "the agg_job entry on bmv2")
    by_id[owner].kill()
    onosd.wait_for(lambda: master(other) == other.node_id, 180, f"{other.node_id} master")
    assert on_switch() == 1
    r = other.request("POST", f"{RESOURCE}/bmv2-b", json=doc("bmv2-b", 64))
    assert r.status_code == 201, r.text
    onosd.wait_for(lambda: on_switch() == 2, 120, "the second entry on bmv2")
    for j in ("bmv2-a", "bmv2-b"):
        assert other.request("DELETE", f"{RESOURCE}/{j}").status_code == 204
    onosd.wait_for(lambda: on_switch() == 0, 120, "the entries gone from bmv2")
    # the killed node back, for whatever runs after
    by_id[owner].launch(fresh_cache=True)
    by_id[owner].wait_ready(cluster.START_S)
    onos_cluster.wait_formed(cluster.START_S)


def entries_on_switch(thrift_port: int, table: str) -> int:
    """How many entries bmv2 itself holds in `table` (simple_switch_CLI over Thrift)."""
    import os
    import subprocess

    from p4 import bmv2

    cli = bmv2.tool("simple_switch_CLI")
    assert cli
    r = subprocess.run(
        ["/usr/bin/python3", cli, "--thrift-port", str(thrift_port)],
        input=f"table_dump {table}\n", capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": bmv2.P4_PYTHONPATH}, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0 and "TABLE ENTRIES" in r.stdout, r.stdout + r.stderr
    return r.stdout.count("Dumping entry")


def test_two_optimizers_claiming_ownership_on_two_nodes_never_both_win(
    onos_cluster: cluster.OnosCluster,
) -> None:
    """The owner claim (service/ownership.py) is one compare-and-set across the cluster:
    two optimizers with different databases claiming through the two nodes at once, one
    wins, the other gets 409 naming the winner; a replica of the winner renews it."""
    nodes = onos_cluster.nodes
    for rnd in range(5):
        start = threading.Barrier(2)
        codes: dict[str, int] = {}

        def claim(
            k: int, start: threading.Barrier = start, codes: dict = codes, rnd: int = rnd
        ) -> None:
            start.wait()
            body = {"owner": f"store-{k}-{rnd}", "holder": f"host:{k}", "ttl_s": 60}
            r = nodes[k].request("POST", OWNER, data=json.dumps(body), headers=JSON)
            codes[f"store-{k}-{rnd}"] = r.status_code

        threads = [threading.Thread(target=claim, args=(k,)) for k in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(codes.values()) == [200, 409], codes
        won = next(o for o, c in codes.items() if c == 200)
        shown = nodes[1].request("GET", OWNER).json()
        assert shown["owner"] == won, shown
        again = {"owner": won, "holder": "host:9", "ttl_s": 60}
        assert nodes[1].request("POST", OWNER, data=json.dumps(again), headers=JSON).ok
        assert nodes[0].request("DELETE", f"{OWNER}?owner={won}").status_code == 204


def _with_version(oar: Path, version: str, out: Path) -> Path:
    """A copy of the .oar whose app.xml says another version (the bundle unchanged)."""
    import zipfile

    with zipfile.ZipFile(oar) as src, zipfile.ZipFile(out, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename == "app.xml":
                data = data.replace(b'version="0.1.0-SNAPSHOT"', f'version="{version}"'.encode())
                assert f'version="{version}"'.encode() in data
            dst.writestr(item, data)
    return out


def test_the_compose_installer_twice_and_an_upgrade_leave_every_node_with_the_app(
    onos_cluster: cluster.OnosCluster, tmp_path: Path
) -> None:
    """The cluster profile's one-shot (`onos-cluster-app`) run again, as a second `docker
    compose up` or `compose start optimizer-1` does: before, it deleted the app from every
    node and then failed after 600 s with 404 "Application is not found". Run twice it
    touches nothing; an upgrade replaces the app and every node serves the new version;
    the original is put back the same way. Last in the module: the upgrade restarts the
    app on both nodes."""
    from .test_app import AppWatch, run_installer

    oar = sorted((REPO / "onos-app" / "target").glob("innet-agg-onos-*.oar"))[-1]
    urls = [n.url for n in onos_cluster.nodes]
    with AppWatch(onos_cluster.nodes) as watch:
        for _ in range(2):
            r = run_installer(oar, urls)
            assert r.returncode == 0, r.stderr
            assert "already active" in r.stdout, r.stdout
    assert watch.seen == {"ACTIVE"}
    newer = _with_version(oar, "0.1.1-SNAPSHOT", tmp_path / "newer.oar")
    for target, version in ((newer, "0.1.1.SNAPSHOT"), (oar, "0.1.0.SNAPSHOT")):
        r = run_installer(target, urls)
        assert r.returncode == 0, r.stderr
        assert "installed and active (replacing" in r.stdout, r.stdout
        for n in onos_cluster.nodes:
            app = n.get(f"/applications/{ONOS_APP}")
            assert (app["state"], app["version"]) == ("ACTIVE", version)
            probe_json(n, f"{RESOURCE}/absent", timeout_s=60)  # the installer waited for it
