"""`p4/host-agent/benchmarks/order_bmv2.py` writes the classes the service would push for
each arm. Its measurement is not a test: the port's line is a CPU-capped switch thread,
and the order's effect did not reproduce from run to run (docs/scheduling.md, "On bmv2").
Here only the classes are checked: they need no switch."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "p4" / "host-agent" / "benchmarks"))

import order_bmv2 as ob


def test_classes_are_the_services() -> None:
    assert ob.classes_for("one-class") == {"A": 7, "B": 7}
    assert ob.classes_for("A-first") == {"A": 7, "B": 6}
    assert ob.classes_for("B-first") == {"A": 6, "B": 7}
