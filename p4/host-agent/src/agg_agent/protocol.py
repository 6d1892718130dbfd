"""The aggregation packet: UDP payload to port 48879 (docs/protocols.md, byte layout there).

Mirrors `agg_t` and `agg_value_t[AGG_LANES]` in p4/include/headers.p4.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass, field

from agg_agent import p4names

LANES = 32
"""int32 values per packet that the switches sum (AGG_LANES in p4/include/defines.p4): the
chunk size of every job that switches aggregate, and the default."""
MAX_LANES = 8192
"""The most values a packet may carry: a job's chunk is `LANES * k` values, k = 1..256. A
switch sums only packets of exactly `LANES` values and forwards others unsummed, so a job
whose sums the parameter server makes (no aggregating switch, or loopback) may send larger
chunks: fewer packets for the hosts (docs/protocols.md, "Chunk size"). Past about 350 values
a packet no longer fits a 1500-byte MTU."""
MAX_WORKERS = 32
"""Workers per job: the contributor bitmap is 32 bits wide."""
UDP_PORT = p4names.AGG_UDP_PORT

FLAG_AGGREGATED = 0x01
FLAG_RETRANSMIT = 0x02
FLAG_ACK = 0x04
FLAG_ECN_ECHO = 0x08  # in an acknowledgement: its chunk arrived marked CE
FLAG_JOIN = 0x10  # a worker asks the parameter server for its run; the answer also has ACK
FLAG_END = 0x20  # the last chunk of a step's exchange: the PS reports a step when it is in

_HEADER = struct.Struct("!HHBBBBIII")
HEADER_BYTES = _HEADER.size
PACKET_BYTES = _HEADER.size + 4 * LANES
"""Bytes of a packet of `LANES` values (UDP payload)."""


def check_lanes(lanes: int, name: str = "lanes") -> int:
    """`lanes` if it is a chunk size the wire format allows, else ValueError naming it."""
    if not (LANES <= lanes <= MAX_LANES and lanes % LANES == 0):
        raise ValueError(
            f"{name}: {lanes} values a packet; a multiple of {LANES} up to {MAX_LANES}"
        )
    return lanes


def packet_bytes(lanes: int = LANES) -> int:
    """Bytes of a packet carrying `lanes` values (UDP payload)."""
    return HEADER_BYTES + 4 * lanes


@functools.cache
def _values(lanes: int) -> struct.Struct:
    return struct.Struct(f"!{lanes}i")


class PacketError(ValueError):
    """A datagram that is not an aggregation packet; the message names the field."""


@dataclass(slots=True)
class AggPacket:
    job_id: int
    slot: int
    worker_id: int
    fan_in: int
    seq: int
    contributors: int
    flags: int = 0
    values: tuple[int, ...] = field(default=(0,) * LANES)
    # Longest egress queue the packet met (packets, 0-255; p4/include/congestion.p4);
    # in an acknowledgement, the value its chunk arrived with.
    max_queue: int = 0
    # The run (epoch) of the job the packet belongs to: its parameter server's, learnt by
    # the workers when they join (0: none). A slot or a parameter server holding another
    # run's chunk never adds this packet to it (docs/protocols.md, "Runs").
    run: int = 0

    @property
    def is_ack(self) -> bool:
        return bool(self.flags & FLAG_ACK)

    @property
    def is_aggregated(self) -> bool:
        return bool(self.flags & FLAG_AGGREGATED)

    def encode(self) -> bytes:
        _check("job_id", self.job_id, 0xFFFF)
        _check("slot", self.slot, 0xFFFF)
        _check("worker_id", self.worker_id, MAX_WORKERS - 1)
        _check("fan_in", self.fan_in, 0xFF)
        _check("flags", self.flags, 0xFF)
        _check("max_queue", self.max_queue, 0xFF)
        _check("contributors", self.contributors, 0xFFFFFFFF)
        _check("seq", self.seq, 0xFFFFFFFF)
        _check("run", self.run, 0xFFFFFFFF)
        n = len(self.values)
        if not (LANES <= n <= MAX_LANES and n % LANES == 0):
            raise PacketError(f"values: {n} lanes; a multiple of {LANES} up to {MAX_LANES}")
        head = _HEADER.pack(
            self.job_id,
            self.slot,
            self.worker_id,
            self.fan_in,
            self.flags,
            self.max_queue,
            self.contributors,
            self.seq,
            self.run,
        )
        try:
            return head + _values(n).pack(*self.values)
        except struct.error as e:
            raise PacketError(f"values: not int32 ({e})") from None

    @classmethod
    def decode(cls, buf: bytes | bytearray | memoryview) -> AggPacket:
        lanes, odd = divmod(len(buf) - HEADER_BYTES, 4)
        if odd or not (LANES <= lanes <= MAX_LANES and lanes % LANES == 0):
            raise PacketError(
                f"length: {len(buf)} B; an aggregation packet has {HEADER_BYTES} + 4 * "
                f"{LANES} * k (k = 1..{MAX_LANES // LANES})"
            )
        job, slot, worker, fan_in, flags, queue, contributors, seq, run = _HEADER.unpack_from(
            buf, 0
        )
        values = _values(lanes).unpack_from(buf, HEADER_BYTES)
        return cls(job, slot, worker, fan_in, seq, contributors, flags, values, queue, run)

    @property
    def is_join(self) -> bool:
        return bool(self.flags & FLAG_JOIN)


def _check(name: str, value: int, top: int) -> None:
    if not 0 <= value <= top:
        raise PacketError(f"{name}: {value} outside 0..{top}")
