"""The figures of docs/scheduling.md's "Does the order matter?" are what the command gives
at this commit: a few of its runs are simulated again and must match results.json exactly
(the simulator is deterministic per seed), and the tables in the doc are the summary the
command wrote. A change to the simulator or a policy that moves them fails here until the
command is run again and the doc updated."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "docs" / "scheduling" / "order"
DOC = REPO / "docs" / "scheduling.md"


def _bench():  # the benchmark script itself, as the doc's command runs it
    path = REPO / "optimizer-service" / "benchmarks" / "sched_order.py"
    spec = importlib.util.spec_from_file_location("sched_order", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(
    ("workload", "strategy"),
    [
        ("hp", "agg+fair"),
        ("hp", "agg+grouper"),
        ("hp", "agg+sincronia"),
        ("arrivals", "agg+fair"),
        ("arrivals", "agg+jpas"),
        ("arrivals", "agg+sincronia"),
    ],
)
def test_documented_runs_are_what_the_simulator_gives_now(workload: str, strategy: str) -> None:
    runs = json.loads((OUT / "results.json").read_text())["runs"]
    bench = _bench()
    for seed in (0, 1):
        want = runs[f"{workload}|4|{strategy}|{seed}"]
        _, _, _, _, got = bench._task((workload, 4, strategy, seed))
        assert got == pytest.approx(want, rel=1e-9), (workload, strategy, seed)


def test_the_doc_shows_the_summary_the_command_wrote() -> None:
    doc = DOC.read_text()
    table_lines = [x for x in (OUT / "summary.md").read_text().splitlines() if x.startswith("|")]
    assert table_lines
    missing = [x for x in table_lines if x not in doc]
    assert not missing, f"docs/scheduling.md lacks {len(missing)} line(s), e.g. {missing[0]}"
