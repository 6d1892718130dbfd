"""A Python reference model of the switch's aggregation logic (p4/include/aggregation.p4).

Same state and decisions as the P4 registers, slot by slot, so the host endpoints can be
tested over real UDP without bmv2, and so the bmv2 tests and these share expectations.
`UdpSwitch` runs the model as a UDP relay with optional injected loss.
"""

from __future__ import annotations

import random
import socket
import threading
from dataclasses import dataclass, field
from enum import Enum

from agg_agent.protocol import (
    FLAG_ACK,
    FLAG_AGGREGATED,
    FLAG_JOIN,
    FLAG_RETRANSMIT,
    LANES,
    MAX_LANES,
    AggPacket,
    packet_bytes,
)

SLOTS = 1024


@dataclass(frozen=True, slots=True)
class JobConfig:
    """One `agg_job` entry: the action `set_job` parameters."""

    pool_base: int
    pool_size: int
    fan_in: int


class Verdict(Enum):
    FORWARD = "forward"  # unchanged, by the forwarding table
    ABSORBED = "absorbed"  # added to a slot, dropped
    DUPLICATE = "duplicate"  # a contributor already in the slot: dropped
    EMIT = "emit"  # the slot completed: the sum goes to the next hop
    FLUSH = "flush"  # a retransmission of a contributor in the slot: the partial sum goes up


@dataclass(slots=True)
class _Slot:
    run: int = 0  # the run whose chunk the slot holds or last completed; 0 = never used
    seq_tag: int = 0  # seq + 1 of the chunk held or last completed; 0 = never used
    count: int = 0
    bitmap: int = 0
    values: list[int] = field(default_factory=lambda: [0] * LANES)


def _wrap32(v: int) -> int:
    return (v + 2**31) % 2**32 - 2**31


class SwitchModel:
    def __init__(self, jobs: dict[int, JobConfig], slots: int = SLOTS) -> None:
        for job, cfg in jobs.items():
            if cfg.pool_base + cfg.pool_size > slots:
                raise ValueError(f"jobs[{job}].pool: {cfg} runs past the switch's {slots} slots")
        self.jobs = dict(jobs)
        self.slots = [_Slot() for _ in range(slots)]

    def process(self, pkt: AggPacket) -> Verdict:
        """Apply the pipeline to `pkt` in place (as the switch rewrites its headers)."""
        cfg = self.jobs.get(pkt.job_id)
        if pkt.flags & (FLAG_ACK | FLAG_JOIN) or cfg is None or pkt.slot >= cfg.pool_size:
            return Verdict.FORWARD
        if len(pkt.values) != LANES:
            return Verdict.FORWARD  # a chunk of another size: the PS sums it, not the switch
        s = self.slots[cfg.pool_base + pkt.slot]
        tag = (pkt.seq + 1) & 0xFFFFFFFF
        if s.run != pkt.run:
            # Another run's leftovers (a killed run's partial sum, or a run before it):
            # never added to, discarded, and the slot claimed for this run.
            s.run, s.seq_tag, s.count, s.bitmap, s.values = pkt.run, tag, 0, 0, [0] * LANES
        elif s.count == 0:
            if s.seq_tag == tag:
                return Verdict.FORWARD  # late retransmission of a completed chunk
            s.seq_tag = tag
        elif s.seq_tag != tag:
            if (tag - s.seq_tag) & 0x80000000:
                return Verdict.FORWARD  # the slot holds a newer chunk
            # It holds an older one, which the PS has completed (a sender reuses a slot
            # only then): stale, discarded.
            s.seq_tag, s.count, s.bitmap, s.values = tag, 0, 0, [0] * LANES
        if s.bitmap & pkt.contributors:
            if not pkt.flags & FLAG_RETRANSMIT:
                return Verdict.DUPLICATE
            # The sender waits for an acknowledgement only a sum at the PS can bring: the
            # partial sum goes up in this packet (still a retransmission) and the slot is freed.
            pkt.values = tuple(s.values)
            pkt.contributors = s.bitmap
            pkt.flags |= FLAG_AGGREGATED
            s.count, s.bitmap, s.values = 0, 0, [0] * LANES
            return Verdict.FLUSH
        s.count += 1
        s.bitmap |= pkt.contributors
        s.values = [_wrap32(a + b) for a, b in zip(s.values, pkt.values, strict=True)]
        if s.count < cfg.fan_in:
            return Verdict.ABSORBED
        pkt.values = tuple(s.values)
        pkt.contributors = s.bitmap
        pkt.flags = (pkt.flags | FLAG_AGGREGATED) & ~FLAG_RETRANSMIT
        s.count, s.bitmap, s.values = 0, 0, [0] * LANES
        return Verdict.EMIT


class UdpSwitch:
    """The model as a UDP relay: what it forwards or emits goes to `next_hop`.

    `loss` drops that fraction of the datagrams it receives and of those it sends.
    """

    def __init__(
        self,
        model: SwitchModel,
        next_hop: tuple[str, int],
        loss: float = 0.0,
        seed: int = 0,
        bind: tuple[str, int] = ("127.0.0.1", 0),
    ) -> None:
        self.model = model
        self.next_hop = next_hop
        self.loss = loss
        self._rng = random.Random(seed)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(bind)
        self.sock.settimeout(0.05)
        self.address: tuple[str, int] = self.sock.getsockname()
        self.counts: dict[Verdict, int] = dict.fromkeys(Verdict, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> UdpSwitch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(packet_bytes(MAX_LANES) + 64)
            except TimeoutError:
                continue
            if self._rng.random() < self.loss:
                continue
            pkt = AggPacket.decode(data)
            verdict = self.model.process(pkt)
            self.counts[verdict] += 1
            sends = verdict in (Verdict.FORWARD, Verdict.EMIT, Verdict.FLUSH)
            if sends and self._rng.random() >= self.loss:
                self.sock.sendto(pkt.encode(), self.next_hop)
