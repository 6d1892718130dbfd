"""The network as the optimizer sees it: link state from INT and the routing towards each
parameter server; a job's tree on it and the cost of an aggregation choice are in `trees`.

Link model (per direction u->v, from the INT snapshot; defaults in documents.py):
    residual rate  r = max(c (1 - util), c / (flows + 1), RESIDUAL_FLOOR * c)   [bit/s]
(the fair-share term only when INT counts the link's flows: a link full of elastic flows
still gives one more flow its share)
    delay          d = latency + 8 queue / c                       [s]
A job's reduction tree is the union of its workers' paths to the parameter server (PS). The
paths come from one shortest-path tree rooted at the PS's switch, so they form an in-tree and
every switch on it has a single next hop towards the PS.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import dijkstra

from agg_optimizer.model import shortest_paths as compiled_search
from agg_optimizer.model.arrays import DST_OF, SRC_OF, index_pairs
from agg_optimizer.model.documents import (
    DEFAULT_HOP_LATENCY_US,
    DEFAULT_LINK_LATENCY_US,
    Instance,
    Job,
)
from agg_optimizer.model.pools import usable

if TYPE_CHECKING:
    from agg_optimizer.model.validation import Checked

RESIDUAL_FLOOR = 0.05
# Bytes of the chunk whose transfer time weighs a link in INT-aware routing: large enough that
# congestion dominates, small enough that latency still breaks ties between idle paths.
ROUTE_REF_BYTES = 1_000_000
# Summing couples every stream of a tree to its slowest link, so a job's CCT follows the worst
# link of its tree more than the sum over the path. Routing weighs a link's transfer time t as
# ref * (t / ref) ** ROUTE_POWER (ref: the time on an idle link): equal to t on idle links,
# 8x for a link at half its rate, so paths avoid one bad link rather than add up small costs.
# 3 gave AGG a lower mean, p95 and p99 than 1 on the paper scenario (docs/evaluation.md).
ROUTE_POWER = 3.0


class Positions:
    """Each link direction's position, (u, v) -> int, built on first use: one dict of
    393,216 directions on a k=64 fat-tree (0.4 s to build), shared by the network's three
    `LinkValues`; the engine's large path reads host links through `Network.host_values`
    and never builds it."""

    __slots__ = ("_links", "_table")

    def __init__(self, links: Sequence[Any]) -> None:
        self._links = links
        self._table: dict[tuple[str, str], int] | None = None

    @property
    def table(self) -> dict[tuple[str, str], int]:
        # Two threads may both build it (the service's loop shares a network): the same
        # table either way, so no lock; the links are kept, never cleared under the other.
        if self._table is None:
            keys = _directions(self._links)
            self._table = dict(zip(keys, range(len(keys)), strict=True))
        return self._table


def _directions(links: Sequence[Any]) -> list[tuple[str, str]]:
    """Each link's two directions in turn: (u, v), (v, u) (the order of the network's
    per-direction arrays)."""
    fwd = zip(map(SRC_OF, links), map(DST_OF, links), strict=True)
    return [e for (u, v) in fwd for e in ((u, v), (v, u))]


class LinkValues(Mapping[tuple[str, str], float]):
    """One value per link direction (u, v), read through a position table shared by the
    network's three of them (`Positions`): one dict instead of three (building each took
    0.12 s on a k=64 fat-tree)."""

    __slots__ = ("_at", "_vals")

    def __init__(self, at: Positions, vals: list[float]) -> None:
        self._at = at
        self._vals = vals

    @property
    def _pos(self) -> dict[tuple[str, str], int]:
        return self._at.table

    def __getitem__(self, key: tuple[str, str]) -> float:
        return self._vals[self._pos[key]]

    def __contains__(self, key: object) -> bool:
        return key in self._pos

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._pos)

    def __len__(self) -> int:
        return len(self._pos)

    def take(self, keys: Iterable[tuple[str, str]]) -> np.ndarray:
        """self[key] for every key, as an array, in one C-level pass."""
        return np.fromiter(map(self._vals.__getitem__, map(self._pos.__getitem__, keys)), float)


def link_values(m: Mapping[tuple[str, str], float], keys: Iterable[tuple[str, str]]) -> np.ndarray:
    """m[key] for every key, as an array (`LinkValues.take` where m is one)."""
    if isinstance(m, LinkValues):
        return m.take(keys)
    return np.fromiter(map(m.__getitem__, keys), np.float64)


@dataclass
class Network:
    """Compiled arrays of an instance's topology and telemetry."""

    ids: list[str]
    index: dict[str, int]
    is_switch: np.ndarray
    programmable: np.ndarray
    slots: np.ndarray
    hop_s: np.ndarray
    attach: dict[str, str]  # host -> its switch
    cap: Mapping[tuple[str, str], float]  # bit/s per direction
    resid: Mapping[tuple[str, str], float]
    delay: Mapping[tuple[str, str], float]
    switch_ids: list[str] = field(default_factory=list)
    sw_index: dict[str, int] = field(default_factory=dict)
    # Switch-to-switch directions (positions in switch_ids) and their link data, in the
    # order of `cap`'s keys; filled by from_instance, else from the dicts on first use.
    _edges: tuple[np.ndarray, np.ndarray] | None = None
    _edge_cap: np.ndarray | None = None
    _edge_resid: np.ndarray | None = None
    _edge_delay: np.ndarray | None = None
    _edge_key: np.ndarray | None = None
    _int_graph_t: csr_matrix | None = None
    # Per node (by `index`): the position of its host link's direction towards its switch
    # (`_host_up`) and from it (`_host_down`) in the per-direction arrays below, -1 for a
    # switch; None where the dicts are the only truth (a direction given twice).
    _host_up: np.ndarray | None = None
    _host_down: np.ndarray | None = None
    # Per node (by `index`): the position in switch_ids of a host's switch, -1 for a switch;
    # None where the dicts are the only truth.
    _host_switch: np.ndarray | None = None
    _dir_values: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def from_instance(cls, inst: Instance, checked: Checked | None = None) -> Network:
        """`checked`: `check_instance(inst)`'s answer, whose node positions and link and
        telemetry ends are used instead of being read again."""
        ids = [n.id for n in inst.topology.nodes]
        index = checked.index if checked is not None else {nid: i for i, nid in enumerate(ids)}
        nodes = inst.topology.nodes
        is_switch = np.array([n.kind == "switch" for n in nodes])
        programmable = np.array([n.kind == "switch" and n.programmable for n in nodes])
        pool = max((j.pool_slots for j in inst.jobs), default=1)
        slots = np.array(
            [
                0
                if n.kind != "switch"
                else usable(n.slots, inst.reserved[n.id], pool)
                if inst.reserved.get(n.id)
                else n.slots
                for n in nodes
            ],
            dtype=np.int64,
        )
        # the switches' hop latencies where telemetry has them (the last entry of a switch
        # wins, as in a dict; names that are no node are ignored)
        hop_s = np.full(len(nodes), DEFAULT_HOP_LATENCY_US * 1e-6)
        for st in inst.telemetry.switches:
            at_node = index.get(st.switch)
            if at_node is not None:
                hop_s[at_node] = st.hop_latency_us * 1e-6
        # Per direction u->v, each link's two in turn (the order routing's graph is built
        # in): numpy over the telemetry instead of a Python loop per direction (a k=64
        # fat-tree has 393,216 of them, and the loop took a second).
        links = inst.topology.links
        n_dir = 2 * len(links)
        c = np.repeat(
            np.fromiter(map(attrgetter("capacity_gbps"), links), np.float64, len(links)) * 1e9, 2
        )
        tl = inst.telemetry.links
        ends = checked.ends if checked is not None else index_pairs(links, index)
        # directions as node-index pairs: the telemetry's against the links' (u->v, v->u)
        n_id = len(ids)
        if checked is not None and checked.telemetry_ends is not None:
            t_ends = checked.telemetry_ends
        else:
            t_ends = index_pairs(tl, index, missing=n_id)  # unknown ends match no link
        base = np.array([n_id + 1, 1])
        want = np.stack([ends, ends[:, ::-1]], axis=1).reshape(-1, 2) @ base
        have = t_ends @ base
        if len(have) == len(want) and np.array_equal(have, want):
            at = np.arange(n_dir)  # the order examples and the service write it in
        else:  # the last entry of a direction wins, as a dict built from them would
            order = np.argsort(have, kind="stable")
            sk = have[order]
            hit = np.searchsorted(sk, want, side="right") - 1
            ok = (hit >= 0) & (np.append(sk, -1)[np.maximum(hit, 0)] == want)
            order = np.append(order, len(tl))  # none: the defaults' row
            at = np.where(ok, order[np.maximum(hit, 0)], len(tl))
        # utilization, queue, latency, flows (NaN: not counted) per telemetry entry, and a
        # last row of the defaults for the directions without one
        nt = len(tl)
        util = np.append(np.fromiter(map(attrgetter("utilization"), tl), np.float64, nt), 0.0)
        q = np.append(np.fromiter(map(attrgetter("queue_bytes"), tl), np.float64, nt), 0.0)
        lat = np.append(
            np.fromiter(map(attrgetter("latency_us"), tl), np.float64, nt),
            DEFAULT_LINK_LATENCY_US,
        )
        flows_l = list(map(attrgetter("flows"), tl))
        if flows_l.count(None) == nt:  # none counted (numpy turns each None into NaN slowly)
            flows = np.full(nt + 1, np.nan)
        else:
            flows = np.append(np.array(flows_l or [], dtype=np.float64), np.nan)
        util, q, lat, flows = util[at], q[at], lat[at], flows[at]
        fair = np.where(np.isnan(flows), 0.0, c / (flows + 1.0))
        resid_a = np.maximum(np.maximum(c * (1.0 - util), fair), RESIDUAL_FLOOR * c)
        delay_a = lat * 1e-6 + 8.0 * q / c
        unique = checked is not None or len(np.unique(want)) == n_dir  # no direction twice
        host_up = host_down = host_switch = None
        if unique:
            at_pos = Positions(list(links))  # its own list: the caller's may change later
            cap = LinkValues(at_pos, c.tolist())
            resid = LinkValues(at_pos, resid_a.tolist())
            delay = LinkValues(at_pos, delay_a.tolist())
        else:  # a direction twice (two links between one pair): the last one wins, as in dicts
            keys = _directions(links)
            cap = dict(zip(keys, c.tolist(), strict=True))
            resid = dict(zip(keys, resid_a.tolist(), strict=True))
            delay = dict(zip(keys, delay_a.tolist(), strict=True))
        host_end = ~is_switch[ends]
        # host -> its switch, link by link and src before dst (the last link of a host wins)
        at_end = np.nonzero(host_end.reshape(-1))[0]  # 2 * link + end, in that order
        link_i, end = at_end // 2, at_end % 2
        attach = dict(
            zip(
                map(ids.__getitem__, ends[link_i, end].tolist()),
                map(ids.__getitem__, ends[link_i, 1 - end].tolist()),
                strict=True,
            )
        )
        hosts_at = ends[host_end]
        if unique and np.all(np.bincount(hosts_at, minlength=n_id) <= 1):
            # a host's link: u->v at 2i, v->u at 2i+1; which end the host is picks one
            host_up = np.full(n_id, -1, dtype=np.int64)
            host_down = np.full(n_id, -1, dtype=np.int64)
            for end in (0, 1):
                i = np.nonzero(host_end[:, end])[0]
                host_up[ends[i, end]] = 2 * i + end
                host_down[ends[i, end]] = 2 * i + 1 - end
        switch_ids = [nid for nid, s in zip(ids, is_switch, strict=True) if s]
        sw_index = {s: i for i, s in enumerate(switch_ids)}
        # the switch-to-switch directions, in `keys` order, as positions in switch_ids
        sw_pos = np.cumsum(is_switch) - 1
        if host_up is not None:
            host_switch = np.full(n_id, -1, dtype=np.int64)
            for end in (0, 1):
                i = np.nonzero(host_end[:, end] & is_switch[ends[:, 1 - end]])[0]
                host_switch[ends[i, end]] = sw_pos[ends[i, 1 - end]]
        both = np.repeat(~host_end.any(axis=1), 2)
        pairs = np.stack([ends, ends[:, ::-1]], axis=1).reshape(-1, 2)[both]
        return cls(
            ids=ids,
            index=index,
            is_switch=is_switch,
            programmable=programmable,
            slots=slots,
            hop_s=hop_s,
            attach=attach,
            cap=cap,
            resid=resid,
            delay=delay,
            switch_ids=switch_ids,
            sw_index=sw_index,
            _edges=(sw_pos[pairs[:, 0]], sw_pos[pairs[:, 1]]),
            _edge_cap=c[both],
            _edge_resid=resid_a[both],
            _edge_delay=delay_a[both],
            _host_up=host_up,
            _host_down=host_down,
            _host_switch=host_switch,
            _dir_values={"cap": c, "resid": resid_a, "delay": delay_a},
        )

    def host_values(self, which: str, hosts: Iterable[str], *, up: bool) -> np.ndarray:
        """`which` (cap, resid or delay) of each host's link towards its switch (`up`) or
        from its switch to it, as an array: `link_values(self.<which>, ...)` without
        building the table of every direction's position."""
        hosts = list(hosts)
        at = self._host_up if up else self._host_down
        if at is None:  # built from dicts, or a direction given twice: read the dicts
            m = getattr(self, which)
            keys = (
                zip(hosts, map(self.attach.__getitem__, hosts), strict=True)
                if up
                else zip(map(self.attach.__getitem__, hosts), hosts, strict=True)
            )
            return link_values(m, keys)
        pos = at[np.fromiter(map(self.index.__getitem__, hosts), np.int64, len(hosts))]
        if np.any(pos < 0):
            bad = hosts[int(np.argmax(pos < 0))]
            raise KeyError(f"{bad!r} has no host link")
        return self._dir_values[which][pos]

    def host_values_at(self, which: str, nodes: np.ndarray, *, up: bool) -> np.ndarray:
        """`host_values` of hosts given as positions in `ids`."""
        at = self._host_up if up else self._host_down
        if at is not None:
            pos = at[nodes]
            if not np.any(pos < 0):
                return self._dir_values[which][pos]
        return self.host_values(which, [self.ids[i] for i in np.asarray(nodes).tolist()], up=up)

    def host_switches(self, nodes: np.ndarray) -> np.ndarray:
        """The position in `switch_ids` of the switch each host is attached to (hosts given
        as positions in `ids`): `sw_index[attach[host]]`, as arrays."""
        if self._host_switch is not None:
            out = self._host_switch[nodes]
            if not np.any(out < 0):
                return out
        ids, attach, sw_index = self.ids, self.attach, self.sw_index
        hosts = np.asarray(nodes).tolist()
        return np.fromiter((sw_index[attach[ids[i]]] for i in hosts), np.int64, len(hosts))

    # -- routing ------------------------------------------------------------------------------

    def _switch_edges(self) -> tuple[np.ndarray, np.ndarray]:
        if self._edges is None:
            pairs = [(u, v) for u, v in self.cap if u in self.sw_index and v in self.sw_index]
            self._edges = (
                np.array([self.sw_index[u] for u, _ in pairs], dtype=np.int64),
                np.array([self.sw_index[v] for _, v in pairs], dtype=np.int64),
            )
            self._edge_cap = np.array([self.cap[e] for e in pairs], dtype=np.float64)
            self._edge_resid = np.array([self.resid[e] for e in pairs], dtype=np.float64)
            self._edge_delay = np.array([self.delay[e] for e in pairs], dtype=np.float64)
        return self._edges

    def edge_data(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Capacity, residual rate and delay of each switch-to-switch direction, in
        `_switch_edges` order."""
        self._switch_edges()
        assert self._edge_cap is not None
        assert self._edge_resid is not None and self._edge_delay is not None
        return self._edge_cap, self._edge_resid, self._edge_delay

    def edge_index(self, u: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Position in `_switch_edges` of each direction u[i] -> v[i] (switch positions);
        every pair must be a link."""
        src, dst = self._switch_edges()
        n = len(self.switch_ids)
        if self._edge_key is None:
            self._edge_key = np.argsort(src * n + dst, kind="stable")
        keys = (src * n + dst)[self._edge_key]
        at = np.searchsorted(keys, np.asarray(u) * n + np.asarray(v))
        return self._edge_key[at]

    def _graph_t(self, weights: np.ndarray) -> csr_matrix:
        """Transposed switch graph: Dijkstra from r on it gives distances *to* r."""
        src, dst = self._switch_edges()
        n = len(self.switch_ids)
        return csr_matrix((weights, (dst, src)), shape=(n, n))

    def int_weights(self) -> np.ndarray:
        cap, resid, delay = self.edge_data()
        t = 8.0 * ROUTE_REF_BYTES / resid
        ref = 8.0 * ROUTE_REF_BYTES / cap
        # Python's float power, not numpy's (which differs from it in the last bit on
        # about 4% of these, and routing on those weights would not be the same).
        bent = np.array([x**ROUTE_POWER for x in (t / ref).tolist()], dtype=np.float64)
        return delay + ref * bent

    @staticmethod
    def _bend(t: np.ndarray | float, cap: np.ndarray | float) -> np.ndarray | float:
        ref = 8.0 * ROUTE_REF_BYTES / cap
        return ref * (t / ref) ** ROUTE_POWER

    def next_hops(
        self,
        roots: list[str],
        *,
        int_aware: bool,
        salt: str = "",
        targets: Mapping[str, Iterable[str]] | None = None,
    ) -> dict[str, np.ndarray]:
        """Per root switch, the index of every switch's next hop towards it (-9999 at the root):
        `next_hop_rows`' rows by root."""
        rows = self.next_hop_rows(roots, int_aware=int_aware, salt=salt, targets=targets)
        return {r: rows[i] for i, r in enumerate(roots)}

    def next_hop_rows(
        self,
        roots: list[str],
        *,
        int_aware: bool,
        salt: str = "",
        targets: Mapping[str, Iterable[str]] | None = None,
        target_positions: Sequence[np.ndarray] | None = None,
    ) -> np.ndarray:
        """Row i: the index of every switch's next hop towards roots[i] (-9999 at the root).

        INT-aware routing weighs links by delay and residual rate. Otherwise hop count, with
        equal-cost ties broken by a hash of `salt` (one ECMP choice per job, as a switch's
        flow hash would make for the job's traffic).

        `targets[root]`: the switches whose paths to root the caller reads. Where the search
        is large (`shortest_paths.use_compiled`), only their paths are then final: every other
        switch's next hop may be -9999 (`shortest_paths.next_hops`, compiled and threaded).
        `target_positions[i]`: the same for roots[i], as positions in `switch_ids` (what a
        caller holding arrays passes instead of `targets`; an empty array: the root only).
        """
        src, _ = self._switch_edges()
        if int_aware:
            if self._int_graph_t is None:
                self._int_graph_t = self._graph_t(self.int_weights())
            gt = self._int_graph_t
        else:
            seed = int.from_bytes(hashlib.blake2b(salt.encode(), digest_size=8).digest(), "big")
            jitter = np.random.default_rng(seed).random(len(src)) * 1e-3
            gt = self._graph_t(1.0 + jitter)
        idx = [self.sw_index[r] for r in roots]
        if compiled_search.use_compiled(len(idx) * gt.nnz):
            want = None
            if target_positions is not None:
                if len(target_positions) != len(idx):
                    raise ValueError(
                        f"target_positions: {len(target_positions)} arrays for {len(idx)} roots"
                    )
                want = [
                    np.asarray(t, dtype=np.int64) if len(t) else np.array([i], np.int64)
                    for t, i in zip(target_positions, idx, strict=True)
                ]
            elif targets is not None:
                # a root nobody asked a path to: the root itself (an empty list means all)
                want = [
                    np.array([self.sw_index[s] for s in targets.get(r, ())] or [i], np.int64)
                    for r, i in zip(roots, idx, strict=True)
                ]
            return compiled_search.next_hops(gt, np.array(idx, dtype=np.int64), want)
        _, pred = dijkstra(gt, directed=True, indices=idx, return_predecessors=True)
        return pred

    def next_hops_shared(
        self, jobs: list[Job], penalty: Mapping[str, Mapping[tuple[str, str], float]] | None = None
    ) -> np.ndarray:
        """INT-aware routes, one row per job, each job seeing the jobs routed before it.

        Routing every job on the same INT weights sends them all over the same least-loaded
        links, which then carry all of them. Here a link already carrying n of these jobs'
        trees counts as offering 1/(n+1) of its residual rate to the next job, so jobs
        placed together spread over the fabric as they will share it. `penalty[job][(u, v)]`
        multiplies the transfer time of link u->v for that job (re-routing, `engine`).
        """
        src, dst = self._switch_edges()
        ids = self.switch_ids
        pairs = [(ids[a], ids[b]) for a, b in zip(src, dst, strict=True)]
        delay = np.array([self.delay[e] for e in pairs])
        cap = np.array([self.cap[e] for e in pairs])
        transfer = np.array([8.0 * ROUTE_REF_BYTES / self.resid[e] for e in pairs])
        edge_of = {(int(a), int(b)): i for i, (a, b) in enumerate(zip(src, dst, strict=True))}
        count = np.zeros(len(src))
        rows = np.empty((len(jobs), len(self.switch_ids)), dtype=np.int64)
        for j, job in enumerate(jobs):
            root = self.sw_index[self.attach[job.ps]]
            extra = np.ones(len(src))
            for (u, v), factor in (penalty or {}).get(job.id, {}).items():
                extra[edge_of[(self.sw_index[u], self.sw_index[v])]] *= factor
            gt = self._graph_t(delay + self._bend(transfer * (1.0 + count) * extra, cap))
            _, pred = dijkstra(gt, directed=True, indices=[root], return_predecessors=True)
            rows[j] = pred[0]
            seen: set[int] = set()
            for w in job.workers:
                v = self.sw_index[self.attach[w]]
                while v != root and v not in seen:
                    seen.add(v)
                    p = int(pred[0][v])
                    count[edge_of[(v, p)]] += 1.0
                    v = p
        return rows
