"""Derived state: per link (switch, egress port, queue), per flow, per reporting switch.

Everything here is bounded: links by `max_links`, flows by an LRU of `max_flows`, sequence
trackers by the link bound. Change detection decides which series are written: a series
is due when a smoothed value moved by at least max(absolute, relative x last written)
since its last point, or when `keepalive_s` has passed; a link or report series with
observations not yet in a point also once `max_unwritten_s` has passed, so a crash loses
at most that much of its counts (docs/telemetry-schema.md).
"""

from __future__ import annotations

import ipaddress
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from .settings import Settings
from .wire import Flow, Report


@dataclass(slots=True)
class Point:
    """One InfluxDB point, before line-protocol encoding."""

    measurement: str
    tags: dict[str, str]
    fields: dict[str, float | int | str]
    time_ns: int


class LinkState:
    __slots__ = (
        "agg_share",
        "dirty",
        "evidence",
        "evidence_at",
        "last_seen_ns",
        "latency",
        "latency_max",
        "port",
        "queue",
        "queue_max",
        "queue_occupancy",
        "samples",
        "switch",
        "util",
        "util_bytes",
        "util_last_ts",
        "util_start",
        "written",
        "written_at",
    )

    def __init__(self, switch: int, port: int, queue: int | None) -> None:
        self.switch, self.port, self.queue = switch, port, queue
        self.latency: float | None = None  # EWMA, ns
        self.latency_max = 0.0
        self.queue_occupancy: float | None = None  # EWMA, device units
        self.queue_max = 0.0
        self.util: float | None = None  # EWMA, fraction of line rate
        # EWMA of "this reported packet is in-network aggregation traffic": the share of the
        # port's packets that the aggregation protocol takes (reports sample packets).
        self.agg_share: float | None = None
        self.util_bytes = 0
        self.util_start: int | None = None
        self.util_last_ts: int | None = None
        self.samples = 0
        self.dirty = False
        self.written: tuple[float | None, ...] | None = None
        self.written_at = 0.0
        self.last_seen_ns = 0
        # While pending (not yet a series): fresh datagrams that showed it, and the last.
        self.evidence = 0
        self.evidence_at = 0


class FlowState:
    __slots__ = (
        "dirty", "last_seen_ns", "latency", "news", "path", "sink", "written", "written_at",
    )  # fmt: skip

    def __init__(self, sink: int) -> None:
        self.sink = sink
        self.path: tuple[int, ...] = ()
        self.latency: float | None = None  # EWMA of the sum of hop latencies, ns
        self.dirty = False  # observed since change detection last looked
        self.news = False  # observed since the last point
        self.written: tuple[tuple[int, ...], float | None] | None = None
        self.written_at = 0.0
        self.last_seen_ns = 0


class SequenceTracker:
    """Report loss per (node, hw_id) from Telemetry Report sequence numbers.

    A forward gap counts as loss; a report up to `window` behind the newest is late (it was
    counted lost, so loss goes back down by one); further behind means the switch restarted.
    A repeated number is counted apart: ONOS's bmv2 int.p4 always sends 0.
    """

    __slots__ = (
        "fresh",
        "last",
        "last_ts",
        "late",
        "lost",
        "modulus",
        "received",
        "repeated",
        "restarts",
        "window",
        "written",
        "written_at",
        "written_received",
    )

    def __init__(self, bits: int, window: int = 1024) -> None:
        self.modulus = 1 << bits
        self.window = window
        self.last: int | None = None
        self.received = self.lost = self.late = self.repeated = self.restarts = 0
        self.written: int | None = None  # `lost` when last written
        self.written_at = 0.0
        self.written_received = 0  # `received` when last written
        self.fresh = 0  # datagrams that moved this sender forward (`advance`)
        self.last_ts: int | None = None  # newest v1 ingress timestamp

    def advance(self, seq: int, ingress_ts: int | None) -> bool:
        """Whether this datagram moves its sender forward: a new sequence number at most
        `window` ahead (v2), or a newer ingress timestamp (v1: ONOS numbers every report 0).
        A copy, a late or a far-off number does not. Call before `observe`."""
        if ingress_ts is not None:
            last, self.last_ts = self.last_ts, ingress_ts
            if last is not None and not 0 < (ingress_ts - last) % (1 << 32) < 1 << 31:
                self.last_ts = last
                return False
        elif self.last is not None and not 0 < (seq - self.last) % self.modulus <= self.window:
            return False
        self.fresh += 1
        return True

    def observe(self, seq: int) -> int:
        """Account for one report; returns the change in `lost`."""
        self.received += 1
        if self.last is None:
            self.last = seq
            return 0
        ahead = (seq - self.last) % self.modulus
        if ahead == 0:
            self.repeated += 1
            return 0
        if ahead < self.modulus // 2:
            self.last = seq
            self.lost += ahead - 1
            return ahead - 1
        behind = self.modulus - ahead
        if behind <= self.window:
            self.late += 1
            if self.lost:
                self.lost -= 1
                return -1
            return 0
        self.restarts += 1
        self.last = seq
        return 0


class Rejected(Exception):
    """A datagram the plausibility filter turns away; `reason` is a metric label."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def _names_itself(r: Report) -> bool:
    """Whether a report carries its sender's own metadata: RepMd/local metadata, or its
    sender's node ID on the newest hop (an INT sink pushes its own hop, INT v2.1 §5.7
    option 1; ONOS's int.p4 does). A header whose node ID was garbled does not."""
    if r.local is not None:
        return True
    lay = r.layout
    return (
        lay is not None
        and r.hop_count > 0
        and lay.i_node_id >= 0
        and (r.stack[lay.i_node_id] == r.node_id)
    )


def unwritten_limit(s: Settings) -> float:
    """How long a link or report series with news may go unwritten: `max_unwritten_s`
    (or `keepalive_s` if shorter), less half a tick, so that ticks a hair early on the wall
    clock still write it at the first tick at or after the limit."""
    return max(0.0, min(s.keepalive_s, s.max_unwritten_s) - s.tick_s / 2)


def _moved(new: float | None, old: float | None, absolute: float, relative: float) -> bool:
    if new is None:
        return False
    if old is None:
        return True
    return abs(new - old) >= max(absolute, relative * abs(old))


def flow_text(flow: Flow) -> str:
    src, dst = ipaddress.ip_address(flow.src), ipaddress.ip_address(flow.dst)
    return f"{src}:{flow.sport}>{dst}:{flow.dport}/{flow.proto}"


class Fabric:
    """All derived state of one receiving process."""

    def __init__(self, settings: Settings, worker: int = 0, workers: int = 1) -> None:
        self.s = settings
        # Point times of worker k are k modulo `workers`: two receiving processes writing the
        # same link series never write the same timestamp (which would overwrite a point).
        self._stamp_rem, self._stamp_mod = worker, workers
        self.alpha = settings.ewma_alpha
        self.v2_unit = settings.v2_time_unit_ns
        self.v1_unit = settings.v1_time_unit_ns
        self.tx_full_scale = settings.tx_utilization_full_scale
        self.v1_sink_mirror = settings.v1_sink_hop_is_mirror
        # -1 never matches a UDP port: no aggregation share is kept
        self.agg_port = (
            -1 if settings.aggregation_udp_port is None else settings.aggregation_udp_port
        )
        self.links: dict[tuple[int, int, int | None], LinkState] = {}
        self.flows: OrderedDict[Flow, FlowState] = OrderedDict()
        self.seq: dict[tuple[int, int], SequenceTracker] = {}
        # Plausibility (what bad input can create): with `allowed_switches`, only those node
        # IDs make links and report series; otherwise a link, and a reporting switch, becomes
        # a series only once `link_min_reports` distinct datagrams showed it. Until then it
        # is pending, in a bounded table that drops its oldest when full.
        self.allowed = frozenset(settings.allowed_switches) or None
        self.min_reports = settings.link_min_reports
        self.filtering = self.allowed is None and self.min_reports > 1
        self.pending: OrderedDict[tuple[int, int, int | None], LinkState] = OrderedDict()
        self.seq_pending: OrderedDict[tuple[int, int], None] = OrderedDict()
        self.switches: set[int] = set()  # nodes of confirmed reporting switches
        self._serial = 0  # datagrams folded: a pending link counts one datagram once
        self._fresh = False  # the current datagram moved its sender forward
        self.links_full = 0  # hops not tracked because max_links was reached
        self.hops_unattributed = 0  # hops without node ID or egress port
        self.hops_implausible = 0  # hops of a node not allowed, or of a link never confirmed
        self.lost_total = 0
        self.flows_evicted = 0  # flows dropped from the LRU for a newer one
        self.flows_evicted_unwritten = 0  # ... before their news was in a point
        self._last_time_ns = 0

    # Sizes and totals (the same on FastFabric) -------------------------------------------

    def counts(self) -> dict[str, int]:
        return {"links": len(self.links), "flows": len(self.flows),
                "links_pending": len(self.pending)}  # fmt: skip

    def lost_per_switch(self) -> dict[str, int]:
        lost: dict[str, int] = {}
        for (node, _hw), tr in list(self.seq.items()):
            lost[str(node)] = lost.get(str(node), 0) + tr.lost
        return lost

    def link_keys(self) -> set[tuple[int, int, int | None]]:
        return set(self.links)

    # Hot path -----------------------------------------------------------------------------

    def observe(self, r: Report, now_ns: int) -> None:
        """Fold one decoded report (alone in its datagram) into state."""
        self.observe_datagram((r,), now_ns)

    def observe_datagram(self, reports: Sequence[Report], now_ns: int) -> None:
        """Fold the reports of one datagram into link, flow and sequence state.

        The sequence number belongs to the datagram (Telemetry Report v2.0 §3.2: one group
        header, one number, however many individual reports follow), so it is counted once.
        """
        if not reports:
            return
        r = reports[0]
        if self.allowed is not None and r.node_id not in self.allowed:
            raise Rejected("switch_not_allowed", f"node {r.node_id} is not in allowed_switches")
        self._serial += 1
        self._fresh = False
        key = (r.node_id, r.hw_id)
        tr = self.seq.get(key)
        if tr is None:
            if len(self.seq) >= self.s.max_links:
                self.links_full += 1
            else:
                tr = self.seq[key] = SequenceTracker(22 if r.family == "v2" else 32)
                self.seq_pending[key] = None
                if len(self.seq_pending) > self.s.max_pending_links:
                    del self.seq[self.seq_pending.popitem(last=False)[0]]
        if tr is not None:
            # Evidence that the sender and what it reports are real: datagrams that move it
            # forward. Copies of one datagram (replayed or fuzzed) add nothing.
            fresh = _names_itself(r) and tr.advance(r.seq, r.ingress_ts)
            self.lost_total += tr.observe(r.seq)
            pending = key in self.seq_pending
            if pending and (tr.fresh >= self.min_reports or not self.filtering):
                del self.seq_pending[key]
                self.switches.add(r.node_id)
                pending = False
            # Only a confirmed sender vouches for the links it reports.
            self._fresh = fresh and not pending
        for r in reports:
            self._report(r, now_ns)

    def _pending(self, key: tuple[int, int, int | None]) -> LinkState | None:
        """The link `key` not yet a series: its pending state (created if need be), or the
        link itself once this datagram confirms it, or None if the hop is not tracked."""
        if self.allowed is not None and key[0] not in self.allowed:
            self.hops_implausible += 1
            return None
        pending = self.pending
        ls = pending.get(key)
        if ls is None:
            ls = pending[key] = LinkState(key[0], key[1], key[2])
            if len(pending) > self.s.max_pending_links:
                self.hops_implausible += pending.popitem(last=False)[1].samples
        if self._fresh and ls.evidence_at != self._serial:
            ls.evidence += 1
            ls.evidence_at = self._serial
        if ls.evidence < self.min_reports and self.filtering:
            return ls
        del pending[key]
        if len(self.links) >= self.s.max_links:
            self.links_full += ls.samples + 1
            return None
        self.links[key] = ls
        return ls

    def _report(self, r: Report, now_ns: int) -> None:
        if r.family == "v2":
            unit, ts_bits = self.v2_unit, 64
        else:
            unit, ts_bits = self.v1_unit, 32
        lay = r.layout
        flow = r.flow
        agg = None if flow is None or self.agg_port < 0 else float(flow.dport == self.agg_port)
        total_latency = 0.0
        have_latency = False
        path: list[int] = []
        if lay is not None and r.hop_count and not lay.width:
            # Hops of domain-specific metadata only (instruction bitmap 0, Hop ML > 0; INT-MD
            # v2.1 allows it): nothing in them names a node or a port.
            self.hops_unattributed += r.hop_count
        elif lay is not None and r.hop_count:
            w = lay.width
            st = r.stack
            i_node, i_port, i_lat = lay.i_node_id, lay.i_egress_port, lay.i_hop_latency
            i_q, i_ts, i_tx = lay.i_queue, lay.i_egress_ts, lay.i_tx_utilization
            inv = lay.invalid
            inv_node = inv[i_node] if i_node >= 0 else -1
            inv_port = inv[i_port] if i_port >= 0 else -1
            inv_lat = inv[i_lat] if i_lat >= 0 else -1
            inv_q = inv[i_q] if i_q >= 0 else -1
            inv_tx = inv[i_tx] if i_tx >= 0 else -1
            # Utilisation from byte counts needs the per-link timestamp walk (`_link`);
            # everything else is updated inline here.
            by_bytes = i_tx < 0 and i_ts >= 0
            links = self.links
            a = self.alpha
            full_scale = self.tx_full_scale
            # ONOS's bmv2 int.p4 pushes the sink's hop onto the report's clone, whose egress
            # port is the mirror port towards the collector: that hop is on no link the flow
            # crossed (its node is on the path, its latency and port are not the flow's).
            mirror = (
                r.family == "v1" and self.v1_sink_mirror and (i_node < 0 or st[i_node] == r.node_id)
            )
            for base in range(0, w * r.hop_count, w):
                node = st[base + i_node] if i_node >= 0 else inv_node
                if node != inv_node:
                    path.append(node)
                if mirror and not base:
                    self.hops_unattributed += 1
                    continue
                lat = None
                if i_lat >= 0:
                    v = st[base + i_lat]
                    if v != inv_lat:
                        lat = v * unit
                        total_latency += lat
                        have_latency = True
                if (
                    node == inv_node
                    or i_port < 0
                    or (st[base + i_port] == inv_port and st[base + i_port - 1] == inv_port)
                ):  # ports are unavailable only when the whole 4-byte word is all-ones
                    self.hops_unattributed += 1
                    continue
                q = occ = None
                if i_q >= 0:
                    v = st[base + i_q]
                    if v != inv_q:
                        q, occ = v >> 24, v & 0xFFFFFF
                if by_bytes:
                    ts = st[base + i_ts]
                    self._link(
                        node, st[base + i_port], q, lat, occ, None,
                        None if ts == inv[i_ts] else ts, unit, ts_bits, r.packet_length, now_ns,
                        agg,
                    )  # fmt: skip
                    continue
                lkey = (node, st[base + i_port], q)
                ls = links.get(lkey)
                if ls is None:
                    ls = self._pending(lkey)
                    if ls is None:
                        continue
                if lat is not None:
                    old = ls.latency
                    ls.latency = lat if old is None else old + a * (lat - old)
                    if lat > ls.latency_max:
                        ls.latency_max = lat
                if occ is not None:
                    old = ls.queue_occupancy
                    ls.queue_occupancy = occ if old is None else old + a * (occ - old)
                    if occ > ls.queue_max:
                        ls.queue_max = occ
                if i_tx >= 0:
                    v = st[base + i_tx]
                    if v != inv_tx:
                        util = v / full_scale
                        old = ls.util
                        ls.util = util if old is None else old + a * (util - old)
                if agg is not None:
                    old = ls.agg_share
                    ls.agg_share = agg if old is None else old + a * (agg - old)
                ls.samples += 1
                ls.dirty = True
                ls.last_seen_ns = now_ns
        if r.local is not None:
            loc = r.local
            lat = None if loc.hop_latency is None else loc.hop_latency * unit
            if lat is not None:
                total_latency += lat
                have_latency = True
            if not path or path[0] != r.node_id:
                path.insert(0, r.node_id)
            if loc.egress_port is not None:
                self._link(
                    r.node_id, loc.egress_port, loc.queue_id, lat, loc.queue_occupancy,
                    loc.tx_utilization, loc.egress_ts, unit, ts_bits, r.packet_length, now_ns,
                    agg,
                )  # fmt: skip
        if r.flow is not None and path:
            self._flow(r.flow, r.node_id, path, total_latency if have_latency else None, now_ns)

    def _link(
        self,
        node: int,
        port: int,
        queue: int | None,
        lat: float | None,
        occ: int | None,
        tx: int | None,
        ts: int | None,
        unit: float,
        ts_bits: int,
        length: int | None,
        now_ns: int,
        agg: float | None = None,
    ) -> None:
        key = (node, port, queue)
        ls = self.links.get(key)
        if ls is None:
            ls = self._pending(key)
            if ls is None:
                return
        a = self.alpha
        if lat is not None:
            ls.latency = lat if ls.latency is None else ls.latency + a * (lat - ls.latency)
            if lat > ls.latency_max:
                ls.latency_max = lat
        if occ is not None:
            ls.queue_occupancy = (
                occ
                if ls.queue_occupancy is None
                else ls.queue_occupancy + a * (occ - ls.queue_occupancy)
            )
            if occ > ls.queue_max:
                ls.queue_max = occ
        util = None
        if tx is not None:
            util = tx / self.s.tx_utilization_full_scale
        elif ts is not None and length is not None:
            util = self._util_from_bytes(ls, ts, unit, ts_bits, length)
        if util is not None:
            ls.util = util if ls.util is None else ls.util + a * (util - ls.util)
        if agg is not None:
            ls.agg_share = agg if ls.agg_share is None else ls.agg_share + a * (agg - ls.agg_share)
        ls.samples += 1
        ls.dirty = True
        ls.last_seen_ns = now_ns

    def _util_from_bytes(
        self, ls: LinkState, ts: int, unit: float, ts_bits: int, length: int
    ) -> float | None:
        """Bytes of reported packets over device time: a lower bound unless every packet
        on the link is reported."""
        if ls.util_start is None or ls.util_last_ts is None:
            ls.util_start, ls.util_last_ts, ls.util_bytes = ts, ts, length
            return None
        step = (ts - ls.util_last_ts) % (1 << ts_bits)
        if step > (1 << (ts_bits - 1)):  # clock went back (reordering or wrap confusion)
            ls.util_start, ls.util_last_ts, ls.util_bytes = ts, ts, length
            return None
        ls.util_last_ts = ts
        span_ns = ((ts - ls.util_start) % (1 << ts_bits)) * unit
        if span_ns < self.s.utilization_window_ns:
            ls.util_bytes += length
            return None
        util = ls.util_bytes * 8 / (span_ns * 1e-9 * self.s.link_speed_bps)
        ls.util_start, ls.util_bytes = ts, length
        return min(util, 1.0) if util >= 0 else None

    def _flow(
        self, flow: Flow, sink: int, path: list[int], latency: float | None, now_ns: int
    ) -> None:
        fs = self.flows.get(flow)
        if fs is None:
            fs = self.flows[flow] = FlowState(sink)
            if len(self.flows) > self.s.max_flows:
                old = self.flows.popitem(last=False)[1]
                self.flows_evicted += 1
                self.flows_evicted_unwritten += old.news
        else:
            self.flows.move_to_end(flow)
        path.reverse()  # INT stacks are newest first; a path reads source to sink
        fs.path = tuple(path)
        fs.sink = sink
        if latency is not None:
            fs.latency = (
                latency if fs.latency is None else fs.latency + self.alpha * (latency - fs.latency)
            )
        fs.dirty = fs.news = True
        fs.last_seen_ns = now_ns

    # Change detection -------------------------------------------------------------------------

    def _stamp(self, t: int) -> int:
        # Unique, increasing timestamps: two points of a series never overwrite each other.
        t = max(t, self._last_time_ns + 1)
        if self._stamp_mod > 1:
            t += (self._stamp_rem - t) % self._stamp_mod
        self._last_time_ns = t
        return t

    def due_points(self, now: float | None = None, force: bool = False) -> list[Point]:
        """Points for every series that changed past its threshold or needs a keep-alive
        (`force`: every series with news since its last point, as on shutdown).

        A series has news when something was observed since its last point (a link's
        `samples` > 0); it stays news until a point carries it, so every hop observation
        ends up in exactly one point's `samples` once `force` has run. `dirty` only saves
        re-checking thresholds of series that saw nothing since the last look.
        """
        now = time.time() if now is None else now
        s = self.s
        rel = s.relative_threshold
        keepalive = s.keepalive_s
        counted = unwritten_limit(s)
        out: list[Point] = []
        for ls in self.links.values():
            if not ls.samples:
                continue
            w = ls.written
            if not force and w is not None and now - ls.written_at < counted:
                if not ls.dirty:
                    continue
                ls.dirty = False
                if not (
                    _moved(ls.latency, w[0], s.latency_threshold_ns, rel)
                    or _moved(ls.queue_occupancy, w[1], s.queue_threshold, rel)
                    or _moved(ls.util, w[2], s.utilization_threshold, rel)
                    or _moved(ls.agg_share, w[3], s.utilization_threshold, rel)
                ):
                    continue
            ls.dirty = False
            out.append(self._link_point(ls))
            ls.written = (ls.latency, ls.queue_occupancy, ls.util, ls.agg_share)
            ls.written_at = now
            ls.samples = 0
            ls.latency_max = 0.0
            ls.queue_max = 0.0
        switches = self.switches
        budget = s.max_flow_points
        for flow, fs in self.flows.items():
            if not fs.news or fs.sink not in switches:
                continue
            if not force and not budget:
                break
            w = fs.written
            if not force and w is not None and now - fs.written_at < keepalive:
                if not fs.dirty:
                    continue
                fs.dirty = False
                if w[0] == fs.path and not _moved(fs.latency, w[1], s.latency_threshold_ns, rel):
                    continue
            fs.dirty = fs.news = False
            fields: dict[str, float | int | str] = {
                "flow": flow_text(flow), "path": ",".join(map(str, fs.path)), "hops": len(fs.path),
            }  # fmt: skip
            if fs.latency is not None:
                fields["latency_ns"] = float(fs.latency)
            out.append(
                Point("int_flow", {"switch": str(fs.sink)}, fields, self._stamp(fs.last_seen_ns))
            )
            budget -= 1
            fs.written = (fs.path, fs.latency)
            fs.written_at = now
        now_ns = time.time_ns()
        pending = self.seq_pending
        for key, tr in self.seq.items():
            if tr.received == tr.written_received or key in pending:
                continue
            node, hw = key
            if not force and tr.written == tr.lost and now - tr.written_at < counted:
                continue
            fields = {"received": tr.received, "lost": tr.lost, "repeated": tr.repeated}
            tags = {"switch": str(node), "hw_id": str(hw)}
            out.append(Point("int_reports", tags, fields, self._stamp(now_ns)))
            tr.written, tr.written_at, tr.written_received = tr.lost, now, tr.received
        return out

    def _link_point(self, ls: LinkState) -> Point:
        fields: dict[str, float | int | str] = {"samples": ls.samples}
        if ls.latency is not None:
            fields["latency_ns"] = float(ls.latency)
            fields["latency_max_ns"] = float(ls.latency_max)
        if ls.queue_occupancy is not None:
            fields["queue_occupancy"] = float(ls.queue_occupancy)
            fields["queue_occupancy_max"] = float(ls.queue_max)
        if ls.util is not None:
            fields["utilization"] = float(ls.util)
            # Of the packets this collector's sinks report only: several collectors' add
            # up (docs/collector.md, "Several collectors").
            if ls.util_start is not None:
                fields["utilization_from_bytes"] = True
        if ls.agg_share is not None:
            fields["aggregation_share"] = float(ls.agg_share)
        tags = {"switch": str(ls.switch), "port": str(ls.port)}
        if ls.queue is not None:
            tags["queue"] = str(ls.queue)
        return Point("int_link", tags, fields, self._stamp(ls.last_seen_ns))
