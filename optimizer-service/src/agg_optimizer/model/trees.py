"""A job's reduction tree on the network (`network.Network`) and the cost of an aggregation
choice on it.

Cost of a job with aggregator set A on its tree (the CCT surrogate, "stream-seconds"):
    streams(v) = 1 if v in A else sum of streams of v's inputs (workers count 1)
    surrogate  = sum over tree edges e of streams(e) * 8 D / r_e  +  sum_{a in A} hop(a)
This is SOAR's network-utilisation objective with INT weights; the PS incast is the term of
the last edge. The predicted CCT reported to users is the bottleneck form:
    cct = max_e streams(e) * 8 D / r_e + max over workers of path delay.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from agg_optimizer.model.documents import Job
from agg_optimizer.model.network import Network


@dataclass
class JobTree:
    """A job's reduction tree: switches with their parent towards the PS."""

    job: Job
    root: str  # the PS's switch
    parent: dict[str, str | None]
    order: list[str]  # switches, children before parents
    children: dict[str, list[str]]
    direct: dict[str, list[str]]  # workers attached to each switch
    raw: dict[str, int]  # workers in each switch's subtree
    tau: dict[str, float]  # per-stream time of the switch's up edge (root: to the PS)
    dist: dict[str, float]  # sum of tau from the switch up to the PS
    tau_worker: dict[str, float]
    delay_to_ps: dict[str, float]  # path delay from each switch to the PS
    worker_delay: dict[str, float]  # worker's full path delay, hop latencies included
    hop: dict[str, float]
    programmable: dict[str, bool]
    worker_tor: dict[str, str]

    def up(self, v: str) -> str:
        p = self.parent[v]
        return p if p is not None else self.job.ps

    def path(self, worker: str) -> list[str]:
        out = [worker]
        v: str | None = None
        v = self.tor(worker)
        while v is not None:
            out.append(v)
            v = self.parent[v]
        out.append(self.job.ps)
        return out

    def tor(self, worker: str) -> str:
        return self.worker_tor[worker]

    def inputs(self, v: str) -> int:
        return len(self.direct[v]) + len(self.children[v])


def build_tree(net: Network, job: Job, pred: np.ndarray) -> JobTree:
    """Union of the workers' paths along `pred` (next-hop indices towards the PS's switch)."""
    root = net.attach[job.ps]
    bits = 8.0 * job.update_bytes
    parent: dict[str, str | None] = {}
    direct: dict[str, list[str]] = {}
    ids, idx = net.switch_ids, net.sw_index
    for w in job.workers:
        tor = net.attach[w]
        direct.setdefault(tor, []).append(w)
        v: str | None = tor
        while v is not None and v not in parent:
            p = ids[pred[idx[v]]] if v != root else None
            parent[v] = p
            v = p
    for v in parent:
        direct.setdefault(v, [])
    children: dict[str, list[str]] = {v: [] for v in parent}
    for v, p in parent.items():
        if p is not None:
            children[p].append(v)
    # depth-first from the root gives parents before children; reverse it.
    order: list[str] = []
    stack = [root]
    while stack:
        v = stack.pop()
        order.append(v)
        stack.extend(children[v])
    order.reverse()

    tau: dict[str, float] = {}
    dist: dict[str, float] = {}
    delay_to_ps: dict[str, float] = {}
    hop = {v: float(net.hop_s[net.index[v]]) for v in parent}
    for v in reversed(order):  # parents first
        e = (v, parent[v] if parent[v] is not None else job.ps)
        tau[v] = bits / net.resid[e]
        p = parent[v]
        dist[v] = tau[v] + (dist[p] if p is not None else 0.0)
        delay_to_ps[v] = hop[v] + net.delay[e] + (delay_to_ps[p] if p is not None else 0.0)
    raw: dict[str, int] = {}
    for v in order:
        raw[v] = len(direct[v]) + sum(raw[c] for c in children[v])
    tau_worker = {w: bits / net.resid[(w, net.attach[w])] for w in job.workers}
    worker_delay = {
        w: net.delay[(w, net.attach[w])] + delay_to_ps[net.attach[w]] for w in job.workers
    }
    return JobTree(
        job=job,
        root=root,
        parent=parent,
        order=order,
        children=children,
        direct=direct,
        raw=raw,
        tau=tau,
        dist=dist,
        tau_worker=tau_worker,
        delay_to_ps=delay_to_ps,
        worker_delay=worker_delay,
        hop=hop,
        programmable={v: bool(net.programmable[net.index[v]]) for v in parent},
        worker_tor={w: net.attach[w] for w in job.workers},
    )


def build_trees(net: Network, jobs: list[Job]) -> dict[str, JobTree]:
    """Hop-count trees, one ECMP choice per job (INT-aware trees: `Context.int_trees`)."""
    out = {}
    for j in jobs:
        root = net.attach[j.ps]
        out[j.id] = build_tree(net, j, net.next_hops([root], int_aware=False, salt=j.id)[root])
    return out


@dataclass
class TreeCost:
    streams: dict[str, int]  # streams leaving each switch upwards
    surrogate: float  # seconds, unweighted
    bottleneck: float
    cct: float


def evaluate(tree: JobTree, aggs: set[str]) -> TreeCost:
    """Exact surrogate and bottleneck CCT of aggregating at `aggs` on `tree`."""
    streams: dict[str, int] = {}
    total = sum(tree.tau_worker.values())
    bottleneck = max(tree.tau_worker.values())
    for v in tree.order:
        n_in = len(tree.direct[v]) + sum(streams[c] for c in tree.children[v])
        out = 1 if v in aggs else n_in
        streams[v] = out
        t = out * tree.tau[v]
        total += t
        bottleneck = max(bottleneck, t)
    total += sum(tree.hop[a] for a in aggs)
    cct = bottleneck + max(tree.worker_delay.values())
    return TreeCost(streams=streams, surrogate=total, bottleneck=bottleneck, cct=cct)


def floor_cct(net: Network, job: Job) -> float:
    """The job's network bound under this model: its slowest worker uplink or its PS's
    downlink, each carrying one stream, as if the fabric between were infinite and summed
    for free (the bound `evaluate` in the simulator calls "floor"). Every worker sends its
    whole update over its own uplink and the PS receives at least one whole sum over its
    downlink, on every route and placement: no predicted CCT of the job (`evaluate`'s,
    isolated or shared) is lower; they add the path latency on top."""
    return floor_ccts(net, [job])[0]


def floor_ccts(net: Network, jobs: Sequence[Job]) -> list[float]:
    """`floor_cct` of every job, the host links read in two array lookups
    (`Network.host_values`): 10,000 jobs at k=64 took 0.83 s of CPU one by one."""
    up = net.host_values("resid", [w for j in jobs for w in j.workers], up=True)
    down = net.host_values("resid", [j.ps for j in jobs], up=False)
    out, k = [], 0
    for i, job in enumerate(jobs):
        n = len(job.workers)
        # max over links of bits / r is bits / min r (division keeps the order)
        out.append(8.0 * job.update_bytes / min(float(up[k : k + n].min()), float(down[i])))
        k += n
    return out


def cct_of(
    net: Network, job: Job, worker_paths: Mapping[str, list[str]], aggs: set[str]
) -> float | None:
    """Predicted CCT (`evaluate`) of a given placement (its paths and aggregators) on
    `net`'s link state, or None when it does not fit the network any more (a path leaves the
    fabric or the paths do not form one tree towards the PS's switch)."""
    root = net.attach.get(job.ps)
    if root is None:
        return None
    pred = np.full(len(net.switch_ids), -1, dtype=np.int64)
    for w in job.workers:
        path = worker_paths.get(w)
        if not path or path[0] != w or path[-1] != job.ps or net.attach.get(w) != path[1]:
            return None
        switches = path[1:-1]
        if switches[-1] != root:
            return None
        for u, v in itertools.pairwise(switches):
            if u not in net.sw_index or v not in net.sw_index or (u, v) not in net.resid:
                return None
            i, j = net.sw_index[u], net.sw_index[v]
            if pred[i] not in (-1, j):
                return None
            pred[i] = j
    tree = build_tree(net, job, pred)
    return evaluate(tree, {a for a in aggs if a in tree.parent}).cct
