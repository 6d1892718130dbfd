"""The simulated fabric: directed links with capacities, and equal-cost routing.

Built from the same `Topology` document the optimizer reads, so a strategy's placement (whose
worker paths name nodes) maps onto the simulator's links one to one.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from agg_optimizer.model.documents import Topology

if TYPE_CHECKING:
    import networkx as nx


@dataclass
class Fabric:
    topology: Topology
    links: list[tuple[str, str]]  # directed
    index: dict[tuple[str, str], int]
    capacity: np.ndarray  # bit/s per directed link
    attach: dict[str, str]  # host -> its switch
    hosts: list[str]
    switch_edges: list[tuple[str, str]]  # switch-to-switch links, once each
    _paths: dict[tuple[str, str], list[list[str]]] = field(default_factory=dict)

    @classmethod
    def from_topology(cls, topo: Topology) -> Fabric:
        kind = {n.id: n.kind for n in topo.nodes}
        links: list[tuple[str, str]] = []
        caps: list[float] = []
        attach: dict[str, str] = {}
        edges: list[tuple[str, str]] = []
        for ln in topo.links:
            for u, v in ((ln.src, ln.dst), (ln.dst, ln.src)):
                links.append((u, v))
                caps.append(ln.capacity_gbps * 1e9)
            if kind[ln.src] == "host":
                attach[ln.src] = ln.dst
            elif kind[ln.dst] == "host":
                attach[ln.dst] = ln.src
            else:
                edges.append((ln.src, ln.dst))
        return cls(
            topology=topo,
            links=links,
            index={e: i for i, e in enumerate(links)},
            capacity=np.array(caps),
            attach=attach,
            hosts=[n.id for n in topo.nodes if n.kind == "host"],
            switch_edges=edges,
        )

    @cached_property
    def switch_graph(self) -> nx.Graph:
        """The switches and their links, built when routing first needs it (the shared-CCT
        prediction reads only links and capacities, and need not load networkx)."""
        import networkx as nx

        g = nx.Graph()
        g.add_nodes_from(n.id for n in self.topology.nodes if n.kind == "switch")
        g.add_edges_from(self.switch_edges)
        return g

    @property
    def n_links(self) -> int:
        return len(self.links)

    def path_links(self, path: list[str]) -> list[int]:
        """Directed link indices along a node path."""
        try:
            return [self.index[(u, v)] for u, v in itertools.pairwise(path)]
        except KeyError as e:
            raise ValueError(f"path: no link {e.args[0][0]} -> {e.args[0][1]}") from None

    def ecmp_path(self, src: str, dst: str, rng: np.random.Generator) -> list[str]:
        """A host-to-host path: one of the equal-cost switch paths, drawn as a flow hash
        would draw it."""
        a, b = self.attach[src], self.attach[dst]
        key = (a, b)
        if key not in self._paths:
            import networkx as nx

            self._paths[key] = [list(p) for p in nx.all_shortest_paths(self.switch_graph, a, b)]
        options = self._paths[key]
        return [src, *options[int(rng.integers(len(options)))], dst]

    def racks(self) -> dict[str, list[str]]:
        """Hosts grouped by their switch, in topology order."""
        out: dict[str, list[str]] = {}
        for h in self.hosts:
            out.setdefault(self.attach[h], []).append(h)
        return out
