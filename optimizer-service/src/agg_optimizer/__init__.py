"""Placement of in-network aggregation for data-parallel training jobs.

The package is layered; a layer imports only the layers below it, and `make test` checks
this (`[tool.importlinter]` in the workspace's pyproject.toml, docs/architecture.md):

- `cli`: the `agg-optimizer` command, on top of everything;
- `service` (the REST service), `demo` (the closed loop of `make demo`), `evaluation`
  (strategies simulated on seeds, the paper's figures): independent of each other;
- `scheduling` (job order: Grouper, JPAS, ...) and `peers` (NetMax peer selection):
  independent of each other;
- `placement`: the engine, AGG's LP and its family, the baselines, the exact optimum;
- `sim`: the flow-level simulator (max-min sharing, streaming aggregation, INT);
- `model`: the documents, topologies, the network model (routes, CCT), validation, pools.

Modules that lived at the top level before this layout are still importable by their old
names (`agg_optimizer.engine` is `agg_optimizer.placement.engine`), with a
`MovedModuleWarning`.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType

__version__ = "0.1.0"

# old name -> where the module lives now
MOVED = {
    f"agg_optimizer.{old}": f"agg_optimizer.{new}"
    for old, new in {
        "documents": "model.documents",
        "arrays": "model.arrays",
        "topology": "model.topology",
        "examples": "model.examples",
        "network": "model.network",
        "validation": "model.validation",
        "pools": "model.pools",
        "shortest_paths": "model.shortest_paths",
        "context": "placement.context",
        "forest": "placement.forest",
        "forest_placement": "placement.forest_placement",
        "flow_lp": "placement.flow_lp",
        "agg": "placement.agg",
        "baselines": "placement.baselines",
        "bottleneck": "placement.bottleneck",
        "exact": "placement.exact",
        "optimum": "placement.optimum",
        "polish": "placement.polish",
        "shared": "placement.shared",
        "engine": "placement.engine",
        "peers_dynamics": "peers.dynamics",
        "closedloop": "demo.closedloop",
        "sim.live": "demo.live",
        "sim.onos_rest": "demo.onos_rest",
        "sim.scenario": "evaluation.scenario",
        "sim.evaluate": "evaluation.evaluate",
        "sim.validity": "evaluation.validity",
    }.items()
}


class MovedModuleWarning(DeprecationWarning):
    """A module was imported by the name it had before the layered layout."""


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves an old module name with the module itself (one object under both names), so
    a user's `from agg_optimizer.engine import solve` and a monkeypatch on either name see
    the same module."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} is now {new}; the old name will go", MovedModuleWarning, stacklevel=2
        )
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the import system stamped the old name's spec on the module: give it back its own
        for old, new in MOVED.items():
            if new == module.__name__ and old in self._specs:
                module.__spec__ = self._specs.pop(old)


if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
    sys.meta_path.append(_MovedFinder())
