"""Topologies: generators (fat-tree, leaf-spine), ONOS REST loader, and the networkx view."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from agg_optimizer.model.documents import DEFAULT_SLOTS, Link, Node, Topology

if TYPE_CHECKING:
    import networkx as nx


def fat_tree(
    k: int, *, capacity_gbps: float = 10.0, slots: int = DEFAULT_SLOTS, programmable: bool = True
) -> Topology:
    """Al-Fares k-ary fat-tree: k pods of k/2 edge and k/2 aggregation switches,
    (k/2)^2 core switches, k/2 hosts per edge switch (k^3/4 hosts)."""
    if k < 2 or k % 2:
        raise ValueError(f"fat_tree.k: must be an even number >= 2, got {k}")
    h = k // 2
    nodes: list[Node] = []
    links: list[Link] = []

    def sw(name: str, tier: str) -> None:
        nodes.append(
            Node(id=name, kind="switch", tier=tier, slots=slots, programmable=programmable)
        )

    for c in range(h * h):
        sw(f"c{c}", "core")
    for p in range(k):
        for i in range(h):
            sw(f"a{p}_{i}", "agg")
            sw(f"e{p}_{i}", "edge")
        for i in range(h):
            for j in range(h):
                links.append(Link(src=f"e{p}_{i}", dst=f"a{p}_{j}", capacity_gbps=capacity_gbps))
            for j in range(h):
                core = f"c{i * h + j}"
                links.append(Link(src=f"a{p}_{i}", dst=core, capacity_gbps=capacity_gbps))
            for j in range(h):
                host = f"h{p}_{i}_{j}"
                nodes.append(Node(id=host, kind="host"))
                links.append(Link(src=host, dst=f"e{p}_{i}", capacity_gbps=capacity_gbps))
    return Topology(nodes=nodes, links=links)


def leaf_spine(
    spines: int,
    leaves: int,
    hosts_per_leaf: int,
    *,
    capacity_gbps: float = 10.0,
    uplink_gbps: float | None = None,
    slots: int = DEFAULT_SLOTS,
) -> Topology:
    """Two-tier Clos: every leaf connects to every spine."""
    for name, v in (("spines", spines), ("leaves", leaves), ("hosts_per_leaf", hosts_per_leaf)):
        if v < 1:
            raise ValueError(f"leaf_spine.{name}: must be >= 1, got {v}")
    up = uplink_gbps or capacity_gbps
    nodes = [Node(id=f"s{i}", kind="switch", tier="spine", slots=slots) for i in range(spines)]
    links: list[Link] = []
    for leaf in range(leaves):
        nodes.append(Node(id=f"l{leaf}", kind="switch", tier="leaf", slots=slots))
        for s in range(spines):
            links.append(Link(src=f"l{leaf}", dst=f"s{s}", capacity_gbps=up))
        for j in range(hosts_per_leaf):
            nodes.append(Node(id=f"h{leaf}_{j}", kind="host"))
            links.append(Link(src=f"h{leaf}_{j}", dst=f"l{leaf}", capacity_gbps=capacity_gbps))
    return Topology(nodes=nodes, links=links)


def _port(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def from_onos(
    devices: Mapping[str, Any],
    links: Mapping[str, Any],
    hosts: Mapping[str, Any],
    *,
    capacity_gbps: float = 10.0,
    slots: int = DEFAULT_SLOTS,
    programmable: Callable[[Mapping[str, Any]], bool] | None = None,
) -> Topology:
    """Build a topology from the JSON bodies of ONOS's `/devices`, `/links` and `/hosts`.

    ONOS lists each direction of a link separately; they are merged into one full-duplex
    link. Unavailable devices and links that are not ACTIVE are left out. Port speed is not
    part of `/links`, so `capacity_gbps` applies unless a device annotation `linkGbps` says
    otherwise. `programmable(device_json)` decides which switches can aggregate (default: all
    available switches).
    """
    nodes: list[Node] = []
    present: set[str] = set()
    for dev in devices.get("devices", []):
        if not dev.get("available", True) or dev.get("type", "SWITCH") != "SWITCH":
            continue
        did = dev["id"]
        prog = programmable(dev) if programmable else True
        nodes.append(Node(id=did, kind="switch", programmable=prog, slots=slots))
        present.add(did)

    out: list[Link] = []
    seen: set[frozenset[str]] = set()
    for ln in links.get("links", []):
        if ln.get("state", "ACTIVE") != "ACTIVE":
            continue
        a, b = ln["src"]["device"], ln["dst"]["device"]
        if a not in present or b not in present:
            continue
        key = frozenset((a, b))
        if key in seen:
            continue
        seen.add(key)
        out.append(
            Link(
                src=a,
                dst=b,
                capacity_gbps=capacity_gbps,
                src_port=_port(ln["src"].get("port")),
                dst_port=_port(ln["dst"].get("port")),
            )
        )

    for host in hosts.get("hosts", []):
        locs = [loc for loc in host.get("locations", []) if loc.get("elementId") in present]
        if not locs:
            continue
        # A multi-homed host is attached at its first location: the placement pins one path.
        loc = locs[0]
        nodes.append(Node(id=host["id"], kind="host"))
        out.append(
            Link(
                src=host["id"],
                dst=loc["elementId"],
                capacity_gbps=capacity_gbps,
                dst_port=_port(loc.get("port")),
            )
        )
    return Topology(nodes=nodes, links=out)


def to_networkx(topo: Topology) -> nx.Graph:
    """Undirected graph; node attributes from `Node`, edge attribute `capacity_gbps`."""
    import networkx as nx  # here: the generators need not load it

    g = nx.Graph()
    for n in topo.nodes:
        g.add_node(n.id, **n.model_dump(exclude={"id"}))
    for ln in topo.links:
        g.add_edge(ln.src, ln.dst, capacity_gbps=ln.capacity_gbps)
    return g
