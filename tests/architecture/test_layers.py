"""The packages' layers (`[tool.importlinter]` in pyproject.toml, docs/architecture.md) and
no import cycle anywhere: the structure a newcomer reads is the one the code has."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import grimp
import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "agg_optimizer": ROOT / "optimizer-service/src/agg_optimizer",
    "int_collector": ROOT / "int-collector/src/int_collector",
    "agg_agent": ROOT / "p4/host-agent/src/agg_agent",
}
LINT = Path(sys.executable).with_name("lint-imports")


def lint(cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "NO_COLOR": "1"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(
        [str(LINT), "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def cycles(package: str) -> list[list[str]]:
    """The import cycles among `package`'s modules, TYPE_CHECKING imports counted (a cycle
    a reader meets is one even where Python never runs it)."""
    graph = grimp.build_graph(package, exclude_type_checking_imports=False, cache_dir=None)
    g = nx.DiGraph()
    for m in graph.modules:
        for dep in graph.find_modules_directly_imported_by(m):
            g.add_edge(m, dep)
    return [c for c in nx.simple_cycles(g) if len(c) > 1]


def test_the_layer_contracts_are_kept() -> None:
    r = lint(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout
    # every package's contracts ran, not an empty configuration
    assert r.stdout.count(" KEPT") == 5, r.stdout


def test_an_import_against_the_layers_breaks_the_contract(tmp_path: Path) -> None:
    # the same packages and configuration, with the model importing the engine above it
    src = tmp_path / "src"
    for name, path in PACKAGES.items():
        shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    doc = src / "agg_optimizer/model/documents.py"
    doc.write_text(doc.read_text() + "\nfrom agg_optimizer.placement import engine  # noqa\n")
    r = lint(tmp_path, pythonpath=src)
    assert r.returncode != 0, r.stdout
    assert "agg_optimizer: each layer imports only the layers below it BROKEN" in r.stdout
    assert "agg_optimizer.model.documents -> agg_optimizer.placement.engine" in r.stdout


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_package_has_an_import_cycle(package: str) -> None:
    assert cycles(package) == []


def test_the_cycle_finder_finds_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "cyclic_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyclic_pkg import b\n")
    (pkg / "b.py").write_text(
        textwrap.dedent("""
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from cyclic_pkg import a
        """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert [sorted(c) for c in cycles("cyclic_pkg")] == [["cyclic_pkg.a", "cyclic_pkg.b"]]


def test_old_module_names_still_import_as_the_same_module() -> None:
    # users' scripts written against the flat layout keep working, told where it went
    r = subprocess.run(
        [sys.executable, "-W", "always::DeprecationWarning", "-c", textwrap.dedent("""
            import agg_optimizer.placement.engine as new
            from agg_optimizer.engine import solve
            import agg_optimizer.engine as old
            import agg_optimizer.sim.live as live
            assert old is new and solve is new.solve
            assert new.__spec__.name == "agg_optimizer.placement.engine", new.__spec__
            assert live.__name__ == "agg_optimizer.demo.live"
            print("ok")
        """)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    assert "agg_optimizer.engine is now agg_optimizer.placement.engine" in r.stderr
    assert "agg_optimizer.sim.live is now agg_optimizer.demo.live" in r.stderr


def test_no_module_of_the_optimizer_is_longer_than_600_lines() -> None:
    # a module a newcomer reads in one sitting (issue 51); split by concern past this
    long = {
        str(p.relative_to(ROOT)): n
        for p in PACKAGES["agg_optimizer"].rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 600
    }
    assert long == {}
