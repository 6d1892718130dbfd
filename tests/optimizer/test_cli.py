"""The CLI's happy paths through a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys

from agg_optimizer.model.documents import Instance, Placement
from agg_optimizer.placement.engine import STRATEGIES


def _cli(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", "from agg_optimizer.cli import main; main()", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_example_solve_compare_schema(tmp_path):
    inst = tmp_path / "i.json"
    r = _cli("example", "--fat-tree", "4", "--jobs", "3", "--seed", "5", "-o", str(inst))
    assert r.returncode == 0, r.stderr
    Instance.model_validate_json(inst.read_text())
    out = tmp_path / "p.json"
    r = _cli("solve", str(inst), "--strategy", "soar", "-o", str(out))
    assert r.returncode == 0, r.stderr
    p = Placement.model_validate_json(out.read_text())
    assert p.strategy == "soar" and len(p.jobs) == 3
    r = _cli("compare", str(inst))
    assert r.returncode == 0, r.stderr
    assert all(name in r.stdout for name in STRATEGIES)
    for doc, key in (("instance", "topology"), ("placement", "jobs")):
        r = _cli("schema", doc)
        assert key in json.loads(r.stdout)["properties"]
