"""Topology generators and the ONOS REST loader."""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx
import pytest

from agg_optimizer.model.documents import Instance, Job
from agg_optimizer.model.topology import fat_tree, from_onos, leaf_spine, to_networkx
from agg_optimizer.placement.engine import solve

ONOS = Path(__file__).parent.parent / "fixtures" / "onos"


@pytest.mark.parametrize("k", [2, 4, 6, 8])
def test_fat_tree_has_the_textbook_shape(k):
    g = to_networkx(fat_tree(k))
    kinds = nx.get_node_attributes(g, "kind")
    tiers = nx.get_node_attributes(g, "tier")
    assert sum(1 for v in kinds.values() if v == "host") == k**3 // 4
    assert sum(1 for v in tiers.values() if v == "core") == (k // 2) ** 2
    assert sum(1 for v in tiers.values() if v == "edge") == k * k // 2
    assert all(g.degree(n) == k for n, t in tiers.items() if t in ("core", "agg", "edge"))
    assert nx.is_connected(g)


def test_fat_tree_rejects_odd_k():
    with pytest.raises(ValueError, match=r"fat_tree\.k"):
        fat_tree(5)


def test_leaf_spine_shape():
    g = to_networkx(leaf_spine(3, 4, 5, uplink_gbps=40))
    assert g.number_of_nodes() == 3 + 4 + 20
    assert g.number_of_edges() == 3 * 4 + 20
    assert g.edges["l0", "s2"]["capacity_gbps"] == 40


def _onos():
    return [json.loads((ONOS / f"{n}.json").read_text()) for n in ("devices", "links", "hosts")]


def test_onos_loader_merges_directions_and_drops_what_is_down():
    devices, links, hosts = _onos()
    topo = from_onos(devices, links, hosts, capacity_gbps=25)
    ids = {n.id for n in topo.nodes}
    assert "device:leaf3" not in ids  # unavailable device
    assert {"device:spine1", "device:spine2", "device:leaf1", "device:leaf2"} <= ids
    g = to_networkx(topo)
    assert not g.has_edge("device:leaf1", "device:leaf2")  # INACTIVE link
    assert g.number_of_edges() == 4 + 4  # four fabric links (one per direction pair) + hosts
    host = "00:00:00:00:00:01/None"
    assert g.has_edge(host, "device:leaf1")
    assert all(d["capacity_gbps"] == 25 for *_, d in g.edges(data=True))
    ln = next(x for x in topo.links if {x.src, x.dst} == {"device:leaf1", "device:spine1"})
    assert {ln.src_port, ln.dst_port} == {3, 1}


def test_onos_topology_places_a_job_end_to_end():
    devices, links, hosts = _onos()
    topo = from_onos(
        devices, links, hosts, programmable=lambda d: d.get("driver") == "bmv2", slots=256
    )
    job = Job(
        id="j",
        workers=["00:00:00:00:00:02/None", "00:00:00:00:00:03/None", "00:00:00:00:00:04/None"],
        ps="00:00:00:00:00:01/None",
        update_bytes=10**8,
    )
    p = solve(Instance(topology=topo, jobs=[job]), "agg").jobs[0]
    # leaf2's two workers meet there: one stream leaves leaf2 instead of two
    assert any(a.switch == "device:leaf2" and a.fan_in == 2 for a in p.aggregators)
    assert p.ps_fan_in < 3
