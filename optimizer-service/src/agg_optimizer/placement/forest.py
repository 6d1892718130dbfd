"""All jobs' reduction trees as flat numpy arrays, for the large instances AGG must solve fast.

A forest node is one (job, switch) pair of a job's tree. The arrays hold the same quantities
as `trees.JobTree` (tau, dist, inputs, ...) and `evaluate` computes the same surrogate as
`trees.evaluate`, level by level instead of node by node (tests check they agree).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agg_optimizer.model.arrays import unique_sorted
from agg_optimizer.model.documents import Job
from agg_optimizer.model.network import Network
from agg_optimizer.model.validation import JobNodes


@dataclass
class Forest:
    n_jobs: int
    job: np.ndarray  # job index of each node
    switch: np.ndarray  # global node index (Network.index) of each node's switch
    parent: np.ndarray  # forest index, -1 at a job's root
    levels: list[np.ndarray]  # node indices by depth, deepest first
    direct: np.ndarray  # workers attached
    n_children: np.ndarray
    only_child: np.ndarray  # the child when n_children == 1, else -1
    raw: np.ndarray
    tau: np.ndarray
    dist: np.ndarray
    hop: np.ndarray
    weight: np.ndarray  # job weight, per node
    const: np.ndarray  # per job: worker-edge stream time (does not depend on the choice)
    segment: np.ndarray  # bottom node of the node's segment, -1 if none
    # every job's workers in order: job index, forest node of its switch, per-stream time
    # of its edge
    w_job: np.ndarray
    w_node: np.ndarray
    w_tau: np.ndarray

    @property
    def inputs(self) -> np.ndarray:
        return self.direct + self.n_children

    def streams(self, agg: np.ndarray) -> np.ndarray:
        """Streams leaving each node upwards when `agg` (bool per node) sums."""
        s = np.zeros(len(self.job), dtype=np.int64)
        child_sum = np.zeros(len(self.job), dtype=np.int64)
        for lvl in self.levels:
            v = lvl
            s[v] = np.where(agg[v], 1, self.direct[v] + child_sum[v])
            p = self.parent[v]
            has = p >= 0
            np.add.at(child_sum, p[has], s[v][has])
        return s

    def job_costs(self, agg: np.ndarray) -> np.ndarray:
        """Unweighted surrogate per job (the same as `trees.evaluate(...).surrogate`)."""
        s = self.streams(agg)
        per_node = self.tau * s + np.where(agg, self.hop, 0.0)
        out = self.const.copy()
        np.add.at(out, self.job, per_node)
        return out

    def anc_dist(self, agg: np.ndarray) -> np.ndarray:
        """dist of the nearest aggregator strictly above each node (0: the PS)."""
        a = np.zeros(len(self.job))
        for lvl in reversed(self.levels):
            p = self.parent[lvl]
            has = p >= 0
            pv = p[has]
            a[lvl[has]] = np.where(agg[pv], self.dist[pv], a[pv])
        return a


def build_forest(
    net: Network,
    jobs: list[Job],
    roots: list[str],
    pred: np.ndarray,
    rows: list[int] | None = None,
    nodes: JobNodes | None = None,
) -> Forest:
    """`pred[r, s]`: next hop of switch s towards roots[r] (scipy's predecessor matrix on
    the transposed graph). Job j routes on row `rows[j]`, by default its PS switch's row.
    `nodes`: `JobNodes.of(jobs, net.index)`, when the caller has it."""
    sw_ids = net.switch_ids
    n_sw = len(sw_ids)
    to_global = np.array([net.index[s] for s in sw_ids], dtype=np.int64)
    nj = len(jobs)
    nodes = nodes if nodes is not None else JobNodes.of(jobs, net.index)
    bits = np.array([8.0 * j.update_bytes for j in jobs])
    # positions, not names: looking 90,000 workers up by name took 0.1 s at k=64
    job_root = net.host_switches(nodes.ps)
    if rows is None:
        row_of = np.full(n_sw, -1, dtype=np.int64)
        row_of[[net.sw_index[r] for r in roots]] = np.arange(len(roots))
        job_row = row_of[job_root]
        if np.any(job_row < 0):
            j = int(np.argmax(job_row < 0))
            raise KeyError(f"job {jobs[j].id!r}: its PS's switch is none of the roots")
    else:
        job_row = np.array(rows, dtype=np.int64).reshape(nj)
    root_tau = bits / net.host_values_at("resid", nodes.ps, up=False)
    w_job_a = np.repeat(np.arange(nj, dtype=np.int64), nodes.counts)
    w_tor_a = net.host_switches(nodes.workers)
    w_tau_a = bits[w_job_a] / net.host_values_at("resid", nodes.workers, up=True)
    const = np.zeros(nj)
    np.add.at(const, w_job_a, w_tau_a)

    # every (job, switch) on a worker's path, walking next hops to the root
    keys = [w_job_a * n_sw + w_tor_a]
    cur, cj = w_tor_a, w_job_a
    while True:
        live = cur != job_root[cj]
        if not live.any():
            break
        cur, cj = pred[job_row[cj[live]], cur[live]], cj[live]
        keys.append(cj * n_sw + cur)
    node_key = unique_sorted(np.concatenate(keys))
    job = node_key // n_sw
    sw = node_key % n_sw
    n = len(node_key)
    is_root = sw == job_root[job]
    par_sw = np.where(is_root, 0, pred[job_row[job], sw])
    parent = np.where(is_root, -1, np.searchsorted(node_key, job * n_sw + par_sw))

    direct = np.zeros(n, dtype=np.int64)
    w_node = np.searchsorted(node_key, w_job_a * n_sw + w_tor_a)
    np.add.at(direct, w_node, 1)
    n_children = np.zeros(n, dtype=np.int64)
    np.add.at(n_children, parent[~is_root], 1)
    only_child = np.full(n, -1, dtype=np.int64)
    kids = np.nonzero(~is_root)[0]
    only_child[parent[kids]] = kids  # correct where n_children == 1
    only_child[n_children != 1] = -1

    depth = np.zeros(n, dtype=np.int64)
    anc = parent.copy()
    while (up := anc >= 0).any():
        depth[up] += 1
        anc[up] = parent[anc[up]]
    levels = [np.nonzero(depth == d)[0] for d in range(int(depth.max()), -1, -1)] if n else []

    # per-stream time of each node's up edge: residual of (switch -> parent) or (root -> PS)
    tau = np.empty(n)
    nr = ~is_root
    tau[nr] = bits[job[nr]] / net.edge_data()[1][net.edge_index(sw[nr], par_sw[nr])]
    tau[is_root] = root_tau[job[is_root]]
    dist = np.zeros(n)
    for lvl in reversed(levels):
        pv = parent[lvl]
        dist[lvl] = tau[lvl] + np.where(pv >= 0, dist[np.where(pv >= 0, pv, 0)], 0.0)
    raw = direct.copy()
    for lvl in levels:
        pv = parent[lvl]
        has = pv >= 0
        np.add.at(raw, pv[has], raw[lvl][has])

    inputs = direct + n_children
    segment = np.full(n, -1, dtype=np.int64)
    for lvl in levels:
        bottom = inputs[lvl] >= 2
        segment[lvl[bottom]] = lvl[bottom]
        chain = lvl[(inputs[lvl] == 1) & (n_children[lvl] == 1)]
        segment[chain] = segment[only_child[chain]]

    gidx = to_global[sw]
    return Forest(
        n_jobs=nj,
        job=job,
        switch=gidx,
        parent=parent,
        levels=levels,
        direct=direct,
        n_children=n_children,
        only_child=only_child,
        raw=raw,
        tau=tau,
        dist=dist,
        hop=net.hop_s[gidx],
        weight=np.array([j.weight for j in jobs])[job],
        const=const,
        segment=segment,
        w_job=w_job_a,
        w_node=w_node,
        w_tau=w_tau_a,
    )
