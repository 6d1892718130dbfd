"""Workers and the parameter server over real UDP sockets on loopback."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from agg_agent.endpoints import IterationResult, ParameterServer, Worker, WorkerStats
from agg_agent.fixedpoint import FixedPoint
from agg_agent.protocol import LANES
from agg_agent.switch_model import JobConfig, SwitchModel, UdpSwitch, Verdict

# The workers' retransmission timeout. At 20 ms this test failed once in CI (167 of 189
# chunks summed, 170 needed): ten threads of one process on 2 busy cores answer slower than
# that, and the workers retransmitted 400-3,000 times a run (about 150 at 100 ms, the
# retransmissions the 1% loss needs); which of those made chunks complete raw at the PS was
# not established (docs/protocols.md). 100 ms leaves the retransmissions to the loss.
TIMEOUT = 0.1
COMPUTE_S = 0.5  # a worker's compute between iterations, where one is modelled


def run_job(
    n: int,
    size: int,
    iterations: int,
    target_of: Callable[[int, tuple[str, int]], tuple[str, int]],
    ps_box: list[ParameterServer],
    window: int = 8,
) -> tuple[list[IterationResult], list[list[WorkerStats]], np.ndarray, FixedPoint]:
    """Run `n` workers; worker w sends to target_of(w, ps_address)."""
    fp = FixedPoint.for_bound(1.0, n)
    workers = [Worker(7, w, fp, ("127.0.0.1", 9), window, timeout=TIMEOUT) for w in range(n)]
    ps = ps_box[0] = ParameterServer(7, fp, size, [w.address for w in workers])
    for w, wk in enumerate(workers):
        wk.target = target_of(w, ps.address)
    rng = np.random.default_rng(3)
    tensors = rng.uniform(-1, 1, (iterations, n, size))
    out: list[IterationResult] = []
    stats: list[list[WorkerStats]] = [[] for _ in range(n)]
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            out.extend(ps.run(iterations, linger=0.3, deadline=30))
        except BaseException as e:
            errors.append(e)

    def work(w: int) -> None:
        try:
            for it in range(iterations):
                stats[w].append(workers[w].run_iteration(tensors[it, w]))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=serve)] + [
        threading.Thread(target=work, args=(w,)) for w in range(n)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for wk in workers:
        wk.close()
    ps.close()
    assert not errors, errors
    return out, stats, tensors.sum(axis=1), fp


def check_sums(
    out: list[IterationResult],
    expect: np.ndarray,
    fp: FixedPoint,
    stats: list[list[WorkerStats]] | None = None,
) -> None:
    """The PS's sums are the true ones within the fixed-point bound, and every worker got
    back exactly (bit for bit) the PS's sum of every iteration."""
    assert [r.iteration for r in out] == list(range(len(expect)))
    for r, e in zip(out, expect, strict=True):
        assert r.total.shape == e.shape
        assert np.max(np.abs(r.total - e)) <= fp.error_bound
        assert r.seconds > 0
    for per_worker in stats or []:
        assert len(per_worker) == len(out)
        for st, r in zip(per_worker, out, strict=True):
            assert st.total is not None and np.array_equal(st.total, r.total)


def test_no_switch_the_ps_completes_from_raw_packets() -> None:
    box: list[ParameterServer] = [None]  # type: ignore[list-item]
    out, stats, expect, fp = run_job(3, 100, 2, lambda w, ps: ps, box)
    check_sums(out, expect, fp, stats)
    assert all(r.aggregated_packets == 0 and r.raw_packets == 3 * 4 for r in out)
    assert all(s.retransmissions == 0 and s.packets == 4 for ws in stats for s in ws)
    # wall-clock bounds (steady-state goodput across processes, cc_bmv2.py): each iteration
    # spans its own time, and the next starts after it ends
    for ws in stats:
        for a, b in itertools.pairwise(ws):
            assert a.started <= a.finished <= b.started <= b.finished
        for s in ws:
            assert abs((s.finished - s.started) - s.seconds) < 0.05, s


def test_eight_workers_through_the_switch_model_under_one_percent_loss() -> None:
    box: list[ParameterServer] = [None]  # type: ignore[list-item]
    holder: dict[str, UdpSwitch] = {}
    model = SwitchModel({7: JobConfig(pool_base=100, pool_size=8, fan_in=8)})

    def target(w: int, ps: tuple[str, int]) -> tuple[str, int]:
        if "sw" not in holder:
            holder["sw"] = UdpSwitch(model, ps, loss=0.01, seed=5).__enter__()
        return holder["sw"].address

    try:
        out, stats, expect, fp = run_job(8, 2000, 3, target, box)
    finally:
        holder["sw"].__exit__(None, None, None)
    check_sums(out, expect, fp, stats)
    chunks = 63
    assert sum(r.aggregated_packets for r in out) >= 3 * chunks * 0.9  # mostly aggregates
    assert sum(s.retransmissions for ws in stats for s in ws) > 0  # loss was recovered


def test_mixed_tree_aggregates_from_one_switch_raw_from_unconfigured_one() -> None:
    # Workers 0-2 behind an aggregator (fan-in 3); workers 3-4 behind a switch without the
    # job: the PS completes every chunk from one aggregate plus two raw packets.
    box: list[ParameterServer] = [None]  # type: ignore[list-item]
    sws: dict[str, UdpSwitch] = {}

    def target(w: int, ps: tuple[str, int]) -> tuple[str, int]:
        if not sws:
            sws["agg"] = UdpSwitch(SwitchModel({7: JobConfig(0, 8, 3)}), ps).__enter__()
            sws["plain"] = UdpSwitch(SwitchModel({}), ps).__enter__()
        return sws["agg" if w < 3 else "plain"].address

    try:
        out, stats, expect, fp = run_job(5, 320, 2, target, box)
    finally:
        for s in sws.values():
            s.__exit__(None, None, None)
    check_sums(out, expect, fp, stats)
    for r in out:
        assert (r.aggregated_packets, r.raw_packets) == (10, 20)


def test_bad_endpoint_parameters_name_the_field() -> None:
    fp = FixedPoint.for_bound(1.0, 2)
    with pytest.raises(ValueError, match="worker_id"):
        Worker(1, 2, fp, ("127.0.0.1", 9))
    with pytest.raises(ValueError, match="workers: 1 addresses"):
        ParameterServer(1, fp, 10, [("127.0.0.1", 9)])


class AckRelay:
    """Between the PS and worker 0: passes acknowledgements on, except that it loses the
    one for `lose_seq` and calls `on_loss` (the job moves at that moment)."""

    def __init__(self, to: tuple[str, int], lose_seq: int, on_loss: Callable[[], None]) -> None:
        import socket

        self.to, self.lose_seq, self.on_loss, self.lost = to, lose_seq, on_loss, 0
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.address = self.sock.getsockname()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        from agg_agent.protocol import AggPacket

        while not self._stop.is_set():
            try:
                data = self.sock.recv(2048)
            except TimeoutError:
                continue
            if AggPacket.decode(data).seq == self.lose_seq and not self.lost:
                self.lost += 1
                self.on_loss()
                continue
            self.sock.sendto(data, self.to)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def test_acknowledgement_lost_while_the_job_moves_does_not_stall_it() -> None:
    """The deadlock of docs/e2e.md, on the reference model: the last chunk of an iteration
    (seq 31) completes at switch B; the PS's acknowledgement to worker 0 is lost as the job
    moves to switch A; worker 1 got its own and computes its next iteration. Worker 0's
    first retransmission claimed A's free slot, the next ones were dropped there as
    duplicates, and worker 1's chunk 39 found the slot busy and went up raw: the job
    stopped for good."""
    n, size, iterations = 2, 16 * 32, 3
    fp = FixedPoint.for_bound(1.0, n)
    workers = [
        Worker(7, w, fp, ("127.0.0.1", 9), 8, timeout=TIMEOUT, max_retries=30) for w in range(n)
    ]
    sw = {k: UdpSwitch(SwitchModel({7: JobConfig(0, 8, 2)}), ("127.0.0.1", 9)) for k in "AB"}

    def move() -> None:
        for wk in workers:
            wk.target = sw["A"].address

    relay = AckRelay(workers[0].address, 16 + 15, move)
    ps = ParameterServer(7, fp, size, [relay.address, workers[1].address])
    for s in sw.values():
        s.next_hop = ps.address
        s.__enter__()
    for wk in workers:
        wk.target = sw["B"].address
    tensors = np.random.default_rng(4).uniform(-1, 1, (iterations, n, size))
    out: list[IterationResult] = []
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            out.extend(ps.run(iterations, linger=0.3, deadline=20))
        except BaseException as e:
            errors.append(e)

    got: list[list[WorkerStats]] = [[] for _ in range(n)]

    def work(w: int) -> None:
        try:
            for it in range(iterations):
                time.sleep(COMPUTE_S)
                got[w].append(workers[w].run_iteration(tensors[it, w]))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=serve)]
    threads += [threading.Thread(target=work, args=(w,)) for w in range(n)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        relay.close()
        for s in sw.values():
            s.__exit__(None, None, None)
        for wk in workers:
            wk.close()
        ps.close()
    assert relay.lost == 1  # the loss and the move happened
    assert not errors, errors
    check_sums(out, tensors.sum(axis=1), fp, got)  # the re-acknowledged sum too
    assert sw["A"].counts[Verdict.EMIT] > 0  # the job aggregates at A after the move


def test_a_chunk_of_the_previous_iteration_is_acknowledged_again_with_its_sum() -> None:
    """A worker whose acknowledgement of the last chunk of iteration 0 was lost sends it
    again while iteration 1 is under way: the PS answers with iteration 0's sum of that
    chunk, never zeros and never iteration 1's; an older chunk gets no answer."""
    import socket

    from agg_agent.protocol import LANES, AggPacket

    fp = FixedPoint.for_bound(1.0, 2)
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
    for sk in socks:
        sk.bind(("127.0.0.1", 0))
        sk.settimeout(5)
    ps = ParameterServer(7, fp, LANES, [sk.getsockname() for sk in socks])
    t = threading.Thread(target=lambda: ps.run(3, linger=0.5, deadline=10))
    t.start()

    def send(w: int, seq: int, v: int, flags: int = 0) -> None:
        pkt = AggPacket(7, seq % 8, w, 2, seq, 1 << w, flags, (v,) * LANES, run=ps.run_id)
        socks[w].sendto(pkt.encode(), ps.address)

    try:
        for w in range(2):
            send(w, 0, 10 + w)  # iteration 0: sum 21 in every lane
        assert {AggPacket.decode(sk.recv(2048)).values for sk in socks} == {(21,) * LANES}
        for w in range(2):
            send(w, 1, 100 + w)  # iteration 1: sum 201
        assert {AggPacket.decode(sk.recv(2048)).values for sk in socks} == {(201,) * LANES}
        send(0, 1, 100, flags=0x02)  # iteration 1's chunk again (iteration 2 not started)
        again = AggPacket.decode(socks[0].recv(2048))
        assert (again.seq, again.values, again.contributors) == (1, (201,) * LANES, 0b11)
        send(0, 2, 1000)  # iteration 2 half way: the previous one's chunk is still answered
        send(0, 1, 100, flags=0x02)
        again = AggPacket.decode(socks[0].recv(2048))
        assert (again.seq, again.values) == (1, (201,) * LANES)
        send(0, 0, 10, flags=0x02)  # two iterations back: stale, no answer
        socks[0].settimeout(0.5)
        with pytest.raises(TimeoutError):
            socks[0].recv(2048)
    finally:
        ps.stop()
        t.join(5)
        ps.close()
        for sk in socks:
            sk.close()


def test_a_job_restarted_on_its_number_gets_exact_sums_whatever_its_killed_run_left() -> None:
    """Run A of job 7 dies half way through an iteration: worker 0 had sent all 8 chunks
    (value 1000 in every lane), which the switch holds as partial sums. Run B (a new PS on
    the same address, new workers, seq from 0 again) must get exactly its own sums: before
    runs existed, B's chunks completed with A's 1000 added (docs/protocols.md, "Runs")."""
    fp = FixedPoint.for_bound(1.0, 2)
    size = 8 * LANES
    a = [Worker(7, w, fp, ("127.0.0.1", 9), 8, timeout=TIMEOUT) for w in range(2)]
    ps_a = ParameterServer(7, fp, size, [w.address for w in a])
    at = ps_a.address
    model = SwitchModel({7: JobConfig(pool_base=0, pool_size=8, fan_in=2)})
    with UdpSwitch(model, at) as sw:
        a[0].target = sw.address
        served = threading.Thread(target=lambda: ps_a.run(None, deadline=60))
        served.start()
        a[0].join()
        for seq in range(8):
            a[0].sock.sendto(a[0]._packet(seq, np.full(LANES, 1000, np.int32), 0), sw.address)
        deadline = time.monotonic() + 60
        while sw.counts[Verdict.ABSORBED] < 8:
            assert time.monotonic() < deadline, sw.counts
            time.sleep(0.01)
        ps_a.stop()
        served.join(10)
        ps_a.close()
        for w in a:
            w.close()
        assert all(model.slots[s].count == 1 for s in range(8))  # A's partial sums

        b = [Worker(7, w, fp, sw.address, 8, timeout=TIMEOUT) for w in range(2)]
        ps_b = ParameterServer(7, fp, size, [w.address for w in b], bind=at)
        assert ps_b.run_id != a[0].run_id
        tensors = np.random.default_rng(5).uniform(-1, 1, (2, 2, size))
        out: list[IterationResult] = []
        stats: list[list[WorkerStats]] = [[], []]
        threads = [threading.Thread(target=lambda: out.extend(ps_b.run(2, deadline=60)))] + [
            threading.Thread(
                target=lambda w=w: stats[w].extend(b[w].run_iteration(t) for t in tensors[:, w])
            )
            for w in range(2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        ps_b.close()
        for w in b:
            w.close()
    assert len(out) == 2 and all(len(s) == 2 for s in stats), (out, stats)
    check_sums(out, tensors.sum(axis=1), fp, stats)
    assert sum(r.aggregated_packets for r in out) >= 8  # B's chunks were summed in the switch


def test_a_worker_whose_parameter_server_restarted_is_told_and_fails_clearly() -> None:
    """The PS answers a packet of a run it is not in with its own run, so the worker of the
    old run raises at once, naming the PS, instead of retransmitting until its retries run
    out; the new PS adds nothing of the old run's."""
    fp = FixedPoint.for_bound(1.0, 1)
    w = Worker(3, 0, fp, ("127.0.0.1", 9), 4, timeout=TIMEOUT, max_retries=20)
    old = ParameterServer(3, fp, LANES, [w.address])
    w.target = old.address
    served = threading.Thread(target=lambda: old.run(1, deadline=30))
    served.start()
    w.run_iteration(np.full(LANES, 0.5))
    served.join(10)
    at = old.address
    old.close()
    new = ParameterServer(3, fp, LANES, [w.address], bind=at)
    served = threading.Thread(target=lambda: new.run(None, deadline=30))
    served.start()
    try:
        with pytest.raises(ConnectionResetError, match=rf"in run {new.run_id}, not this"):
            w.run_iteration(np.full(LANES, 0.25))
        assert new.other_runs >= 1
    finally:
        new.stop()
        served.join(10)
        new.close()
        w.close()


def test_a_worker_with_no_parameter_server_says_which_one_it_waited_for() -> None:
    fp = FixedPoint.for_bound(1.0, 1)
    w = Worker(3, 0, fp, ("127.0.0.1", 9), 4, timeout=0.01, max_retries=3)
    try:
        with pytest.raises(TimeoutError, match=r"no parameter server at 127.0.0.1:9 answered 4"):
            w.join()
    finally:
        w.close()
