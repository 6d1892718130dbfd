"""The congestion benchmark's bookkeeping (`p4/host-agent/benchmarks/cc_bmv2.py`), on
hand-checked inputs: the steady-state goodput window and the scheme settings `--schemes`
names. Pure functions; no switch needed."""

from __future__ import annotations

import argparse

import pytest

from .test_bmv2_cc_run import harness

cc = harness()


def row(started: float, finished: float, packets: int = 32, retrans: int = 0) -> dict:
    return {"started": started, "finished": finished, "packets": packets,
            "retransmissions": retrans}  # fmt: skip


def test_steady_rate_counts_only_the_time_every_worker_sends() -> None:
    # A sends over [0, 2], B over [0.5, 2.5]: the window is [0.5, 2]. A's first iteration
    # is half inside (16 chunks), its second whole (35 sent, 3 of them resent: 32); B's
    # first whole (32), its second half inside (16): 96 chunks in 1.5 s.
    a = {"job": 1, "rows": [row(0.0, 1.0), row(1.0, 2.0, 35, 3)]}
    b = {"job": 1, "rows": [row(0.5, 1.5), row(1.5, 2.5)]}
    rate, seconds = cc.steady_rate([a, b])
    assert seconds == pytest.approx(1.5)
    assert rate == pytest.approx(96 / 1.5)


def test_steady_rate_is_zero_without_a_common_window() -> None:
    a = {"job": 1, "rows": [row(0.0, 1.0)]}
    b = {"job": 2, "rows": [row(2.0, 3.0)]}  # never sending together
    assert cc.steady_rate([a, b]) == (0.0, 0.0)
    stalled = {"job": 2, "rows": []}  # a worker that finished nothing
    assert cc.steady_rate([a, stalled]) == (0.0, 0.0)
    old = {"job": 1, "rows": [{"packets": 32, "retransmissions": 0, "seconds": 1.0}]}
    assert cc.steady_rate([old, old]) == (0.0, 0.0)  # rows from before the wall clock


def test_schemes_name_their_setting() -> None:
    args = argparse.Namespace(window=32, ecn_k=8, step=1.0)
    assert cc.Scheme.parse("fixed:6", args) == cc.Scheme("fixed", 6, 0, 1.0)
    assert cc.Scheme.parse("dctcp:2", args) == cc.Scheme("dctcp", 32, 2, 1.0)
    assert cc.Scheme.parse("dctcp", args) == cc.Scheme("dctcp", 32, 8, 1.0)
    assert cc.Scheme.parse("explicit:0.25", args) == cc.Scheme("explicit", 32, 0, 0.25)
    assert cc.Scheme.parse("explicit:0.25:1", args) == cc.Scheme("explicit", 32, 0, 0.25, 1.0)
    assert cc.Scheme.parse("aimd", args) == cc.Scheme("aimd", 32, 0, 1.0)
    for bad, says in (
        ("aimd:3", "'aimd:3'"),
        ("fixed:x", "'fixed:x'"),
        ("explicit:1:0", "'explicit:1:0'"),
        ("vegas", "'vegas'"),
    ):
        with pytest.raises(SystemExit, match=says):
            cc.Scheme.parse(bad, args)
