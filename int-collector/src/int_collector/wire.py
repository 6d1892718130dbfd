"""Telemetry report wire formats: decoder and encoder.

Two families (byte layouts and example hex in docs/protocols.md):

* Telemetry Report v2.0 (P4.org, 2020-10-08) whose individual reports carry INT-MD v2.1
  (P4.org, 2020-11-11) embedded in the truncated packet: 8-byte timestamps, shim length
  excluding the shim.
* Telemetry Report v1.0 with INT v1.0 as ONOS 2.x's bmv2 pipeline (`pipelines/basic`,
  `int.p4`) emits it: 16-byte fixed report header, INT shim length including the shim,
  4-byte timestamps, INT over TCP or UDP marked by DSCP.

The decoder is the hot path: every layout is a `struct.Struct` compiled once per
(instruction bitmap, per-hop length, hop count) and cached, so a whole metadata stack is one
`unpack_from`. Every problem raises `DecodeError` with a short reason (a metric label) and
a detail naming the field; nothing else may escape `Decoder.decode`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

# Spec constants -------------------------------------------------------------------------

REPORT_V2 = 2
REPORT_V1 = 1
SHIM_TYPE_INT_MD = 1
INT_MD_V2 = 2

REP_TYPE_INNER_ONLY = 0
REP_TYPE_INT = 1
IN_TYPE_NONE, IN_TYPE_TLV, IN_TYPE_DS_EXT, IN_TYPE_ETHERNET, IN_TYPE_IPV4, IN_TYPE_IPV6 = range(6)
REPORT_LENGTH_TO_END = 0xFF  # Telemetry Report v2.0 §3.3: "extending to the end of the UDP payload"

NPROTO_ETHERNET, NPROTO_DROP, NPROTO_LOCAL = 0, 1, 2  # Telemetry Report v1.0 NProto

ETH_IPV4, ETH_IPV6, ETH_VLAN = 0x0800, 0x86DD, 0x8100
PROTO_TCP, PROTO_UDP = 6, 17

# Per-hop metadata, in instruction-bitmap order (bit 0 is the MSB). Each entry: bitmap bit,
# struct code of the word(s), names of the values it yields. "Q" only for INT v2.x timestamps.
# Bits 9-14 are reserved: a v2.1 node fills a reserved 4-byte word with 0xFFFFFFFF (INT v2.1
# §5.8), so they are read and discarded to keep the offsets right.
_V2_HOP_FIELDS: tuple[tuple[int, str, tuple[str, ...]], ...] = (
    (0, "I", ("node_id",)),
    (1, "HH", ("ingress_port", "egress_port")),
    (2, "I", ("hop_latency",)),
    (3, "I", ("queue",)),
    (4, "Q", ("ingress_ts",)),
    (5, "Q", ("egress_ts",)),
    (6, "II", ("l2_ingress_port", "l2_egress_port")),
    (7, "I", ("tx_utilization",)),
    (8, "I", ("buffer",)),
    *((b, "I", (f"_reserved{b}",)) for b in range(9, 15)),
    (15, "I", ("checksum_complement",)),
)
# INT v1.0 differs only in the timestamps: 4 bytes each.
_V1_HOP_FIELDS = tuple(
    (b, "I" if b in (4, 5) else code, names) for b, code, names in _V2_HOP_FIELDS
)
# Telemetry Report v2.0 RepMdBits: bit 0 reserved (the node ID is in the group header);
# bit 15 is queue ID + drop reason + padding instead of the checksum complement.
_REPORT_MD_FIELDS = tuple(
    sorted(
        (
            (0, "I", ("_reserved0",)),
            *(f for f in _V2_HOP_FIELDS if f[0] not in (0, 15)),
            (15, "I", ("drop",)),
        ),
        key=lambda f: f[0],
    )
)


class DecodeError(Exception):
    """A report that cannot be decoded; `reason` is a short metric label."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


# Decoded records -------------------------------------------------------------------------


@dataclass(slots=True)
class Hop:
    """One node's INT metadata. None: not requested, or the all-ones "invalid" value.

    A port pair shares one metadata (4 bytes at level 1, 8 at level 2) and so one "invalid"
    value: both ports are None or neither is (encoding one None half writes all-ones there,
    which decodes as that port ID).
    """

    node_id: int | None = None
    ingress_port: int | None = None
    egress_port: int | None = None
    hop_latency: int | None = None
    queue_id: int | None = None
    queue_occupancy: int | None = None
    ingress_ts: int | None = None
    egress_ts: int | None = None
    l2_ingress_port: int | None = None
    l2_egress_port: int | None = None
    tx_utilization: int | None = None
    buffer_id: int | None = None
    buffer_occupancy: int | None = None
    checksum_complement: int | None = None
    drop_queue_id: int | None = None
    drop_reason: int | None = None


class Flow(NamedTuple):
    """The monitored packet's 5-tuple (addresses as packed bytes, 4 or 16 long); a tuple,
    so hashing and comparing it (the flow table's key) run in C."""

    src: bytes
    dst: bytes
    proto: int
    sport: int
    dport: int


class StackLayout:
    """How to read one hop (or the report-level metadata) for one instruction bitmap.

    `fmt` is the struct format of a hop without the byte-order prefix; `index` maps a value
    name to its position in the unpacked tuple; `invalid` gives each position's all-ones
    value. `hop_bytes` may exceed the baseline length: the rest is domain-specific metadata,
    skipped (but never the checksum complement, which INT v2.1 §5.8 puts last).
    """

    __slots__ = (
        "base_bytes",
        "bitmap",
        "fmt",
        "hop_bytes",
        "i_egress_port",
        "i_egress_ts",
        "i_hop_latency",
        "i_node_id",
        "i_queue",
        "i_tx_utilization",
        "index",
        "invalid",
        "names",
        "width",
    )

    _cache: ClassVar[dict[tuple[str, int, int], StackLayout]] = {}

    def __init__(
        self, table: tuple[tuple[int, str, tuple[str, ...]], ...], bitmap: int, hop_bytes: int
    ) -> None:
        fmt, names, tail_fmt, tail_names = "", [], "", []
        for bit, code, vals in table:
            if bitmap & (0x8000 >> bit):
                if bit == 15:
                    tail_fmt, tail_names = code, list(vals)
                else:
                    fmt += code
                    names.extend(vals)
        base = struct.calcsize(">" + fmt + tail_fmt)
        if hop_bytes < 0:
            hop_bytes = base
        if hop_bytes < base:
            raise DecodeError(
                "hop_length",
                f"per-hop length {hop_bytes} B is shorter than the {base} B the instruction "
                f"bitmap 0x{bitmap:04x} needs",
            )
        pad = hop_bytes - base
        self.fmt = fmt + (f"{pad}x" if pad else "") + tail_fmt
        self.names = tuple(names + tail_names)
        self.index = {n: i for i, n in enumerate(self.names)}
        self.invalid = tuple(
            (1 << (8 * struct.calcsize(">" + c))) - 1 for c in self.fmt if c.isalpha() and c != "x"
        )
        self.width = len(self.names)
        # Positions the collector's hot path reads (-1: not in this layout).
        self.i_node_id = self.index.get("node_id", -1)
        self.i_egress_port = self.index.get("egress_port", -1)
        self.i_hop_latency = self.index.get("hop_latency", -1)
        self.i_queue = self.index.get("queue", -1)
        self.i_egress_ts = self.index.get("egress_ts", -1)
        self.i_tx_utilization = self.index.get("tx_utilization", -1)
        self.bitmap = bitmap
        self.hop_bytes = hop_bytes
        self.base_bytes = base  # what the instruction bitmap asks for; the rest is DS

    @classmethod
    def get(cls, family: str, bitmap: int, hop_bytes: int) -> StackLayout:
        key = (family, bitmap, hop_bytes)
        layout = cls._cache.get(key)
        if layout is None:
            table = {"v2": _V2_HOP_FIELDS, "v1": _V1_HOP_FIELDS, "rep": _REPORT_MD_FIELDS}[family]
            layout = cls(table, bitmap, hop_bytes)
            if len(cls._cache) < 4096:
                cls._cache[key] = layout
        return layout

    def hop(self, values: tuple[int, ...]) -> Hop:
        """A readable `Hop` from this layout's slice of unpacked values.

        "Invalid" is all-ones over a whole metadata (INT v2.1 §5.8: 4 or 8 bytes of 0xFF),
        so a port pair is unavailable only when both of its halves are all-ones; one
        all-ones half is the port ID 0xFFFF (level 1) or 0xFFFFFFFF (level 2).
        """
        hop = Hop()
        pairs = _PAIRS
        for i, (name, value, invalid) in enumerate(
            zip(self.names, values, self.invalid, strict=True)
        ):
            if name.startswith("_"):
                continue
            if name in pairs:
                j = i + 1 if name.endswith("ingress_port") else i - 1
                if value == invalid and values[j] == invalid:
                    continue
            elif value == invalid:
                continue
            if name == "queue":
                hop.queue_id, hop.queue_occupancy = value >> 24, value & 0xFFFFFF
            elif name == "buffer":
                hop.buffer_id, hop.buffer_occupancy = value >> 24, value & 0xFFFFFF
            elif name == "drop":
                hop.drop_queue_id, hop.drop_reason = value >> 24, (value >> 16) & 0xFF
            else:
                setattr(hop, name, value)
        return hop


_PAIRS = frozenset({"ingress_port", "egress_port", "l2_ingress_port", "l2_egress_port"})
_stack_structs: dict[tuple[str, int], struct.Struct] = {}


def _stack_struct(fmt: str, hops: int) -> struct.Struct:
    key = (fmt, hops)
    s = _stack_structs.get(key)
    if s is None:
        s = struct.Struct(">" + fmt * hops)
        if len(_stack_structs) < 16384:
            _stack_structs[key] = s
    return s


@dataclass(slots=True)
class Report:
    """One individual telemetry report, decoded.

    `stack` is the flat tuple of every hop's values, newest hop first (INT pushes); hop k is
    `stack[k * layout.width:(k + 1) * layout.width]`. `local` is the reporting node's own
    metadata carried in the report header (v2 RepMdBits, v1 local report), if any.
    """

    family: str  # "v2" (Telemetry Report v2.0 + INT-MD v2.1) or "v1" (ONOS bmv2, v1.0)
    node_id: int
    hw_id: int
    seq: int
    dropped: bool = False
    congested: bool = False
    tracked: bool = False
    intermediate: bool = False
    flow: Flow | None = None
    packet_length: int | None = None  # IP total length of the monitored packet
    instruction_bitmap: int = 0
    hop_ml: int = 0
    remaining_hop_count: int = 0
    max_hop_exceeded: bool = False
    mtu_exceeded: bool = False
    layout: StackLayout | None = None
    stack: tuple[int, ...] = ()
    hop_count: int = 0
    partial_stack: bool = False
    local: Hop | None = None
    ingress_ts: int | None = None  # v1 fixed header
    domain_id: int = 0
    ds_instruction: int = 0

    def hops(self) -> list[Hop]:
        """Hops newest first, as `Hop` records (slow path: tests, CLI, docs)."""
        if self.layout is None:
            return []
        w = self.layout.width
        return [self.layout.hop(self.stack[k * w : (k + 1) * w]) for k in range(self.hop_count)]


# Decoder ---------------------------------------------------------------------------------

_U32 = struct.Struct(">I")
_GROUP_V2 = struct.Struct(">II")
_INDIVIDUAL = struct.Struct(">BBBB")
_INT_MAIN = struct.Struct(">HHHH")
_FIXED_V1 = struct.Struct(">IIII")
_LOCAL_V1 = struct.Struct(">IHHII")
_DROP_V1 = struct.Struct(">IHHBBH")
_SHIM = struct.Struct(">BBH")
_MD_V2 = struct.Struct(">IHHHH")
_MD_V1 = struct.Struct(">IHH")
_IPV4 = struct.Struct(">BBH5xB2x4s4s")
_PORTS = struct.Struct(">HH")
# The common v2 shape in one read: individual report header, INT report main contents
# without RepMd, IPv4 (IHL 5), UDP, INT shim, INT-MD metadata header (56 B).
_FAST_V2 = struct.Struct(">BBBBHHHHBBH5xB2x4s4sHHHHBBHIHHHH")
_FAST_TYPES = (REP_TYPE_INT << 4) | IN_TYPE_IPV4


@dataclass(frozen=True, slots=True)
class IntMarking:
    """How the monitored packet says "INT follows the L4 header" (INT v2.1 §4.6)."""

    dscp_value: int | None = 0x17
    dscp_mask: int = 0x3F
    udp_ports: frozenset[int] = frozenset()

    def marks(self, dscp: int, proto: int, dport: int) -> bool:
        if proto == PROTO_UDP and dport in self.udp_ports:
            return True
        return self.dscp_value is not None and (dscp & self.dscp_mask) == (
            self.dscp_value & self.dscp_mask
        )


class Decoder:
    """Decodes one UDP payload into its individual reports.

    Raises `DecodeError` for a malformed, truncated or unknown-version datagram. Well-formed
    individual reports of a type we do not read (IOAM, reserved) are skipped and counted in
    `skipped` by reason, so the other reports of the same datagram still count.
    """

    def __init__(
        self,
        marking: IntMarking | None = None,
        *,
        fast: bool = True,
        source_only: Mapping[int, Mapping[int, int]] | None = None,
    ) -> None:
        self.marking = marking or IntMarking()
        # INT domains whose source-only DS metadata is known: {Domain Specific ID: {DS
        # Instruction bit (0 = MSB): words the INT source adds for it}}; bits not listed
        # are per-hop DS metadata, inside Hop ML.
        self.source_only = {d: dict(bits) for d, bits in (source_only or {}).items()}
        self.skipped: dict[str, int] = {}
        # `fast`: read the common v2 shape (IPv4/UDP, INT-MD, no RepMd) in one struct read;
        # anything else, or anything odd, goes through the general path (same result).
        self.fast = fast
        m = self.marking
        self._dscp = None if m.dscp_value is None else m.dscp_value & m.dscp_mask
        self._dscp_mask = m.dscp_mask
        self._udp_ports = m.udp_ports
        self._fast_stacks: dict[
            tuple[int, int, int], tuple[StackLayout, struct.Struct | None, int]
        ] = {}

    def decode(self, buf: bytes | bytearray | memoryview) -> list[Report]:
        if len(buf) < 8:
            raise DecodeError("truncated", f"datagram of {len(buf)} B is shorter than a header")
        ver = buf[0] >> 4
        if ver == REPORT_V2:
            return self._v2(buf)
        if ver == REPORT_V1:
            return [self._v1(buf)]
        raise DecodeError("unknown_version", f"report header version {ver} (know 1 and 2)")

    def _skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    # Telemetry Report v2.0 ----------------------------------------------------------------

    def _v2(self, buf: bytes | bytearray | memoryview) -> list[Report]:
        w0, node_id = _GROUP_V2.unpack_from(buf, 0)
        hw_id, seq = (w0 >> 22) & 0x3F, w0 & 0x3FFFFF
        end = len(buf)
        off = 8
        reports: list[Report] = []
        if off + 4 > end:
            raise DecodeError("truncated", "no individual report after the group header")
        while off + 4 <= end:
            types, rep_len, md_len, flags = _INDIVIDUAL.unpack_from(buf, off)
            rep_type, in_type = types >> 4, types & 0x0F
            body = off + 4
            stop = end if rep_len == REPORT_LENGTH_TO_END else body + 4 * rep_len
            if stop > end:
                raise DecodeError(
                    "truncated",
                    f"individual report at byte {off}: Report Length {rep_len} words runs "
                    f"{stop - end} B past the datagram",
                )
            off = stop
            if types == _FAST_TYPES and not md_len and stop - body >= 52 and self.fast:
                r = self._fast_v2(buf, body - 4, stop, node_id, hw_id, seq, flags)
                if r is not None:
                    reports.append(r)
                    continue
            if rep_type not in (REP_TYPE_INT, REP_TYPE_INNER_ONLY):
                self._skip("unsupported_report_type")
                continue
            r = Report(
                "v2",
                node_id,
                hw_id,
                seq,
                dropped=bool(flags & 0x80),
                congested=bool(flags & 0x40),
                tracked=bool(flags & 0x20),
                intermediate=bool(flags & 0x10),
            )
            inner = body
            if rep_type == REP_TYPE_INT:
                if body + 8 > stop:
                    raise DecodeError("truncated", "INT report main contents need 8 B")
                md_bits, r.domain_id, _ds_bits, _ds_status = _INT_MAIN.unpack_from(buf, body)
                inner = body + 8 + 4 * md_len
                if inner > stop:
                    raise DecodeError(
                        "malformed",
                        f"MD Length {md_len} words exceeds Report Length {rep_len} words",
                    )
                if md_bits:
                    lay = StackLayout.get("rep", md_bits, -1)
                    if lay.hop_bytes > 4 * md_len:
                        raise DecodeError(
                            "malformed",
                            f"RepMdBits 0x{md_bits:04x} need {lay.hop_bytes} B, MD Length "
                            f"gives {4 * md_len} B",
                        )
                    r.local = lay.hop(_stack_struct(lay.fmt, 1).unpack_from(buf, body + 8))
            if in_type in (IN_TYPE_ETHERNET, IN_TYPE_IPV4, IN_TYPE_IPV6):
                self._packet(buf, inner, stop, in_type, r)
            elif in_type not in (IN_TYPE_NONE, IN_TYPE_TLV, IN_TYPE_DS_EXT):
                raise DecodeError("malformed", f"InType {in_type} is reserved")
            elif in_type == IN_TYPE_TLV:
                self._tlvs(buf, inner, stop, r)
            reports.append(r)
        if off != end and not reports:
            raise DecodeError("truncated", f"{end - off} B after the last individual report")
        return reports

    def _fast_v2(
        self,
        buf: bytes | bytearray | memoryview,
        start: int,
        stop: int,
        node_id: int,
        hw_id: int,
        seq: int,
        flags: int,
    ) -> Report | None:
        """The common shape, or None (then the general path decides, errors included)."""
        (_t, _rl, _ml, _fl, md_bits, _dom, _dsb, _dss, vihl, tos, total, proto, src, dst,
         sport, dport, _ulen, _ucs, b0, length, _npt, w0, bitmap, domain, dsi, _dsf,
         ) = _FAST_V2.unpack_from(buf, start)  # fmt: skip
        if (
            md_bits or dsi or vihl != 0x45 or proto != PROTO_UDP or b0 & 0xFC != 0x10
            or w0 >> 28 != 2
        ):  # fmt: skip
            return None
        if dport not in self._udp_ports and (
            self._dscp is None or (tos >> 2) & self._dscp_mask != self._dscp
        ):
            return None
        hop_ml = (w0 >> 8) & 0x1F
        stack_bytes = 4 * length - 12
        if not hop_ml or stack_bytes <= 0 or start + 56 + stack_bytes > stop:
            return None
        key = (bitmap, hop_ml, stack_bytes)
        ent = self._fast_stacks.get(key)
        if ent is None:
            try:
                lay = StackLayout.get("v2", bitmap, 4 * hop_ml)
            except DecodeError:
                return None
            hops, rest = divmod(stack_bytes, lay.hop_bytes)
            if rest:
                return None  # not whole hops: the general path says why
            ent = (lay, _stack_struct(lay.fmt, hops) if hops else None, hops)
            if len(self._fast_stacks) < 4096:
                self._fast_stacks[key] = ent
        lay, st, hops = ent
        return Report(
            "v2", node_id, hw_id, seq, bool(flags & 0x80), bool(flags & 0x40),
            bool(flags & 0x20), bool(flags & 0x10),
            tuple.__new__(Flow, (src, dst, PROTO_UDP, sport, dport)), total, bitmap, hop_ml,
            w0 & 0xFF, bool(w0 & 0x04000000), bool(w0 & 0x02000000), lay,
            st.unpack_from(buf, start + 56) if st is not None else (), hops, False, None, None,
            domain,
        )  # fmt: skip

    def _tlvs(self, buf: bytes | bytearray | memoryview, off: int, stop: int, r: Report) -> None:
        tlv_in = {1: IN_TYPE_ETHERNET, 2: IN_TYPE_IPV4, 3: IN_TYPE_IPV6}
        while off + 4 <= stop:
            t, tlv_len = buf[off] >> 4, buf[off + 1]
            data, nxt = off + 4, off + 4 + 4 * tlv_len
            if nxt > stop:
                raise DecodeError("truncated", f"TLV at byte {off} runs past its report")
            if t in tlv_in and r.flow is None:
                self._packet(buf, data, nxt, tlv_in[t], r)
            off = nxt

    # The monitored packet and its embedded INT ----------------------------------------------

    def _packet(
        self, buf: bytes | bytearray | memoryview, off: int, stop: int, in_type: int, r: Report
    ) -> None:
        """Read the truncated packet: flow identity and, if marked, the INT-MD stack."""
        if in_type == IN_TYPE_ETHERNET:
            if off + 14 > stop:
                raise DecodeError("truncated", "inner Ethernet header")
            ethertype = (buf[off + 12] << 8) | buf[off + 13]
            off += 14
            if ethertype == ETH_VLAN and off + 4 <= stop:
                ethertype = (buf[off + 2] << 8) | buf[off + 3]
                off += 4
            if ethertype == ETH_IPV4:
                in_type = IN_TYPE_IPV4
            elif ethertype == ETH_IPV6:
                in_type = IN_TYPE_IPV6
            else:
                return  # not IP: no flow, no INT
        if in_type == IN_TYPE_IPV4:
            if off + 20 > stop:
                raise DecodeError("truncated", "inner IPv4 header")
            vihl, tos, total, proto, src, dst = _IPV4.unpack_from(buf, off)
            if vihl >> 4 != 4 or (vihl & 0xF) < 5:
                raise DecodeError("malformed", f"inner IPv4 version/IHL byte 0x{vihl:02x}")
            off += 4 * (vihl & 0xF)
            dscp = tos >> 2
        else:
            if off + 40 > stop:
                raise DecodeError("truncated", "inner IPv6 header")
            if buf[off] >> 4 != 6:
                raise DecodeError("malformed", f"inner IPv6 version nibble {buf[off] >> 4}")
            dscp = ((buf[off] & 0x0F) << 2) | (buf[off + 1] >> 6)
            total = 40 + ((buf[off + 4] << 8) | buf[off + 5])
            proto = buf[off + 6]
            src, dst = bytes(buf[off + 8 : off + 24]), bytes(buf[off + 24 : off + 40])
            off += 40
        r.packet_length = total
        if proto == PROTO_UDP:
            l4 = 8
        elif proto == PROTO_TCP:
            if off + 13 > stop:
                raise DecodeError("truncated", "inner TCP header")
            l4 = 4 * (buf[off + 12] >> 4)
            if l4 < 20:
                raise DecodeError("malformed", f"inner TCP data offset {l4 // 4}")
        else:
            r.flow = Flow(src, dst, proto, 0, 0)
            return
        if off + l4 > stop:
            raise DecodeError("truncated", "inner L4 header")
        sport, dport = _PORTS.unpack_from(buf, off)
        r.flow = Flow(src, dst, proto, sport, dport)
        if not self.marking.marks(dscp, proto, dport):
            return
        off += l4
        if r.family == "v2":
            self._int_md_v2(buf, off, stop, r)
        else:
            self._int_v1(buf, off, stop, r)

    def _int_md_v2(
        self, buf: bytes | bytearray | memoryview, off: int, stop: int, r: Report
    ) -> None:
        if off + 16 > stop:
            raise DecodeError("truncated", "INT shim and INT-MD metadata header need 16 B")
        b0, length, npt_field = _SHIM.unpack_from(buf, off)
        shim_type, npt = b0 >> 4, (b0 >> 2) & 0x3
        if shim_type != SHIM_TYPE_INT_MD:
            self._skip("int_type_not_md")  # INT-MX / destination: no per-hop stack to read
            return
        w0, bitmap, r.domain_id, ds_inst, _ds_flags = _MD_V2.unpack_from(buf, off + 4)
        ver = w0 >> 28
        if ver != INT_MD_V2:
            raise DecodeError("unknown_version", f"INT-MD metadata header version {ver} (know 2)")
        hop_ml = (w0 >> 8) & 0x1F
        stack_bytes = 4 * length - 12  # INT v2.1 §5.7.2: shim Length excludes the shim itself
        if stack_bytes < 0:
            raise DecodeError("malformed", f"INT shim Length {length} words < 3")
        start = off + 16
        if start + stack_bytes > stop:
            raise DecodeError(
                "truncated",
                f"INT stack of {stack_bytes} B (shim Length {length}) runs past the report",
            )
        r.instruction_bitmap, r.hop_ml = bitmap, hop_ml
        r.remaining_hop_count = w0 & 0xFF
        r.max_hop_exceeded, r.mtu_exceeded = bool(w0 & 0x04000000), bool(w0 & 0x02000000)
        r.ds_instruction = ds_inst
        self._stack_v2(buf, start, stack_bytes, bitmap, hop_ml, r)
        if npt == 2 and r.flow is not None:
            # A UDP header was inserted for INT; the original L4 follows the stack.
            orig = start + stack_bytes
            proto = npt_field & 0xFF
            if proto in (PROTO_TCP, PROTO_UDP) and orig + 4 <= stop:
                sport, dport = _PORTS.unpack_from(buf, orig)
                r.flow = Flow(r.flow.src, r.flow.dst, proto, sport, dport)
        elif npt == 1 and r.flow is not None:
            r.flow = Flow(r.flow.src, r.flow.dst, r.flow.proto, r.flow.sport, npt_field)

    def _stack_v2(
        self,
        buf: bytes | bytearray | memoryview,
        start: int,
        stack_bytes: int,
        bitmap: int,
        hop_ml: int,
        r: Report,
    ) -> None:
        """INT-MD v2.1 §5.8: the stack is whole hops of Hop ML words, newest first, then the
        INT source's 'source-only' domain-specific metadata, whose length Hop ML excludes.

        Where that length is known (no DS Instruction bits, or a domain configured in
        `source_only`), the stack must be whole hops plus exactly that (else `malformed`).
        Otherwise, if the DS Instruction asks for more DS words than Hop ML leaves room for
        per hop (each set bit asks for at least one word), some of it is source-only, of a
        length the report does not say: which words are hops is unknown, so none are read
        (`source_only_unknown`; the report itself counts). Reading them anyway would turn
        source-only bytes into hops of nodes that do not exist.
        """
        if hop_ml == 0:
            if stack_bytes:
                raise DecodeError("malformed", "Hop ML is 0 but the INT stack is not empty")
            return
        lay = StackLayout.get("v2", bitmap, 4 * hop_ml)
        r.layout = lay
        ds = r.ds_instruction
        if not ds:
            src_only, exact = 0, True
        elif r.domain_id in self.source_only:
            words = self.source_only[r.domain_id]
            src_only = 4 * sum(w for bit, w in words.items() if ds & (0x8000 >> bit))
            exact = True
        elif ds.bit_count() * 4 <= lay.hop_bytes - lay.base_bytes:
            src_only, exact = 0, False  # every DS bit fits in the per-hop DS words
        else:
            self._skip("source_only_unknown")
            return
        hops, rest = divmod(stack_bytes - src_only, lay.hop_bytes)
        if rest or hops < 0:
            if not exact:
                self._skip("source_only_unknown")
                return
            raise DecodeError(
                "malformed",
                f"INT stack of {stack_bytes} B is not whole hops of {lay.hop_bytes} B (Hop ML "
                f"{hop_ml}) plus {src_only} B of source-only metadata",
            )
        if hops:
            r.stack = _stack_struct(lay.fmt, hops).unpack_from(buf, start)
        r.hop_count = hops

    def _stack_v1(
        self,
        buf: bytes | bytearray | memoryview,
        start: int,
        declared: int,
        avail: int,
        bitmap: int,
        hop_ml: int,
        r: Report,
    ) -> None:
        """INT v1.0 hops as ONOS's bmv2 pipeline pushes them: `declared` bytes by the shim,
        `avail` of them in the report (fewer behind TCP: see `_int_v1`)."""
        if hop_ml == 0:
            if declared:
                raise DecodeError("malformed", "Hop ML is 0 but the INT stack is not empty")
            return
        hop_bytes = 4 * hop_ml
        if bitmap & 0x0200 and hop_ml == (bitmap & 0xFFFF).bit_count():
            # ONOS's INT app sets Hop ML to the number of instruction bits, but the level 2
            # port IDs (bit 6) take two words, and int_transit.p4 pushes (and counts in the
            # shim length) what the bitmap asks for. Where the shim length is whole hops of
            # that size, the report says which it is: read hops of the bitmap's size.
            base = StackLayout.get("v1", bitmap, -1).hop_bytes
            if hop_bytes < base and declared % base == 0:
                hop_bytes = base
        lay = StackLayout.get("v1", bitmap, hop_bytes)
        hops, rest = divmod(avail, lay.hop_bytes)
        if rest and avail < declared:
            r.partial_stack = True
        if hops:
            r.stack = _stack_struct(lay.fmt, hops).unpack_from(buf, start)
        r.layout, r.hop_count = lay, hops

    # ONOS bmv2: Telemetry Report v1.0 + INT v1.0 ------------------------------------------

    def _v1(self, buf: bytes | bytearray | memoryview) -> Report:
        if len(buf) < 16:
            raise DecodeError("truncated", f"v1 fixed report header needs 16 B, got {len(buf)}")
        w0, sw_id, seq, ingress_ts = _FIXED_V1.unpack_from(buf, 0)
        hdr_len = ((w0 >> 24) & 0x0F) * 4
        nproto = (w0 >> 21) & 0x7
        if hdr_len < 16:
            raise DecodeError("malformed", f"v1 fixed header Len {hdr_len // 4} words < 4")
        r = Report(
            "v1",
            sw_id,
            w0 & 0x3F,
            seq,
            dropped=bool(w0 & 0x4000),
            congested=bool(w0 & 0x2000),
            tracked=bool(w0 & 0x1000),
            ingress_ts=ingress_ts,
        )
        off, end = hdr_len, len(buf)
        if off > end:
            raise DecodeError("truncated", "v1 fixed header Len runs past the datagram")
        if nproto == NPROTO_LOCAL:
            if off + 16 > end:
                raise DecodeError("truncated", "v1 switch-local report header needs 16 B")
            _sw, ip, ep, q, ets = _LOCAL_V1.unpack_from(buf, off)
            r.local = Hop(
                ingress_port=ip,
                egress_port=ep,
                queue_id=q >> 24,
                queue_occupancy=q & 0xFFFFFF,
                egress_ts=ets,
            )
            off += 16
        elif nproto == NPROTO_DROP:
            if off + 12 > end:
                raise DecodeError("truncated", "v1 drop report header needs 12 B")
            _sw, ip, ep, qid, reason, _pad = _DROP_V1.unpack_from(buf, off)
            r.local = Hop(ingress_port=ip, egress_port=ep, drop_queue_id=qid, drop_reason=reason)
            r.dropped = True
            off += 12
        elif nproto != NPROTO_ETHERNET:
            raise DecodeError("malformed", f"v1 NProto {nproto} is reserved")
        if off < end:
            self._packet(buf, off, end, IN_TYPE_ETHERNET, r)
        return r

    def _int_v1(self, buf: bytes | bytearray | memoryview, off: int, stop: int, r: Report) -> None:
        if off + 12 > stop:
            raise DecodeError("truncated", "INT v1 shim and header need 12 B")
        int_type, _rsvd, length, _dscp = buf[off], buf[off + 1], buf[off + 2], buf[off + 3]
        if int_type != SHIM_TYPE_INT_MD:
            self._skip("int_type_not_md")
            return
        w0, bitmap, _rsvd3 = _MD_V1.unpack_from(buf, off + 4)
        ver = w0 >> 28
        if ver > 1:  # ONOS's int_source writes 0, INT v1.0 says 1
            raise DecodeError("unknown_version", f"INT v1 header version {ver} (know 0 and 1)")
        hop_ml = (w0 >> 8) & 0x1F
        stack_bytes = 4 * length - 12  # INT v1.0: shim length counts shim + header + stack
        if stack_bytes < 0:
            raise DecodeError("malformed", f"INT v1 shim len {length} words < 3")
        start = off + 12
        r.instruction_bitmap, r.hop_ml = bitmap, hop_ml
        r.remaining_hop_count = w0 & 0xFF
        r.max_hop_exceeded, r.mtu_exceeded = bool(w0 & 0x01000000), bool(w0 & 0x00800000)
        # ONOS sizes its report for an inner UDP header, so behind TCP the stack's last 12 B
        # are cut off (int_report.p4 `truncate`): read the whole hops that arrived.
        avail = min(stack_bytes, stop - start)
        self._stack_v1(buf, start, stack_bytes, avail, bitmap, hop_ml, r)
        if avail < stack_bytes:
            r.partial_stack = True


# Encoder (tests, generator, docs) -------------------------------------------------------


def _hop_values(layout: StackLayout, hop: Hop) -> list[int]:
    out = []
    for name, invalid in zip(layout.names, layout.invalid, strict=True):
        v: int | None
        if name == "queue":
            v = _join24(hop.queue_id, hop.queue_occupancy)
        elif name == "buffer":
            v = _join24(hop.buffer_id, hop.buffer_occupancy)
        elif name == "drop":
            v = None
            if hop.drop_reason is not None:
                v = ((hop.drop_queue_id or 0) << 24) | (hop.drop_reason << 16)
        elif name.startswith("_"):
            v = None
        else:
            v = getattr(hop, name)
        out.append(invalid if v is None else v)
    return out


def _join24(hi: int | None, lo: int | None) -> int | None:
    if hi is None and lo is None:
        return None
    return ((hi or 0) << 24) | (lo or 0)


def encode_stack(family: str, bitmap: int, hops: Iterable[Hop], hop_ml: int | None = None) -> bytes:
    """Per-hop metadata, newest hop first, each padded to `hop_ml` words if given."""
    layout = StackLayout.get(family, bitmap, -1 if hop_ml is None else 4 * hop_ml)
    hop_list = list(hops)
    vals = [v for h in hop_list for v in _hop_values(layout, h)]
    return _stack_struct(layout.fmt, len(hop_list)).pack(*vals)


def hop_words(family: str, bitmap: int) -> int:
    """Per-hop metadata length in 4-byte words for an instruction bitmap."""
    return StackLayout.get(family, bitmap, -1).hop_bytes // 4


def ipv4_header(
    src: bytes, dst: bytes, proto: int, payload_len: int, dscp: int = 0, ecn: int = 0
) -> bytes:
    total = 20 + payload_len
    tos = dscp << 2 | ecn
    hdr = struct.pack(">BBHHHBBH4s4s", 0x45, tos, total, 0, 0x4000, 64, proto, 0, src, dst)
    csum = _ip_checksum(hdr)
    return hdr[:10] + struct.pack(">H", csum) + hdr[12:]


def _ip_checksum(hdr: bytes) -> int:
    s = sum(struct.unpack(f">{len(hdr) // 2}H", hdr))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def int_md_v2(
    bitmap: int,
    hops: list[Hop],
    *,
    hop_ml: int | None = None,
    remaining_hop_count: int = 8,
    shim_npt: int = 0,
    shim_field: int = 0,
    domain_id: int = 0,
    e: bool = False,
    m: bool = False,
) -> bytes:
    """INT shim (v2.1, type INT-MD) + INT-MD metadata header + stack."""
    ml = hop_words("v2", bitmap) if hop_ml is None else hop_ml
    stack = encode_stack("v2", bitmap, hops, ml)
    length = 3 + len(stack) // 4
    shim = struct.pack(">BBH", (SHIM_TYPE_INT_MD << 4) | (shim_npt << 2), length, shim_field)
    w0 = (INT_MD_V2 << 28) | (e << 26) | (m << 25) | (ml << 8) | remaining_hop_count
    return shim + struct.pack(">IHHHH", w0, bitmap, domain_id, 0, 0) + stack


def udp_int_packet(
    flow: Flow, int_bytes: bytes, payload: bytes = b"", dscp: int = 0x17, ethernet: bool = False
) -> bytes:
    """IPv4/UDP (optionally behind Ethernet) carrying INT after the UDP header."""
    udp = struct.pack(">HHHH", flow.sport, flow.dport, 8 + len(int_bytes) + len(payload), 0)
    ip = ipv4_header(flow.src, flow.dst, PROTO_UDP, len(udp) + len(int_bytes) + len(payload), dscp)
    pkt = ip + udp + int_bytes + payload
    if ethernet:
        pkt = b"\x00\x00\x00\x00\x00\x02\x00\x00\x00\x00\x00\x01\x08\x00" + pkt
    return pkt


def report_v2(
    node_id: int,
    seq: int,
    inner: bytes,
    *,
    hw_id: int = 0,
    local: Hop | None = None,
    md_bits: int = 0,
    in_type: int = IN_TYPE_IPV4,
    dropped: bool = False,
    congested: bool = False,
    tracked: bool = True,
    intermediate: bool = False,
    rep_type: int = REP_TYPE_INT,
) -> bytes:
    """One Telemetry Report v2.0 datagram (group header + one individual report)."""
    group = struct.pack(">II", (REPORT_V2 << 28) | (hw_id << 22) | (seq & 0x3FFFFF), node_id)
    return group + individual_report_v2(
        inner,
        local=local,
        md_bits=md_bits,
        in_type=in_type,
        dropped=dropped,
        congested=congested,
        tracked=tracked,
        intermediate=intermediate,
        rep_type=rep_type,
    )


def individual_report_v2(
    inner: bytes,
    *,
    local: Hop | None = None,
    md_bits: int = 0,
    in_type: int = IN_TYPE_IPV4,
    dropped: bool = False,
    congested: bool = False,
    tracked: bool = True,
    intermediate: bool = False,
    rep_type: int = REP_TYPE_INT,
) -> bytes:
    md = encode_stack("rep", md_bits, [local or Hop()]) if md_bits else b""
    pad = (-len(inner)) % 4
    inner = inner + b"\x00" * pad
    main = struct.pack(">HHHH", md_bits, 0, 0, 0) + md if rep_type == REP_TYPE_INT else b""
    words = (len(main) + len(inner)) // 4
    rep_len = words if words < REPORT_LENGTH_TO_END else REPORT_LENGTH_TO_END
    flags = (dropped << 7) | (congested << 6) | (tracked << 5) | (intermediate << 4)
    head = struct.pack(">BBBB", (rep_type << 4) | in_type, rep_len, len(md) // 4, flags)
    return head + main + inner


def report_v1_onos(
    switch_id: int,
    flow: Flow,
    bitmap: int,
    hops: list[Hop],
    *,
    seq: int = 0,
    ingress_ts: int = 0,
    hw_id: int = 1,
    remaining_hop_count: int = 8,
    l4: str = "udp",
    int_version: int = 0,
    hop_ml: int | None = None,
) -> bytes:
    """A report as ONOS 2.x bmv2 `int.p4` emits it (values as its P4 code sets them).

    Hop ML defaults to what ONOS 2.7's INT app configures: the number of instruction bits
    set, one short of the words per hop when the level 2 port IDs (bit 6, two words) are
    asked for; the stack and the shim length are what the bitmap asks for, as
    `int_transit.p4` pushes and counts them.
    """
    stack = encode_stack("v1", bitmap, hops)
    ml = (bitmap & 0xFFFF).bit_count() if hop_ml is None else hop_ml
    shim = struct.pack(">BBBB", SHIM_TYPE_INT_MD, 0, 3 + len(stack) // 4, 0)
    hdr = struct.pack(">IHH", (int_version << 28) | (ml << 8) | remaining_hop_count, bitmap, 0)
    int_bytes = shim + hdr + stack
    if l4 == "udp":
        l4h = struct.pack(">HHHH", flow.sport, flow.dport, 8 + len(int_bytes), 0)
        proto = PROTO_UDP
    else:
        l4h = struct.pack(">HHIIBBHHH", flow.sport, flow.dport, 0, 0, 5 << 4, 0x10, 0, 0, 0)
        proto = PROTO_TCP
    ip = ipv4_header(flow.src, flow.dst, proto, len(l4h) + len(int_bytes), dscp=0x17)
    eth = b"\x00\x00\x00\x00\x00\x02\x00\x00\x00\x00\x00\x01\x08\x00"
    packet = eth + ip + l4h + int_bytes
    if l4 == "tcp":
        # int_report.p4 truncates to (outer headers + inner Ethernet + IPv4 + 8 B + INT).
        packet = packet[: 14 + 20 + 8 + len(int_bytes)]
    # ver=1, len=4, nproto=0, rep_md_bits=0, d=0, q=0, f=1, hw_id
    w0 = (REPORT_V1 << 28) | (4 << 24) | (1 << 12) | hw_id
    return struct.pack(">IIII", w0, switch_id, seq, ingress_ts) + packet
