"""The CLI a user scripts (issue 16, item 4): `compare` writes every strategy's placement
from one process, `example` takes the instance's shape and load, bad input is one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from agg_optimizer.cli import STRATEGY_NAMES
from agg_optimizer.model.documents import Instance, Placement
from agg_optimizer.placement.engine import STRATEGIES, solve


def cli(*args: str, hash_seed: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed} if hash_seed else None
    return subprocess.run(
        [sys.executable, "-c", "from agg_optimizer.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def _sorted(p: dict) -> dict:
    """Placement JSON without timing."""
    p = json.loads(json.dumps(p))
    p.pop("stats", None)
    return p


def test_a_placement_is_the_same_whatever_the_hash_seed(tmp_path: Path) -> None:
    """Aggregators' children were listed in a set's order, which moved between runs."""
    inst = tmp_path / "i.json"
    assert cli("example", "--fat-tree", "6", "-o", str(inst)).returncode == 0
    docs = []
    for seed in ("1", "2", "3"):
        out = tmp_path / f"p{seed}.json"
        r = cli("solve", str(inst), "-o", str(out), hash_seed=seed)
        assert r.returncode == 0, r.stderr
        docs.append(_sorted(json.loads(out.read_text())))
    assert docs[0]["jobs"] and docs[0] == docs[1] == docs[2]


def test_the_help_names_every_strategy() -> None:
    assert list(STRATEGY_NAMES) == list(STRATEGIES)


def test_compare_writes_every_strategys_placement_as_solve_gives_it(tmp_path: Path) -> None:
    inst_path = tmp_path / "i.json"
    r = cli("example", "--jobs", "3", "--seed", "4", "-o", str(inst_path))
    assert r.returncode == 0, r.stderr
    r = cli("compare", str(inst_path), "-o", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    inst = Instance.model_validate_json(inst_path.read_text())
    for name in STRATEGIES:
        got = Placement.model_validate_json((tmp_path / "out" / f"{name}.json").read_text())
        assert got.strategy == name
        want = solve(inst, name)
        assert _sorted(got.model_dump(mode="json")) == _sorted(want.model_dump(mode="json")), name
        assert name in r.stdout


def test_example_options_shape_the_instance(tmp_path: Path) -> None:
    out = tmp_path / "ls.json"
    r = cli(
        "example", "--leaf-spine", "2,4,3", "--jobs", "3", "--cap", "2", "--pool-slots", "64",
        "--background", "0.6", "-o", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    inst = Instance.model_validate_json(out.read_text())
    switches = [n for n in inst.topology.nodes if n.kind == "switch"]
    assert len(switches) == 6 and sum(n.kind == "host" for n in inst.topology.nodes) == 12
    assert all(j.max_aggregators == 2 and j.pool_slots == 64 for j in inst.jobs)
    util = [t.utilization for t in inst.telemetry.links]
    assert util and 0.25 <= sum(util) / len(util) <= 0.95


def test_bad_options_are_one_line_naming_them(tmp_path: Path) -> None:
    for args, name in (
        (("example", "--leaf-spine", "2,x,3"), "leaf-spine"),
        (("example", "--fat-tree", "5"), "fat-tree"),
    ):
        r = cli(*args, "-o", str(tmp_path / "x.json"))
        assert r.returncode == 2, (args, r.stderr)
        lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
        named = name in lines[0] or name.replace("-", "_") in lines[0]
        assert len(lines) == 1 and named and "Traceback" not in r.stderr, r.stderr
    (tmp_path / "file").write_text("x")
    inst = tmp_path / "i.json"
    assert cli("example", "-o", str(inst)).returncode == 0
    r = cli("compare", str(inst), "-o", str(tmp_path / "file"))
    assert r.returncode == 2 and "output" in r.stderr and "Traceback" not in r.stderr


def test_click_usage_errors_take_the_same_one_line_form() -> None:
    for args, field in (
        (("example", "--jobs", "x"), "--jobs: "),
        (("solve",), "INSTANCE: missing"),
        (("example", "--bogus"), "--bogus: no such option"),
        (("nosuch",), "COMMAND: no such command"),
        (("schema", "foo"), "DOCUMENT: unknown 'foo'"),
    ):
        r = cli(*args)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1, (args, r.stderr)
        assert lines[0].startswith(f"agg-optimizer: error: {field}"), (args, lines[0])


def test_schema_scenario_describes_what_evaluate_reads() -> None:
    from agg_optimizer.evaluation.scenario import Scenario

    r = cli("schema", "scenario")
    assert r.returncode == 0, r.stderr
    schema = json.loads(r.stdout)
    assert set(schema["properties"]) == set(Scenario.model_fields)
    assert "name" in schema["required"]
    for name, prop in schema["properties"].items():  # each field documented with its type
        assert "type" in prop or "anyOf" in prop or "$ref" in prop or "enum" in prop, name


def test_evaluate_keeps_instances_that_solve_to_the_kept_placements(tmp_path: Path) -> None:
    r = cli(
        "evaluate", "--scenario", "k4", "--strategies", "agg", "--seeds", "1",
        "--processes", "1", "--keep-placements", "-o", str(tmp_path),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    where = tmp_path / "placements" / "k4" / "agg" / "seed0"
    index = json.loads((where / "index.json").read_text())
    assert len(index) >= 2  # the arrival, then re-placements every 2 iterations
    assert [e["t_s"] for e in index] == sorted(e["t_s"] for e in index)
    for e in index:
        inst = Instance.model_validate_json((where / f"{e['n']:03d}-instance.json").read_text())
        kept = Placement.model_validate_json((where / f"{e['n']:03d}-placement.json").read_text())
        assert [j.id for j in inst.jobs] == e["jobs"]
        again = solve(inst, "agg", seed=0)
        assert _sorted(again.model_dump(mode="json")) == _sorted(kept.model_dump(mode="json"))
