"""Issue 18 on bmv2, end to end: real worker and parameter-server processes in network
namespaces, two jobs of two workers into one port rate-limited to 1000 packets/s
(`p4/host-agent/benchmarks/cc_bmv2.py`, one short run per scheme). With the explicit rule
the queue the acknowledgements echo stays short while goodput stays near what a fixed
window that never lets the queue drain gets, and heartbeats through the same queue lose
nothing; a fixed window of 10 holds a queue four times as long.

Needs root and simple_switch; skipped with the reason otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

import pytest

from agg_agent import p4names as n

from . import bmv2

REASON = bmv2.skip_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=str(REASON))

ROOT = Path(__file__).resolve().parents[2]


def harness():  # the benchmark's module, loaded from its file
    path = ROOT / "p4/host-agent/benchmarks/cc_bmv2.py"
    spec = importlib.util.spec_from_file_location("cc_bmv2", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["cc_bmv2"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_explicit_feedback_keeps_the_queue_short_and_the_link_busy() -> None:
    cc = harness()
    rate = 1000
    common = {
        "rate": rate, "depth": 100, "bdp": 2.0, "target": 1.0, "size": 1024,
        "iterations": 12, "duration": 4.0, "probe_ms": 5.0,
    }  # fmt: skip
    got = {}
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.py"
        probe.write_text(cc.PROBE)
        ports = [1, 2, 3, 4, cc.PS_PORT]
        with bmv2.Bmv2(ports) as sw, bmv2.Hosts(sw, ports) as h:
            cc.setup(sw, h, argparse.Namespace(**common, heartbeat_class=0))
            sw.cli(f"table_set_default {n.ECN_TABLE} {n.ECN_SET_THRESHOLD} 0")
            for scheme, window in (("explicit", 32), ("fixed", 10)):
                args = argparse.Namespace(**common, window=window)
                got[scheme] = cc.summarise(cc.run_once(h, args, scheme, probe), rate)
    ex, fx = got["explicit"], got["fixed"]
    print(f"\nexplicit: {ex}\nfixed 10: {fx}")
    assert ex["stalled"] == 0 and fx["stalled"] == 0
    assert ex["queue_p99"] <= 12, ex
    assert fx["queue_p99"] >= 4 * ex["queue_p99"], (ex, fx)
    assert ex["goodput"] >= 0.6 and ex["goodput"] >= 0.85 * fx["goodput"], (ex, fx)
    assert ex["hb_loss"] == 0 and ex["hb_p99_ms"] < fx["hb_p99_ms"], (ex, fx)
    assert ex["jain"] > 0.95, ex
