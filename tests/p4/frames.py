"""Ethernet/IPv4/UDP frames for the bmv2 tests, built with the collector's helpers."""

from __future__ import annotations

import struct

from int_collector.wire import ipv4_header


def mac(i: int) -> bytes:
    return bytes([0, 0, 0, 0, 0, i])


def ip(i: int) -> bytes:
    return bytes([10, 0, 0, i])


def udp_frame(
    src: int, dst: int, sport: int, dport: int, payload: bytes, dscp: int = 0, ecn: int = 0
) -> bytes:
    """A frame from host `src` to host `dst` (MAC and IP end in the host's number)."""
    udp = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload
    return (
        mac(dst)
        + mac(src)
        + b"\x08\x00"
        + ipv4_header(ip(src), ip(dst), 17, len(udp), dscp=dscp, ecn=ecn)
        + udp
    )


def udp_payload(frame: bytes, dport: int) -> bytes | None:
    """The UDP payload of an IPv4 frame to `dport`, or None."""
    if len(frame) < 42 or frame[12:14] != b"\x08\x00" or frame[23] != 17:
        return None
    ihl = (frame[14] & 0x0F) * 4
    off = 14 + ihl
    if struct.unpack_from("!H", frame, off + 2)[0] != dport:
        return None
    length = struct.unpack_from("!H", frame, off + 4)[0]
    return frame[off + 8 : off + length]
