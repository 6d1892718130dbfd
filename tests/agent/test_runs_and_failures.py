"""Sequence numbers that wrap, failures named within a deadline, and a job started again
against a running parameter server: real UDP, the switch model between (docs/protocols.md,
"Runs" and "Failures")."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from agg_agent.endpoints import ParameterServer, Worker
from agg_agent.fixedpoint import FixedPoint
from agg_agent.protocol import LANES
from agg_agent.switch_model import JobConfig, SwitchModel, UdpSwitch

NEAR_WRAP = 2**32 - 20


def together(fns: list[Callable[[], Any]]) -> list[Any]:
    out: list[Any] = [None] * len(fns)

    def run(i: int) -> None:
        try:
            out[i] = fns[i]()
        except BaseException as e:  # returned, asserted by the caller
            out[i] = e

    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    return out


def test_a_job_runs_across_the_sequence_number_wrap() -> None:
    """Chunks 2^32 - 20 onwards: 8-chunk iterations cross seq 2^32 - 1 -> 0 under loss,
    in slots that stay consecutive (index mod window), summed exactly in the switch model
    and by the PS, which reads each seq as the chunk nearest the one it expects."""
    n, size = 2, 8 * LANES
    fp = FixedPoint.for_bound(1.0, n)
    ps = ParameterServer(7, fp, size, [("127.0.0.1", 9)] * n, first_seq=NEAR_WRAP)
    model = SwitchModel({7: JobConfig(pool_base=0, pool_size=5, fan_in=n)})
    rng = np.random.default_rng(1)
    with UdpSwitch(model, ps.address, loss=0.02, seed=3) as sw:
        workers = [
            Worker(7, w, fp, sw.address, 5, timeout=0.02, first_seq=NEAR_WRAP) for w in range(n)
        ]
        ps.workers = [w.address for w in workers]
        t = threading.Thread(target=lambda: ps.run(6, linger=0.5, deadline=60))
        t.start()
        try:
            for _ in range(6):
                xs = [rng.uniform(-1, 1, size) for _ in range(n)]
                got = together(
                    [lambda w=w, x=x: w.allreduce(x) for w, x in zip(workers, xs, strict=True)]
                )
                for g in got:
                    assert not isinstance(g, BaseException), g
                    assert np.max(np.abs(g - sum(xs))) <= fp.error_bound
        finally:
            t.join(30)
            for w in workers:
                w.close()
            ps.close()
    assert workers[0].next_seq < NEAR_WRAP  # it wrapped
    assert model.slots[0].run != 0  # the switch summed


def _serving(n: int) -> tuple[ParameterServer, threading.Thread]:
    ps = ParameterServer(4, FixedPoint(1.0, n), None, [("127.0.0.1", 9)] * n)
    t = threading.Thread(target=ps.serve, daemon=True)
    t.start()
    return ps, t


def test_a_rank_that_stops_fails_the_others_within_the_deadline_naming_it() -> None:
    ps, t = _serving(3)
    ws = [Worker(4, w, FixedPoint(1.0, 3), ps.address, 4, timeout=0.05, deadline_s=2.0)
          for w in range(3)]  # fmt: skip
    ps.workers = [w.address for w in ws]
    try:
        for w in ws:
            w.join()
        q = np.ones(3 * LANES, np.int32)
        start = time.monotonic()
        got = together([lambda: ws[0].exchange(q), lambda: ws[1].exchange(q)])  # rank 2 never
        took = time.monotonic() - start
        for g in got:
            assert isinstance(g, TimeoutError), g
            assert "rank(s) 2 sent nothing" in str(g) and "holds ranks 0, 1" in str(g), g
        assert took < 10, took
    finally:
        ps.stop()
        t.join(5)
        ps.close()
        for w in ws:
            w.close()


def test_a_parameter_server_that_stops_is_named_within_the_deadline() -> None:
    ps, t = _serving(1)
    w = Worker(4, 0, FixedPoint(1.0, 1), ps.address, 4, timeout=0.05, deadline_s=2.0)
    ps.workers = [w.address]
    try:
        w.exchange(np.ones(LANES, np.int32))
        ps.stop()
        t.join(5)
        start = time.monotonic()
        with pytest.raises(TimeoutError, match=r"no answer from the parameter server at 127"):
            w.exchange(np.ones(LANES, np.int32))
        assert time.monotonic() - start < 10
    finally:
        ps.close()
        w.close()
    never = Worker(4, 0, FixedPoint(1.0, 1), ("127.0.0.1", 9), 4, timeout=0.05, deadline_s=1.0)
    try:
        with pytest.raises(TimeoutError, match=r"no parameter server at 127.0.0.1:9 answered"):
            never.join()
    finally:
        never.close()


def test_a_job_started_again_against_a_running_ps_gets_a_new_run_and_its_own_sums() -> None:
    """The training script is run again while its PS is still up: its ranks join with new
    nonces, the PS starts a new run, and seq 0 is summed afresh, never answered with the
    old run's sum (before, one completed iteration was returned to the new job); the old
    run's ranks are told the PS moved on."""
    ps, t = _serving(2)
    fp = FixedPoint(1.0, 2)
    try:
        old = [Worker(4, w, fp, ps.address, 4, timeout=0.05, deadline_s=5) for w in range(2)]
        ps.workers = [w.address for w in old]
        got = together([lambda w=w: w.exchange(np.full(LANES, 100, np.int32)) for w in old])
        assert all(np.array_equal(g[1], np.full(LANES, 200)) for g in got)
        run = ps.run_id
        new = [Worker(4, w, fp, ps.address, 4, timeout=0.05, deadline_s=5) for w in range(2)]
        ps.workers = [w.address for w in new]
        got = together([lambda w=w: w.exchange(np.full(LANES, 1 + w.worker_id, np.int32))
                        for w in new])  # fmt: skip
        for g in got:
            assert not isinstance(g, BaseException), g
            assert np.array_equal(g[1], np.full(LANES, 3)), g[1]
        assert ps.run_id != run and ps.runs == 2
        ps.workers = [w.address for w in old]
        with pytest.raises(ConnectionResetError, match="restarted"):
            old[0].exchange(np.ones(LANES, np.int32))
    finally:
        ps.stop()
        t.join(5)
        ps.close()
        for w in (*old, *new):
            w.close()
