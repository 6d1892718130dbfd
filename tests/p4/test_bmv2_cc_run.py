"""Issue 18 on bmv2, end to end: real worker and parameter-server processes in network
namespaces, two jobs of two workers into one port rate-limited to 1000 packets/s
(`p4/host-agent/benchmarks/cc_bmv2.py`, one short run per scheme). With the explicit rule
the queue the acknowledgements echo stays under 12 packets while goodput, while all four
workers send, stays above 0.8 of the bottleneck, and heartbeats through the same queue lose
nothing; a fixed window of 10 holds a longer queue.

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
        "iterations": 20, "probe_ms": 5.0, "background": 0.0, "step": 1.0, "control_rt": 0,
    }  # fmt: skip
    got = {}
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.py"
        probe.write_text(cc.PROBE)
        ports = [1, 2, 3, 4, cc.PS_PORT]
        with bmv2.Bmv2([*ports, cc.INT_PORT], nice=-10) as sw, bmv2.Hosts(sw, ports) as h:
            cc.setup(sw, h, argparse.Namespace(**common, heartbeat_class=0))
            sw.cli(f"table_set_default {n.ECN_TABLE} {n.ECN_SET_THRESHOLD} 0")
            hops = cc.HeartbeatHops(sw)
            hops.start()
            try:
                for scheme, window in (("explicit", 32), ("fixed", 10)):
                    args = argparse.Namespace(**common, window=window)
                    run = cc.run_once(h, args, scheme, probe, hops)
                    got[scheme] = cc.summarise(run, rate, rate)
                    got[scheme]["int_reports"] = len(run["hb_switch_us"])
            finally:
                hops.close()
    ex, fx = got["explicit"], got["fixed"]
    print(f"\nexplicit: {ex}\nfixed 10: {fx}")
    # Bounds from the runs so far: with bmv2 at log level off and no real-time priorities,
    # explicit W_AI 1 held queue p99 6-7 and steady goodput 0.98-0.99 in cc_shared
    # (docs/congestion.md); this test's own two runs here, heartbeats in the data's queue:
    # p99 8 and 8, goodput 0.97 and 0.99. How long the fixed window's queue gets depends on
    # how many of its 40 packets the Python senders keep outstanding, and heartbeat latency
    # on the hosts' CPU, so neither is compared as a ratio.
    assert ex["stalled"] == 0 and fx["stalled"] == 0
    assert ex["queue_p99"] <= 12, ex
    assert fx["queue_p99"] > ex["queue_p99"], (ex, fx)
    assert ex["goodput_steady_left"] >= 0.8, ex
    assert ex["hb_loss"] == 0, ex
    assert ex["jain"] > 0.95, ex
    # The switch's INT reports time the heartbeats (one per heartbeat that crossed it, most
    # of the 200 a second). A report is an ingress clone sent out its own port, so it times
    # the input buffer and ingress, not port 5's queue; the round trip shows that queue:
    # heartbeats in the data's class wait longer behind the fixed window's (p50 58-77 ms
    # against 5-6 ms here).
    assert ex["int_reports"] > 100 and fx["int_reports"] > 100, (ex, fx)
    assert fx["hb_p50_ms"] > 2 * ex["hb_p50_ms"], (ex, fx)
