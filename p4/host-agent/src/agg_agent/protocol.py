"""The aggregation packet: UDP payload to port 48879 (docs/protocols.md, byte layout there).

Mirrors `agg_t` and `agg_value_t[AGG_LANES]` in p4/include/headers.p4.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from agg_agent import p4names

LANES = 32
"""int32 values per packet (AGG_LANES in p4/include/defines.p4)."""
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
_VALUES = struct.Struct(f"!{LANES}i")
HEADER_BYTES = _HEADER.size
PACKET_BYTES = _HEADER.size + _VALUES.size


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
        if len(self.values) != LANES:
            raise PacketError(f"values: {len(self.values)} lanes, the packet has {LANES}")
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
            return head + _VALUES.pack(*self.values)
        except struct.error as e:
            raise PacketError(f"values: not int32 ({e})") from None

    @classmethod
    def decode(cls, buf: bytes | bytearray | memoryview) -> AggPacket:
        if len(buf) < PACKET_BYTES:
            raise PacketError(f"length: {len(buf)} B, an aggregation packet has {PACKET_BYTES}")
        job, slot, worker, fan_in, flags, queue, contributors, seq, run = _HEADER.unpack_from(
            buf, 0
        )
        values = _VALUES.unpack_from(buf, _HEADER.size)
        return cls(job, slot, worker, fan_in, seq, contributors, flags, values, queue, run)

    @property
    def is_join(self) -> bool:
        return bool(self.flags & FLAG_JOIN)


def _check(name: str, value: int, top: int) -> None:
    if not 0 <= value <= top:
        raise PacketError(f"{name}: {value} outside 0..{top}")
