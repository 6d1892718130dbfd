"""The engine's speed-ups (issue 33) changed no placement: the small and medium cases of
`optimizer-service/benchmarks/placement_digest.py` give the objective, decision and document
recorded in tests/fixtures/placement_digest.json before the engine was changed (at 79b2d17).
The large cases (up to k=64 with 10,000 jobs) are checked by the script itself."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _digest():  # the script itself, as its --check runs it
    path = REPO / "optimizer-service" / "benchmarks" / "placement_digest.py"
    spec = importlib.util.spec_from_file_location("placement_digest", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


DIGEST = _digest()
RECORDED = json.loads(DIGEST.FIXTURE.read_text())


@pytest.mark.parametrize("name", [n for n, c in DIGEST.CASES.items() if c[0] != "large"])
def test_placements_are_the_ones_recorded_before_the_speed_ups(name: str) -> None:
    assert DIGEST.compare(name, RECORDED[name], DIGEST.run_case(name)) == []


def test_every_case_has_a_record() -> None:
    assert set(RECORDED) == set(DIGEST.CASES)
