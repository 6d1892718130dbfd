"""The C data path (agg_agent.native, datapath.c) against the Python endpoints, its
reference: the same buckets through every mix of C and Python workers and parameter
servers, over real UDP through the switch model with loss (retransmissions, flushed partial
sums, status acknowledgements), across the sequence-number wrap and a job started again:
the sums must be identical, integer for integer, and equal to the exact sum. With chunks
larger than the switch's 32 values, the switch forwards them untouched and the PS sums."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from agg_agent import blockfloat as bf
from agg_agent import native
from agg_agent.endpoints import ParameterServer, ServeStats, Worker
from agg_agent.fixedpoint import FixedPoint
from agg_agent.protocol import LANES
from agg_agent.switch_model import JobConfig, SwitchModel, UdpSwitch
from agg_agent.torch_hook import AggregationHook

from .test_runs_and_failures import NEAR_WRAP, together

pytestmark = pytest.mark.skipif(native.reason() is not None, reason=str(native.reason()))

W = 3
SIZES = (1, 31, 32, 33, 7 * LANES + 5, 40 * LANES)  # buckets of any size, one after another


def buckets(seed: int) -> list[list[np.ndarray]]:
    """Per bucket, every worker's int32 values, each under 2^31 / W (as the hook keeps them)."""
    rng = np.random.default_rng(seed)
    top = (2**31 - 1) // W
    return [[rng.integers(-top, top, n, dtype=np.int64).astype(np.int32) for _ in range(W)]
            for n in SIZES]  # fmt: skip


def run_job(
    worker_path: str, ps_path: str, loss: float, first_seq: int = 0, lanes: int = LANES
) -> list[np.ndarray]:
    """Every bucket through a job whose workers and PS use the given paths: worker 0's sums
    (every worker's asserted equal), and the PS's stats."""
    fp = FixedPoint(1.0, W)
    ps = ParameterServer(5, fp, None, [("127.0.0.1", 9)] * W, first_seq=first_seq,
                         datapath=ps_path, lanes=lanes)  # fmt: skip
    assert ps.datapath == ps_path
    model = SwitchModel({5: JobConfig(pool_base=0, pool_size=6, fan_in=W)})
    stats: list[ServeStats] = []
    with UdpSwitch(model, ps.address, loss=loss, seed=7) as sw:
        ws = [Worker(5, w, fp, sw.address, 6, timeout=0.02, max_retries=1 << 30,
                     deadline_s=60, first_seq=first_seq, datapath=worker_path, lanes=lanes)
              for w in range(W)]  # fmt: skip
        assert all(w.datapath == worker_path for w in ws)
        ps.workers = [w.address for w in ws]
        t = threading.Thread(target=lambda: stats.append(ps.serve()), daemon=True)
        t.start()
        out = []
        try:
            for k, qs in enumerate(buckets(11)):
                last = k == len(SIZES) - 1
                got = together([lambda w=w, q=q, e=last: w.exchange(q, end=e)[1]
                                for w, q in zip(ws, qs, strict=True)])  # fmt: skip
                for g in got:
                    assert not isinstance(g, BaseException), g
                    assert np.array_equal(g, got[0])
                exact = np.sum(np.array(qs, np.int64), axis=0)
                assert np.array_equal(got[0], exact), (worker_path, ps_path, k)
                out.append(got[0])
        finally:
            ps.stop()
            t.join(10)
            for w in ws:
                w.close()
            ps.close()
    assert stats and stats[0].steps == 1 and stats[0].chunks == sum(-(-n // lanes) for n in SIZES)
    if loss == 0 and lanes == LANES:
        assert stats[0].aggregated_packets == stats[0].chunks  # the switch summed them all
    if lanes != LANES:  # the switch forwards chunks of another size: the PS sums them
        assert stats[0].aggregated_packets == 0 and stats[0].raw_packets >= W * stats[0].chunks
    return out


@pytest.mark.parametrize(("loss", "lanes"), [(0.0, LANES), (0.03, LANES), (0.03, 8 * LANES)])
def test_c_and_python_endpoints_give_identical_sums_in_every_mix(loss: float, lanes: int) -> None:
    runs = {
        (wp, pp): run_job(wp, pp, loss, lanes=lanes)
        for wp in ("python", "native")
        for pp in ("python", "native")
    }
    ref = runs["python", "python"]
    for mix, sums in runs.items():
        assert all(np.array_equal(a, b) for a, b in zip(sums, ref, strict=True)), mix


def test_the_c_path_across_the_wrap_under_loss() -> None:
    ref = run_job("python", "python", 0.03, first_seq=NEAR_WRAP)
    got = run_job("native", "native", 0.03, first_seq=NEAR_WRAP)
    assert all(np.array_equal(a, b) for a, b in zip(got, ref, strict=True))


@pytest.mark.parametrize("path", ["python", "native"])
def test_a_server_of_another_chunk_size_drops_and_counts_the_packets(
    path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Workers sending 64 values a packet to a PS of 32: nothing is summed wrongly, the
    exchange fails naming the PS, and the PS counts and names the mismatch once."""
    fp = FixedPoint(1.0, 1)
    ps = ParameterServer(5, fp, None, [("127.0.0.1", 9)], datapath=path)
    t = threading.Thread(target=ps.serve, daemon=True)
    w = Worker(5, 0, fp, ps.address, 4, timeout=0.02, deadline_s=1.0, datapath=path, lanes=64)
    try:
        ps.workers = [w.address]
        t.start()
        with caplog.at_level("WARNING"), pytest.raises(TimeoutError, match="parameter server"):
            w.exchange(np.arange(200, dtype=np.int32))
        assert ps.other_sizes >= 4
        assert sum("another number of values" in r.message or "sends 64 values" in r.message
                   for r in caplog.records) == 1  # fmt: skip
    finally:
        ps.stop()
        t.join(10)
        ps.close()
        w.close()


def test_a_chunk_size_outside_the_wire_format_is_refused() -> None:
    fp = FixedPoint(1.0, 1)
    for bad in (0, 16, 33, 8192 + 32):
        with pytest.raises(ValueError, match="lanes"):
            Worker(5, 0, fp, ("127.0.0.1", 9), lanes=bad)
        with pytest.raises(ValueError, match="lanes"):
            ParameterServer(5, fp, None, [("127.0.0.1", 9)], lanes=bad)


def test_the_c_server_starts_a_new_run_for_a_job_started_again() -> None:
    """Worker 0 joins, then a new endpoint of rank 0 joins with another nonce: the C server
    draws a new run, and the old endpoint's next exchange is told it restarted."""
    fp = FixedPoint(1.0, 1)
    ps = ParameterServer(5, fp, None, [("127.0.0.1", 9)], datapath="native")
    t = threading.Thread(target=ps.serve, daemon=True)
    old = Worker(5, 0, fp, ps.address, 4, timeout=0.02, deadline_s=10, datapath="native")
    new = Worker(5, 0, fp, ps.address, 4, timeout=0.02, deadline_s=10, datapath="native")
    try:
        ps.workers = [old.address]
        t.start()
        first = old.join()
        assert np.array_equal(old.exchange(np.arange(40, dtype=np.int32))[1], np.arange(40))
        ps.workers = [new.address]
        second = new.join()
        assert second != first
        assert np.array_equal(new.exchange(np.ones(3, np.int32))[1], np.ones(3))
        ps.workers = [old.address]
        with pytest.raises(ConnectionResetError, match=f"is in run {second}"):
            old.exchange(np.ones(3, np.int32))
    finally:
        ps.stop()
        t.join(10)
        ps.close()
        old.close()
        new.close()


def test_the_hook_from_its_environment_names_a_bad_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from agg_agent.torch_hook import AggregationHook

    monkeypatch.delenv("AGG_JOB", raising=False)
    with pytest.raises(ValueError, match="AGG_JOB"):
        AggregationHook.from_env(0, 1)
    monkeypatch.setenv("AGG_JOB", "3")
    monkeypatch.setenv("AGG_PS", "127.0.0.1:9")
    monkeypatch.setenv("AGG_BIND", "127.0.0.1:0")
    monkeypatch.setenv("AGG_OVERLAP", "yes")
    with pytest.raises(ValueError, match="AGG_OVERLAP"):
        AggregationHook.from_env(0, 1)
    monkeypatch.setenv("AGG_OVERLAP", "0")
    monkeypatch.setenv("AGG_LANES", "48")
    with pytest.raises(ValueError, match="AGG_LANES: 48"):
        AggregationHook.from_env(0, 1)
    monkeypatch.setenv("AGG_LANES", "256")
    monkeypatch.setenv("AGG_DATAPATH", "fast")
    with pytest.raises(ValueError, match="AGG_DATAPATH"):
        AggregationHook.from_env(0, 1)
    for path in ("python", "native"):
        monkeypatch.setenv("AGG_DATAPATH", path)
        hook = AggregationHook.from_env(0, 1)
        try:
            assert hook.worker.datapath == path and not hook.overlap
            assert hook.worker.lanes == 256
        finally:
            hook.close()


def float_buckets(seed: int) -> list[list[np.ndarray]]:
    """Per bucket, every rank's float32 gradient: sizes around blocks and chunks, magnitudes
    far apart block by block, blocks zero on every rank, on one rank only, and -0.0."""
    rng = np.random.default_rng(seed)
    out = []
    for n in (1, 255, 257, 96 * 7 + 3, 5000, 20_011):
        ranks = []
        for r in range(W):
            x = rng.standard_normal(n) * 10.0 ** rng.integers(-30, 30, n // 256 + 1).repeat(256)[:n]
            x[: min(n, 300)] = 0.0  # the first block zero everywhere (not sent)
            if n > 1000:
                x[512:768] = -0.0 if r else 0.0
                x[1024:1280] *= r == 1  # a block only rank 1 has
            ranks.append(x.astype(np.float32))
        out.append(ranks)
    return out


def reference_mean(xs: list[np.ndarray]) -> np.ndarray:
    """blockfloat's steps on every rank's values, the integer sums, the mean as float32: what
    `AggregationHook.allreduce(x) / W` rounded to float32 gives (the readable reference)."""
    x64 = [x.astype(np.float64) for x in xs]
    n = x64[0].size
    tops, _ = bf.agreed(np.sum([bf.agreement(x) for x in x64], axis=0), n)
    sums = np.sum([bf.encode(x, tops, W).astype(np.int64) for x in x64], axis=0)
    return (bf.decode(sums, tops, n, W) / W).astype(np.float32)


@pytest.mark.parametrize(("loss", "lanes"), [(0.03, LANES), (0.0, 3 * LANES), (0.03, 8 * LANES)])
def test_the_one_pass_bucket_equals_the_reference_bit_for_bit(loss: float, lanes: int) -> None:
    """`allreduce_mean32` on the C path (conversions done as packets go and come, in place)
    and on the Python path give the reference's float32 mean, bit for bit: through the switch
    model with loss (32 values: switches sum), and with chunks that cut blocks (96)."""
    got: dict[str, list[np.ndarray]] = {}
    for path in ("python", "native"):
        fp = FixedPoint(1.0, W)
        ps = ParameterServer(5, fp, None, [("127.0.0.1", 9)] * W, datapath=path, lanes=lanes)
        model = SwitchModel({5: JobConfig(pool_base=0, pool_size=8, fan_in=W)})
        with UdpSwitch(model, ps.address, loss=loss, seed=3) as sw:
            hooks = [AggregationHook(Worker(5, r, fp, sw.address, 8, timeout=0.02,
                                            max_retries=1 << 30, deadline_s=60, datapath=path,
                                            lanes=lanes), W)
                     for r in range(W)]  # fmt: skip
            ps.workers = [h.worker.address for h in hooks]
            t = threading.Thread(target=ps.serve, daemon=True)
            t.start()
            got[path] = []
            try:
                for xs in float_buckets(5):
                    ys = [x.copy() for x in xs]
                    res = together([lambda h=h, y=y: h.allreduce_mean32(y)
                                    for h, y in zip(hooks, ys, strict=True)])  # fmt: skip
                    assert all(r is None for r in res), res
                    want = reference_mean(xs)
                    for y in ys:
                        assert np.array_equal(y.view(np.int32), want.view(np.int32)), path
                    got[path].append(ys[0])
            finally:
                ps.stop()
                t.join(10)
                for h in hooks:
                    h.close()
                ps.close()
    assert all(np.array_equal(a.view(np.int32), b.view(np.int32))
               for a, b in zip(got["python"], got["native"], strict=True))  # fmt: skip


def test_the_one_pass_bucket_refuses_what_it_cannot_carry() -> None:
    """Wrong arrays are refused naming the argument; inf and NaN take the reference's way."""
    fp = FixedPoint(1.0, 1)
    ps = ParameterServer(5, fp, None, [("127.0.0.1", 9)], datapath="native")
    hook = AggregationHook(Worker(5, 0, fp, ps.address, 8, timeout=0.02, deadline_s=20,
                                  datapath="native"), 1)  # fmt: skip
    ps.workers = [hook.worker.address]
    t = threading.Thread(target=ps.serve, daemon=True)
    t.start()
    try:
        with pytest.raises(ValueError, match="x: a contiguous"):
            hook.allreduce_mean32(np.zeros(10))
        tops = np.zeros(1, np.int64)
        with pytest.raises(ValueError, match="y: a contiguous"):
            hook.worker.exchange_blocks(np.zeros(10, np.float32), tops, np.zeros(9, np.float32))
        x = np.array([1.5, np.inf, -2.0, np.nan], np.float32)
        hook.allreduce_mean32(x)
        assert x[0] == 1.5 and x[2] == -2.0 and np.isposinf(x[1]) and np.isnan(x[3])
        assert hook.nonfinite == 1
    finally:
        ps.stop()
        t.join(10)
        hook.close()
        ps.close()
