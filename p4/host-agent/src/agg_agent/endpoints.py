"""Worker and parameter-server endpoints (state machines in docs/protocols.md).

Worker: one iteration sends its tensor as ceil(n / lanes) chunks (`lanes` values a packet,
32 where switches sum them: docs/protocols.md, "Chunk size") with consecutive sequence
numbers; chunk `seq` uses slot `seq % window`, and at most `window` chunks past the oldest
unacknowledged one are in flight, so a slot is reused only after the parameter server
completed its previous chunk (which implies every switch on the way freed it). A chunk not
acknowledged within `timeout` is sent again with the retransmission flag.

Runs: a parameter server draws a run number when it starts and every packet of the job
carries it. A worker learns it by joining (a JOIN packet, answered by the PS), before its
first iteration; switches and the PS never add a packet to a chunk of another run, so a job
restarted on its number cannot add to the partial sums its killed run left in the slots.

Parameter server: accepts a packet for a chunk when its contributor bitmap is disjoint from
what the chunk already holds, whether it is an aggregate, a raw worker packet (no switch
aggregates the job: the fallback) or a mix; a chunk is complete when every worker is in,
and is then acknowledged to every worker **with the chunk's sum** (contributors = every
worker: the values are complete); a packet for a completed chunk of the current or the
previous iteration is acknowledged again, with the same sum, to its contributors (their
acknowledgement was lost). A worker takes a chunk's sum from the first complete
acknowledgement only, so it never applies a partial or a duplicated sum:
`Worker.allreduce` returns the exact integer sum of every worker's fixed-point tensor.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from agg_agent import native
from agg_agent.congestion import Controller, FixedWindow, pacing_gap
from agg_agent.fixedpoint import FixedPoint
from agg_agent.protocol import (
    FLAG_ACK,
    FLAG_ECN_ECHO,
    FLAG_END,
    FLAG_JOIN,
    FLAG_RETRANSMIT,
    LANES,
    MAX_LANES,
    AggPacket,
    PacketError,
    check_lanes,
    packet_bytes,
)
from agg_agent.results import IterationResult, ServeStats

log = logging.getLogger(__name__)

Address = tuple[str, int]
ECT0 = 0x02  # the IP TOS byte's ECN field: ECN-capable transport (0)
SEQ_MOD = 1 << 32  # sequence numbers wrap (the switch compares them modulo 2^32 too)
DEADLINE_S = 10.0  # a chunk unacknowledged this long fails the iteration, naming who
RETAIN = 1 << 17  # chunks whose sums `ParameterServer.serve` keeps: twice the largest window
# Receive buffers: a window of chunks from every worker arrives at once at the PS (128 from
# each of 4 ranks is 512 datagrams, past Linux's default 208 KB at ~770 B of kernel memory
# a datagram); what overflows is dropped and waits a retransmission timer (seen: a 1M-
# parameter step at 4 ranks took minutes). The kernel caps it at net.core.rmem_max.
RCVBUF = 1 << 23
# Bytes of chunks in flight from all workers of a job together, at most: what the PS's
# receive buffer takes at once (a datagram costs the kernel more than its payload). At 32
# values a packet the job's slot pool is far smaller; wide chunks are bound by it: 4 ranks
# with 128 chunks of 4,096 values each overflowed the buffer, and every step waited out
# about 130 retransmission timers per rank (10M parameters: 1.2 s an all-reduce, 0.13 s
# at 64 chunks).
FLIGHT_BYTES = 1 << 22
MIN_FLIGHT = 8  # chunks: fewer would leave the path idle between acknowledgements


def flight_chunks(window: int, workers: int, lanes: int) -> int:
    """Chunks a worker keeps past its oldest unacknowledged one: the window (the slot
    pool), or fewer where the job's wide chunks would overflow the PS (`FLIGHT_BYTES`)."""
    fits = FLIGHT_BYTES // (max(1, workers) * packet_bytes(lanes))
    return min(window, max(MIN_FLIGHT, fits))


def _socket() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:  # past net.core.rmem_max where the process may (CAP_NET_ADMIN), as the collector
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUFFORCE, RCVBUF)
    except (OSError, AttributeError):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)  # capped by rmem_max
    return s


def _signed32(d: int) -> int:
    """A difference of sequence numbers modulo 2^32, as the nearest signed value."""
    d %= SEQ_MOD
    return d - SEQ_MOD if d >= SEQ_MOD // 2 else d


def _ranks(mask: int, workers: int) -> list[int]:
    return [w for w in range(workers) if mask >> w & 1]


def chunk_count(size: int, lanes: int = LANES) -> int:
    return math.ceil(size / lanes)


@dataclass(slots=True)
class WorkerStats:
    iteration: int
    seconds: float
    packets: int
    retransmissions: int
    mean_window: float = 0.0  # the congestion controller's window, averaged over sends
    max_queue_seen: int = 0  # largest queue an acknowledgement echoed
    # echoed queue (packets) -> acknowledgements that carried it
    queue_counts: dict[int, int] = field(default_factory=dict)
    # wall clock (time.time()) of the iteration's first send and last acknowledgement: runs
    # of several processes on one machine line up on it (steady-state goodput, cc_bmv2.py)
    started: float = 0.0
    finished: float = 0.0
    # the sum over every worker of the tensor sent (the acknowledgements' values), decoded
    # from fixed point; not part of the JSON the CLI prints
    total: npt.NDArray[np.float64] | None = field(default=None, repr=False)


class Worker:
    def __init__(
        self,
        job_id: int,
        worker_id: int,
        fixed: FixedPoint,
        target: Address,
        window: int = 16,
        timeout: float = 0.05,
        max_retries: int = 50,
        bind: Address = ("127.0.0.1", 0),
        controller: Controller | None = None,
        ecn: bool = False,
        deadline_s: float | None = None,
        first_seq: int = 0,
        datapath: str | None = None,
        lanes: int = LANES,
    ) -> None:
        """`window` is the job's pool of slots at every switch (chunks in flight never
        exceed it); `controller` (agg_agent.congestion) sets how many of them may be in
        flight, from the feedback acknowledgements carry; `ecn` sends ECN-capable
        packets (ECT(0)), for switches that mark (DCTCP). A chunk is sent again every
        `timeout` until acknowledged, at most `max_retries` times and for at most
        `deadline_s` seconds (None: no deadline), then the iteration fails naming what
        stopped answering: the ranks the parameter server still waits for, or the PS.
        `first_seq`: the sequence number of the first chunk (tests start near the wrap).
        `datapath`: 'native' (agg_agent.native, C), 'python' or 'auto' (None: AGG_DATAPATH,
        else auto); the C loop runs the fixed window, other controllers run in Python.
        `lanes`: values a packet (a multiple of 32); switches sum only packets of 32, so
        more is for jobs whose parameter server makes every sum (the PS must use the same)."""
        self.lanes = check_lanes(lanes)
        if not 0 <= worker_id < fixed.workers:
            raise ValueError(f"worker_id: {worker_id} outside 0..{fixed.workers - 1}")
        if not 1 <= window <= 0xFFFF:
            raise ValueError(f"window: {window} outside 1..65535")
        self.job_id, self.worker_id, self.fixed = job_id, worker_id, fixed
        self.target, self.window, self.timeout, self.max_retries = (
            target,
            window,
            timeout,
            max_retries,
        )
        self.controller = controller if controller is not None else FixedWindow(float(window))
        self.flight = flight_chunks(window, fixed.workers, self.lanes)
        self.sock = _socket()
        if ecn:
            self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, ECT0)
        self.sock.bind(bind)
        self.address: Address = self.sock.getsockname()
        self.deadline_s = deadline_s
        # Chunks are counted without bound; on the wire, seq = index mod 2^32 and slot =
        # index mod window, so consecutive chunks take consecutive slots across the wrap.
        self.next_index = first_seq
        # Drawn per endpoint, sent in the JOIN: a parameter server that sees rank N join
        # with another nonce than its run's knows the job started again, and starts a run.
        self.nonce = 1 + secrets.randbelow(SEQ_MOD - 1)
        self.iteration = 0
        self.run_id: int | None = None  # the parameter server's run, once joined
        self.srtt: float | None = None  # smoothed round trip of first transmissions (s)
        self.last_send = -math.inf  # perf_counter of the last send: pacing spans iterations
        self.datapath = (
            native.choose(datapath) if isinstance(self.controller, FixedWindow) else "python"
        )

    def close(self) -> None:
        self.sock.close()

    @property
    def next_seq(self) -> int:
        return self.next_index % SEQ_MOD

    def _packet(self, index: int, values: npt.NDArray[np.int32], flags: int) -> bytes:
        return AggPacket(
            job_id=self.job_id,
            slot=index % self.window,
            worker_id=self.worker_id,
            fan_in=self.fixed.workers,
            seq=index % SEQ_MOD,
            contributors=1 << self.worker_id,
            flags=flags,
            values=tuple(int(v) for v in values),
            run=self.run_id or 0,
        ).encode()

    def join(self) -> int:
        """Learn the parameter server's run: a JOIN every `timeout` until it answers (at most
        `max_retries` times, then a TimeoutError naming the PS). Every packet this worker
        sends afterwards carries the run. Called by the first iteration if not before."""
        hello = AggPacket(
            self.job_id, 0, self.worker_id, self.fixed.workers, self.nonce,
            1 << self.worker_id, FLAG_JOIN,
        ).encode()  # fmt: skip
        until_all = math.inf if self.deadline_s is None else time.monotonic() + self.deadline_s
        for _ in range(self.max_retries + 1):
            if time.monotonic() > until_all:
                break
            self.sock.sendto(hello, self.target)
            until = time.perf_counter() + self.timeout
            while (left := until - time.perf_counter()) > 0:
                self.sock.settimeout(left)
                try:
                    data = self.sock.recv(packet_bytes(self.lanes) + 64)
                except TimeoutError:
                    break
                try:
                    ans = AggPacket.decode(data)
                except PacketError:
                    continue
                if ans.is_join and ans.is_ack and ans.job_id == self.job_id and ans.run:
                    self.run_id = ans.run
                    return ans.run
        tried = (
            f"joins for {self.deadline_s:g} s"
            if self.deadline_s is not None
            else f"{self.max_retries + 1} joins"
        )
        raise TimeoutError(
            f"job {self.job_id}: no parameter server at {self.target[0]}:{self.target[1]} "
            f"answered {tried}, {self.timeout} s apart"
        )

    def allreduce(self, tensor: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """The sum over every worker of `tensor` (each worker calls it with its own), shaped
        like it: exact in fixed point, so every worker gets the same array."""
        arr = np.asarray(tensor, dtype=np.float64)
        total = self.run_iteration(arr).total
        assert total is not None
        return total.reshape(arr.shape)

    def run_iteration(self, tensor: npt.ArrayLike) -> WorkerStats:
        """Send `tensor` and return when every chunk is acknowledged with its sum."""
        q = self.fixed.to_fixed(np.ravel(np.asarray(tensor, dtype=np.float64)))
        stats, sums = self.exchange(q)
        stats.total = self.fixed.from_fixed(sums)
        return stats

    def exchange(
        self, q: npt.NDArray[np.int32], end: bool = False
    ) -> tuple[WorkerStats, npt.NDArray[np.int64]]:
        """Send int32 values (every worker the same number, each its own) and return the
        exact integer sums over every worker once every chunk is acknowledged. The caller
        keeps every worker's sum within int32 (`FixedPoint`). `end`: the last chunk is
        flagged as a step's last (FLAG_END: `ParameterServer.serve` reports a step then)."""
        if self.run_id is None:
            self.join()
        q = np.ravel(np.asarray(q, dtype=np.int32))
        if self.datapath == "native":
            return self._exchange_native(q, end)
        chunks, width = chunk_count(q.size, self.lanes), self.lanes
        padded = np.zeros(chunks * width, dtype=np.int32)
        padded[: q.size] = q
        lanes = padded.reshape(chunks, width)
        first = self.next_index
        acked = [False] * chunks
        born: dict[int, float] = {}  # chunk -> its first send (the deadline runs from it)
        missing: dict[int, int] = {}  # chunk -> contributors the PS said it holds
        sums = np.zeros((chunks, width), np.int64)
        everyone = (1 << self.fixed.workers) - 1
        sent_at: dict[int, float] = {}
        tries: dict[int, int] = {}
        low = nxt = 0  # oldest unacknowledged chunk, next chunk never sent
        packets = retrans = 0
        window_sum = 0.0
        queues: dict[int, int] = {}
        cc = self.controller
        wall = time.time()
        start = time.perf_counter()
        while low < chunks:
            # in flight: chunks sent and not acknowledged, within the pool's window
            limit = min(self.window, max(1, int(cc.window)))
            gap = pacing_gap(cc.window, self.srtt)
            while (
                nxt < chunks
                and nxt < low + self.flight
                and len(sent_at) < limit
                and time.perf_counter() >= self.last_send + gap
            ):
                flag = FLAG_END if end and nxt == chunks - 1 else 0
                self.sock.sendto(self._packet(first + nxt, lanes[nxt], flag), self.target)
                sent_at[nxt], tries[nxt] = time.perf_counter(), 0
                born[nxt] = sent_at[nxt]
                self.last_send = sent_at[nxt]
                packets += 1
                window_sum += cc.window
                nxt += 1
            now = time.perf_counter()
            for c in [c for c, t in sent_at.items() if now - t >= self.timeout]:
                tries[c] += 1
                late = self.deadline_s is not None and now - born[c] > self.deadline_s
                if tries[c] > self.max_retries or late:
                    raise TimeoutError(self._stuck(first + c, now - born[c], missing.get(c)))
                flag = FLAG_RETRANSMIT | (FLAG_END if end and c == chunks - 1 else 0)
                self.sock.sendto(self._packet(first + c, lanes[c], flag), self.target)
                sent_at[c] = now
                packets += 1
                retrans += 1
                cc.on_timeout()
            wait = min(sent_at.values(), default=now) + self.timeout - time.perf_counter()
            if gap and nxt < chunks and len(sent_at) < limit:  # paced: wake for the next send
                wait = min(wait, self.last_send + gap - time.perf_counter())
            self.sock.settimeout(max(wait, 1e-4))
            try:
                data = self.sock.recv(packet_bytes(width) + 64)
            except TimeoutError:
                continue
            try:
                ack = AggPacket.decode(data)
            except PacketError:
                continue
            if ack.is_join and ack.is_ack and ack.job_id == self.job_id and ack.run != self.run_id:
                # the PS answers a packet of a run it is not in: it was restarted
                raise self._restarted(ack.run)
            c = (ack.seq - first) % SEQ_MOD
            if (
                ack.is_ack and not ack.is_join and ack.job_id == self.job_id
                and ack.run == self.run_id and c < chunks and not acked[c]
                and ack.contributors != everyone
            ):  # fmt: skip
                missing[c] = ack.contributors  # the PS's status: who it holds so far
                continue
            if (
                ack.is_ack and not ack.is_join and ack.job_id == self.job_id
                and ack.run == self.run_id and c < chunks and not acked[c]
                and ack.contributors == everyone  # the values are the complete sum
                and len(ack.values) == width
            ):  # fmt: skip
                acked[c] = True
                sums[c] = ack.values
                t_sent = sent_at.pop(c, None)
                if t_sent is not None and tries[c] == 0:  # Karn: first transmissions only
                    rtt = time.perf_counter() - t_sent
                    self.srtt = rtt if self.srtt is None else 0.875 * self.srtt + 0.125 * rtt
                cc.on_ack(ack)
                queues[ack.max_queue] = queues.get(ack.max_queue, 0) + 1
                while low < chunks and acked[low]:
                    low += 1
        self.next_index = first + chunks
        stats = WorkerStats(
            self.iteration,
            time.perf_counter() - start,
            packets,
            retrans,
            window_sum / max(1, packets - retrans),
            max(queues, default=0),
            queues,
            wall,
            time.time(),
        )
        self.iteration += 1
        return stats, sums.reshape(-1)[: q.size]

    def _exchange_native(
        self, q: npt.NDArray[np.int32], end: bool
    ) -> tuple[WorkerStats, npt.NDArray[np.int64]]:
        """`exchange` through the C loop (agg_agent.native): the same packets and rules."""
        first, wall = self.next_index, time.time()
        packets, retrans, seconds, sums, out = native.exchange(self, q, end)
        stats = self._native_done(first, chunk_count(q.size, self.lanes), wall, packets,
                                  retrans, seconds, out)  # fmt: skip
        return stats, sums

    def exchange_blocks(
        self,
        x: npt.NDArray[np.float32],
        tops: npt.NDArray[np.int64],
        y: npt.NDArray[np.float32],
        end: bool = False,
    ) -> WorkerStats:
        """`exchange` of float32 `x` in block floating point agreed at `tops`, and the mean
        over the workers into float32 `y` (may be `x`), converted in C as packets go and
        come: the C data path's one-pass form of `blockfloat.encode`, `exchange`,
        `blockfloat.decode`, division and rounding to float32 (the same packets, the same
        numbers bit for bit; tests/agent/test_datapath.py)."""
        if self.datapath != "native":
            raise RuntimeError("exchange_blocks: only on the C data path")
        if self.run_id is None:
            self.join()
        first, wall = self.next_index, time.time()
        packets, retrans, seconds, chunks, out = native.exchange_blocks(self, x, tops, y, end)
        return self._native_done(first, chunks, wall, packets, retrans, seconds, out)

    def _native_done(
        self, first: int, chunks: int, wall: float, packets: int, retrans: int,
        seconds: float, out: native.WorkerOut,
    ) -> WorkerStats:  # fmt: skip
        """The C loop's outcome: its failure raised as the Python loop's, or its stats."""
        native.gso_stats()  # says so, once, if the kernel refused segmented sends
        if out.srtt >= 0:  # measured in C from first transmissions, as Python's loop does
            self.srtt = out.srtt
        if out.fail == 1:
            holds = None if out.fail_holds < 0 else int(out.fail_holds)
            raise TimeoutError(self._stuck(first + out.fail_chunk, out.fail_waited, holds))
        if out.fail == 2:
            raise self._restarted(out.reset_run)
        if out.fail:
            raise OSError(out.fail_errno, f"job {self.job_id}: {os.strerror(out.fail_errno)}")
        self.next_index = first + chunks
        queues = {k: int(v) for k, v in enumerate(out.queue_counts) if v}
        stats = WorkerStats(
            self.iteration, seconds, packets, retrans, float(self.window),
            max(queues, default=0), queues, wall, time.time(),
        )  # fmt: skip
        self.iteration += 1
        return stats

    def _restarted(self, run: int) -> ConnectionResetError:
        """The PS answered in another run than this worker's: it was restarted."""
        return ConnectionResetError(
            f"job {self.job_id}: the parameter server at {self.target[0]}:{self.target[1]} "
            f"is in run {run}, not this worker's {self.run_id} (it restarted): this "
            "iteration's sums are gone"
        )

    def _stuck(self, index: int, waited: float, holds: int | None) -> str:
        """What stopped answering, for a chunk unacknowledged for `waited` seconds."""
        where = f"the parameter server at {self.target[0]}:{self.target[1]}"
        seq = index % SEQ_MOD
        if holds is None:
            return (
                f"job {self.job_id} seq {seq}: no answer from {where} for {waited:.1f} s "
                f"({self.timeout} s between tries): it stopped, or its path did"
            )
        gone = _ranks(~holds & ((1 << self.fixed.workers) - 1), self.fixed.workers)
        return (
            f"job {self.job_id} seq {seq}: rank(s) {', '.join(map(str, gone))} sent nothing "
            f"for {waited:.1f} s ({where} holds ranks "
            f"{', '.join(map(str, _ranks(holds, self.fixed.workers)))}): they stopped"
        )


@dataclass(slots=True)
class _Chunk:
    acc: npt.NDArray[np.int64]
    bitmap: int = 0
    queue: int = 0  # the longest queue any of its packets met
    ce: bool = False  # one of its packets arrived marked CE


class ParameterServer:
    def __init__(
        self,
        job_id: int,
        fixed: FixedPoint,
        size: int | None,
        workers: list[Address],
        bind: Address = ("127.0.0.1", 0),
        run_id: int | None = None,
        first_seq: int = 0,
        datapath: str | None = None,
        lanes: int = LANES,
    ) -> None:
        """`run_id`: this server's run number (1..2^32-1); None draws one at random, so that
        a job restarted with a new PS never meets its killed run's chunks (1 in 2^32 that
        it draws the same). `size`: elements per iteration, or None: chunks of any
        number, each completed on its own (a training job's buckets of any size; the
        iterations then count chunks). `first_seq`: the job's first sequence number.
        `datapath`: for `serve`, as `Worker`'s (`run` is Python's). `lanes`: values a
        packet, as the workers'; a packet of another size is dropped and counted
        (`other_sizes`), with one warning naming both sizes."""
        self.lanes = check_lanes(lanes)
        self.other_sizes = 0
        if run_id is not None and not 0 < run_id <= 0xFFFFFFFF:
            raise ValueError(f"run_id: {run_id} outside 1..{0xFFFFFFFF}")
        if len(workers) != fixed.workers:
            raise ValueError(f"workers: {len(workers)} addresses for {fixed.workers} workers")
        if size is not None and size < 1:
            raise ValueError(f"size: {size} must be at least 1")
        if not 0 <= first_seq < SEQ_MOD:
            raise ValueError(f"first_seq: {first_seq} outside 0..{SEQ_MOD - 1}")
        self.job_id, self.fixed, self.size, self.workers = job_id, fixed, size, workers
        self.first_seq = first_seq
        # Open-ended (no size): one chunk per "iteration" for the bookkeeping below.
        self.chunks = chunk_count(size, lanes) if size is not None else 1
        self.all_mask = (1 << fixed.workers) - 1
        self.sock = _socket()
        self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
        self.sock.bind(bind)
        self.address: Address = self.sock.getsockname()
        self.run_id = run_id if run_id is not None else 1 + secrets.randbelow(0xFFFFFFFF)
        self.other_runs = 0  # packets of another run (a killed run's, late): dropped
        self.runs = 1  # runs served: a job started again against this PS starts a new one
        self._nonces: dict[int, int] = {}  # rank -> the nonce it joined this run with
        self._new_run = False
        self.datapath = native.choose(datapath)

    def close(self) -> None:
        self.sock.close()

    def _join(self, pkt: AggPacket) -> None:
        """A worker joins. A rank that joined this run before with another nonce is a new
        endpoint (the job was started again while this PS kept running): a new run begins,
        so its chunks never meet the old run's sums, and the old run's workers are told."""
        w, nonce = pkt.worker_id, pkt.seq
        if nonce and self._nonces.get(w, nonce) != nonce:
            self.run_id = 1 + (self.run_id + secrets.randbelow(0xFFFFFFFE)) % 0xFFFFFFFF
            self.runs += 1
            self._nonces = {}
            self._new_run = True
        if nonce:
            self._nonces[w] = nonce
        self._answer_join(w)

    def _status(self, seq: int, mask: int, holds: int) -> None:
        """Tell the workers in `mask` (a retransmission) which ranks the chunk holds so far:
        an acknowledgement whose contributors are not every worker carries no sum."""
        for w in range(self.fixed.workers):
            if mask >> w & 1:
                pkt = AggPacket(
                    self.job_id, seq % 0x10000, w, self.fixed.workers, seq, holds,
                    FLAG_ACK, run=self.run_id,
                )  # fmt: skip
                self.sock.sendto(pkt.encode(), self.workers[w])

    def _other_size(self, pkt: AggPacket) -> None:
        """A packet with another number of values than this server's chunks: dropped."""
        if not self.other_sizes:
            log.warning(
                "job %d: rank %d sends %d values a packet, this parameter server takes %d "
                "(set the same lanes on both); such packets are dropped",
                self.job_id, pkt.worker_id, len(pkt.values), self.lanes,
            )  # fmt: skip
        self.other_sizes += 1

    def _answer_join(self, worker: int) -> None:
        """Tell `worker` this server's run (the answer to a JOIN; to a packet of another
        run, it tells the worker that the server restarted)."""
        if 0 <= worker < self.fixed.workers:
            pkt = AggPacket(
                self.job_id, 0, worker, self.fixed.workers, 0, self.all_mask,
                FLAG_ACK | FLAG_JOIN, run=self.run_id,
            )  # fmt: skip
            self.sock.sendto(pkt.encode(), self.workers[worker])

    def _recv(self) -> tuple[bytes, bool]:
        """A datagram, and whether it arrived marked CE."""
        data, anc, _, _ = self.sock.recvmsg(packet_bytes(MAX_LANES) + 64, socket.CMSG_SPACE(1))
        ce = any(
            level == socket.IPPROTO_IP and kind == socket.IP_TOS and raw and raw[0] & 3 == 3
            for level, kind, raw in anc
        )
        return data, ce

    def _ack(
        self, seq: int, mask: int, total: npt.NDArray[np.int64], queue: int = 0, ce: bool = False
    ) -> None:
        """Acknowledge `seq` to the workers in `mask` with the chunk's complete sum
        (contributors: every worker), echoing the congestion it met."""
        flags = FLAG_ACK | (FLAG_ECN_ECHO if ce else 0)
        values = tuple(int(v) for v in total)
        for w in range(self.fixed.workers):
            if mask >> w & 1:
                pkt = AggPacket(
                    self.job_id, seq % 0x10000, w, self.fixed.workers, seq, self.all_mask,
                    flags, values, queue, self.run_id,
                )  # fmt: skip
                self.sock.sendto(pkt.encode(), self.workers[w])

    def stop(self) -> None:
        """End `run` (from another thread) after the packet at hand."""
        self._stop = True

    _stop = False

    def run(
        self,
        iterations: int | None,
        linger: float = 0.3,
        deadline: float = 60.0,
        each: Callable[[IterationResult], None] | None = None,
    ) -> list[IterationResult]:
        """Complete `iterations` iterations of `size` elements (None: until `stop()`),
        then keep acknowledging
        for `linger` seconds. `deadline`: the longest an iteration may take, from its
        predecessor's end or the start (open-ended: from its first packet). `each` is
        called with every iteration as it completes (a training job's PS reports progress
        while it runs, not when it stops)."""
        if self.size is None:
            raise ValueError("size: run() counts iterations of `size` elements; serve() has none")
        results: list[IterationResult] = []
        open_chunks: dict[int, _Chunk] = {}
        L = self.lanes
        # Chunks are counted without bound from `first_seq` (index 0); a packet's seq is
        # read as the index nearest the oldest incomplete one, modulo 2^32.
        done_upto = 0  # every index below it is complete
        done_ahead: set[int] = set()
        cur: IterationResult | None = None
        cur_start = 0.0
        totals = np.zeros(self.chunks * self.lanes, np.int64)
        # The previous iteration's sums: a worker may still wait for one of its
        # acknowledgements (lost) while the others have started the next iteration. Older
        # ones cannot be waited for: iteration k completes only after every worker has
        # every acknowledgement of k - 1.
        previous = np.zeros(self.chunks * self.lanes, np.int64)
        remaining = self.chunks
        stop_at = time.perf_counter() + deadline
        linger_until: float | None = None
        while True:
            now = time.perf_counter()
            if (linger_until is not None and now >= linger_until) or self._stop:
                return results
            if now >= stop_at and (iterations is not None or cur is not None):
                raise TimeoutError(
                    f"iteration {len(results)}: incomplete after {deadline} s "
                    f"({remaining} of {self.chunks} chunks missing)"
                )
            self.sock.settimeout(0.05)
            try:
                data, ce = self._recv()
            except TimeoutError:
                continue
            try:
                pkt = AggPacket.decode(data)
            except PacketError:
                continue
            if pkt.job_id != self.job_id or pkt.is_ack:
                continue
            if pkt.is_join:
                self._join(pkt)
                if self._new_run:  # a new run: nothing of the old one is kept
                    self._new_run = False
                    open_chunks.clear()
                    done_upto, done_ahead = 0, set()
                    cur, remaining = None, self.chunks
                    totals = np.zeros(self.chunks * self.lanes, np.int64)
                    previous = np.zeros(self.chunks * self.lanes, np.int64)
                continue
            if pkt.run != self.run_id:
                self.other_runs += 1
                self._answer_join(pkt.worker_id)
                continue
            if len(pkt.values) != L:
                self._other_size(pkt)
                continue
            seq = done_upto + _signed32(pkt.seq - self.first_seq - done_upto)
            if seq < 0:
                continue  # from before the job's first chunk
            it, c = divmod(seq, self.chunks)
            if seq < done_upto or seq in done_ahead:  # complete: acknowledged again
                if it == len(results):
                    src = totals
                elif it == len(results) - 1:
                    src = previous
                else:
                    continue  # stale: nobody can be waiting for it
                self._ack(
                    pkt.seq, pkt.contributors & self.all_mask, src[c * L : (c + 1) * L],
                    pkt.max_queue, ce,
                )  # fmt: skip
                continue
            if it != len(results) or linger_until is not None:
                continue  # a later iteration cannot start before this one completes
            if cur is None:
                cur = IterationResult(it, np.zeros(0), 0.0)
                cur_start = time.perf_counter()
                if iterations is None:  # open-ended: the deadline runs from the first packet
                    stop_at = cur_start + deadline
            ch = open_chunks.get(seq)
            if ch is None:
                ch = open_chunks[seq] = _Chunk(np.zeros(L, np.int64))
            ch.queue, ch.ce = max(ch.queue, pkt.max_queue), ch.ce or ce
            if ch.bitmap & pkt.contributors or pkt.contributors & ~self.all_mask:
                cur.duplicates += 1
                if pkt.flags & FLAG_RETRANSMIT:  # the sender waits: say who is still missing
                    self._status(pkt.seq, pkt.contributors & self.all_mask, ch.bitmap)
                continue
            if pkt.is_aggregated:
                cur.aggregated_packets += 1
            else:
                cur.raw_packets += 1
            ch.bitmap |= pkt.contributors
            ch.acc += np.asarray(pkt.values, np.int64)
            if ch.bitmap != self.all_mask:
                if pkt.flags & FLAG_RETRANSMIT:
                    self._status(pkt.seq, pkt.contributors & self.all_mask, ch.bitmap)
                continue
            self.fixed.check_sum(ch.acc)
            totals[c * L : (c + 1) * L] = ch.acc
            del open_chunks[seq]
            done_ahead.add(seq)
            while done_upto in done_ahead:
                done_ahead.discard(done_upto)
                done_upto += 1
            self._ack(pkt.seq, self.all_mask, ch.acc, ch.queue, ch.ce)
            remaining -= 1
            if remaining == 0:
                cur.seconds = time.perf_counter() - cur_start
                cur.total = self.fixed.from_fixed(totals[: self.size])
                results.append(cur)
                if each is not None:
                    each(cur)
                cur, remaining = None, self.chunks
                previous, totals = totals, np.zeros(self.chunks * self.lanes, np.int64)
                stop_at = time.perf_counter() + deadline
                if len(results) == iterations:
                    linger_until = time.perf_counter() + linger

    def serve(
        self, retain: int | None = None, each: Callable[[IterationResult], None] | None = None
    ) -> ServeStats:
        """A training job's parameter server, until `stop()`: chunks of any number, each
        completed on its own (a bucket of any size is its chunks; no iteration size to
        agree on), sequence numbers modulo 2^32. The sums of the last `retain` chunks are
        kept, to acknowledge again a chunk whose acknowledgement a worker lost (a worker
        is never more than its window, at most 65,535 chunks, behind). A job started again
        against it (its ranks join with new nonces) gets a new run; a job that stops
        leaves it serving. `each` is called once per step, when every chunk up to one a
        worker flagged as a step's last (FLAG_END) is complete, with the step's packets
        (`total` is empty: a step is several exchanges of any sizes). `retain` defaults to
        RETAIN chunks of 32 values, fewer of larger chunks (the same 32 MB of sums)."""
        if retain is None:
            retain = RETAIN * LANES // self.lanes
        if not 1 <= retain <= 1 << 20:
            raise ValueError(f"retain: {retain} outside 1..{1 << 20}")
        if self.datapath == "native":
            return native.serve(self, retain, each)
        ring = np.zeros((retain, self.lanes), np.int64)
        ring_idx = np.full(retain, -1, np.int64)
        open_chunks: dict[int, _Chunk] = {}
        low = 0  # the oldest index not complete; indices count from `first_seq`
        done_ahead: set[int] = set()
        stats = ServeStats()
        step = IterationResult(0, np.zeros(0), 0.0)
        step_start = time.perf_counter()
        ends: set[int] = set()  # indices flagged as a step's last chunk
        while not self._stop:
            self.sock.settimeout(0.05)
            try:
                data, ce = self._recv()
            except TimeoutError:
                continue
            try:
                pkt = AggPacket.decode(data)
            except PacketError:
                continue
            if pkt.job_id != self.job_id or pkt.is_ack:
                continue
            if pkt.is_join:
                self._join(pkt)
                if self._new_run:
                    self._new_run = False
                    open_chunks.clear()
                    ring_idx[:] = -1
                    low, done_ahead = 0, set()
                    ends.clear()
                    stats.runs = self.runs
                continue
            if pkt.run != self.run_id:
                self.other_runs += 1
                self._answer_join(pkt.worker_id)
                continue
            if len(pkt.values) != self.lanes:
                self._other_size(pkt)
                continue
            idx = low + _signed32(pkt.seq - self.first_seq - low)
            if idx < 0:
                continue
            mask = pkt.contributors & self.all_mask
            slot = idx % retain
            if idx < low or idx in done_ahead:
                if ring_idx[slot] == idx:  # complete: acknowledged again, with its sum
                    self._ack(pkt.seq, mask, ring[slot], pkt.max_queue, ce)
                continue
            if idx - low >= retain:
                continue  # further ahead than any worker can be: not kept
            ch = open_chunks.get(idx)
            if ch is None:
                ch = open_chunks[idx] = _Chunk(np.zeros(self.lanes, np.int64))
            ch.queue, ch.ce = max(ch.queue, pkt.max_queue), ch.ce or ce
            if ch.bitmap & pkt.contributors or pkt.contributors & ~self.all_mask:
                stats.duplicates += 1
                if pkt.flags & FLAG_RETRANSMIT:
                    self._status(pkt.seq, mask, ch.bitmap)
                continue
            if pkt.is_aggregated:
                stats.aggregated_packets += 1
                step.aggregated_packets += 1
            else:
                stats.raw_packets += 1
                step.raw_packets += 1
            if pkt.flags & FLAG_END:
                ends.add(idx)
            ch.bitmap |= pkt.contributors
            ch.acc += np.asarray(pkt.values, np.int64)
            if ch.bitmap != self.all_mask:
                if pkt.flags & FLAG_RETRANSMIT:
                    self._status(pkt.seq, mask, ch.bitmap)
                continue
            self.fixed.check_sum(ch.acc)
            ring[slot], ring_idx[slot] = ch.acc, idx
            del open_chunks[idx]
            done_ahead.add(idx)
            while low in done_ahead:
                done_ahead.discard(low)
                if low in ends:
                    ends.discard(low)
                    step.seconds = time.perf_counter() - step_start
                    stats.steps += 1
                    if each is not None:
                        each(step)
                    step = IterationResult(step.iteration + 1, np.zeros(0), 0.0)
                    step_start = time.perf_counter()
                low += 1
            self._ack(pkt.seq, self.all_mask, ch.acc, ch.queue, ch.ce)
            stats.chunks += 1
        return stats
