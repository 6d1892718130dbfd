"""The placement document's per-job part from the forest's arrays, for instances above
`shared.EXACT_MAX_JOBS` jobs placed on the INT trees.

`engine.build_placement` describes each job from its `trees.JobTree`; building those
dicts for 10,000 jobs (k=64) took 3.8 s, and evaluating them 0.6 s more. This gives the same
document from `Context.forest`: the same aggregators in the same order (the tree's
children-before-parents order, `trees.build_tree`), children, next hops, pools, paths and
CCTs. The surrogate is summed in another order, so it can differ from `trees.evaluate`'s
in the last bits (`tests/optimizer/test_placement_digest.py` compares both documents).
"""

from __future__ import annotations

import numpy as np

from agg_optimizer.model.documents import Aggregator, JobPlacement
from agg_optimizer.model.pools import PoolAllocator
from agg_optimizer.placement.context import Context


def job_placements(
    ctx: Context, aggs: dict[str, set[str]], pools: PoolAllocator
) -> tuple[list[JobPlacement], list[float]]:
    """Every job's placement and its unweighted surrogate, in the jobs' order."""
    f, net, jobs = ctx.forest, ctx.net, ctx.jobs
    n = len(f.job)
    n_sw = len(net.switch_ids)
    sw_pos = np.full(len(net.ids), -1, dtype=np.int64)
    sw_pos[[net.index[s] for s in net.switch_ids]] = np.arange(n_sw)
    node_key = f.job * n_sw + sw_pos[f.switch]  # ascending: forest nodes are sorted so
    pick_j, pick_s = [], []
    for j, job in enumerate(jobs):
        for s in aggs.get(job.id, ()):
            pick_j.append(j)
            pick_s.append(net.sw_index[s])
    chosen = np.zeros(n, dtype=bool)
    if pick_j:
        key = np.array(pick_j, dtype=np.int64) * n_sw + np.array(pick_s, dtype=np.int64)
        at = np.searchsorted(node_key, key)
        if np.any(at >= n) or np.any(node_key[np.minimum(at, n - 1)] != key):
            raise ValueError("aggs: an aggregator off its job's tree")
        chosen[at] = True

    # CCT (network.evaluate): the slowest edge of the tree plus the longest path delay
    streams = f.streams(chosen)
    surrogate = f.job_costs(chosen)
    bottleneck = np.full(len(jobs), -np.inf)
    np.maximum.at(bottleneck, f.w_job, f.w_tau)
    np.maximum.at(bottleneck, f.job, streams * f.tau)
    is_root = f.parent < 0
    up_delay = np.empty(n)
    nr = np.nonzero(~is_root)[0]
    edge = net.edge_index(sw_pos[f.switch[nr]], sw_pos[f.switch[f.parent[nr]]])
    up_delay[nr] = net.edge_data()[2][edge]
    roots = np.nonzero(is_root)[0]
    # a root is its job's PS switch (build_forest): its link down to the PS
    root_ps = [jobs[j].ps for j in f.job[roots].tolist()]
    up_delay[roots] = net.host_values("delay", root_ps, up=False)
    to_ps = np.zeros(n)
    for lvl in reversed(f.levels):  # parents first, summed as build_tree sums them
        pv = f.parent[lvl]
        above = np.where(pv >= 0, to_ps[np.maximum(pv, 0)], 0.0)
        to_ps[lvl] = f.hop[lvl] + up_delay[lvl] + above
    workers = [w for job in jobs for w in job.workers]
    w_delay = net.host_values("delay", workers, up=True) + to_ps[f.w_node]
    worst_delay = np.full(len(jobs), -np.inf)
    np.maximum.at(worst_delay, f.w_job, w_delay)
    cct = (bottleneck + worst_delay).tolist()

    # the nearest aggregator at or above each node (-1: the PS), and each node's first
    # worker (the tree's children are in the order their first worker reached them)
    absorb = np.full(n, -1, dtype=np.int64)
    for lvl in reversed(f.levels):
        pv = f.parent[lvl]
        above = np.where(pv >= 0, absorb[np.maximum(pv, 0)], -1)
        absorb[lvl] = np.where(chosen[lvl], lvl, above)
    first = np.zeros(len(jobs) + 1, dtype=np.int64)
    np.cumsum(np.bincount(f.w_job, minlength=len(jobs)), out=first[1:])
    w_rank = np.arange(len(workers)) - first[f.w_job]
    first_w = np.full(n, np.iinfo(np.int64).max)
    np.minimum.at(first_w, f.w_node, w_rank)
    for lvl in f.levels:  # deepest first
        pv = f.parent[lvl]
        has = pv >= 0
        np.minimum.at(first_w, pv[has], first_w[lvl[has]])

    name = [net.ids[g] for g in f.switch.tolist()]
    parent = f.parent.tolist()
    path: list[tuple[str, ...]] = [()] * n
    for lvl in reversed(f.levels):
        for v in lvl.tolist():
            p = parent[v]
            path[v] = (name[v], *path[p]) if p >= 0 else (name[v],)
    w_node = f.w_node.tolist()
    w_absorb = absorb[f.w_node].tolist()
    agg_nodes = np.nonzero(chosen)[0]
    by_job: dict[int, list[int]] = {}
    for v, j in zip(agg_nodes.tolist(), f.job[agg_nodes].tolist(), strict=True):
        by_job.setdefault(j, []).append(v)
    next_of = {v: absorb[parent[v]] if parent[v] >= 0 else -1 for v in agg_nodes.tolist()}
    fw = first_w.tolist()

    def tree_order(v: int) -> tuple[int, ...]:
        """Sorts a job's nodes children before parents, siblings by first worker."""
        key = [len(workers) + 1]
        while v >= 0:
            key.append(fw[v])
            v = parent[v]
        key.pop()  # the root's: the same for every node of the job
        return tuple(reversed(key))

    out: list[JobPlacement] = []
    for j, job in enumerate(jobs):
        lo = int(first[j])
        children: dict[int, list[str]] = {}
        for i, w in enumerate(job.workers):
            children.setdefault(w_absorb[lo + i], []).append(w)
        mine = by_job.get(j, [])
        for a in sorted(mine, key=lambda v: name[v]):
            children.setdefault(next_of[a], []).append(name[a])
        placed = []
        for a in sorted(mine, key=tree_order) if len(mine) > 1 else mine:
            nxt = next_of[a]
            kids = children.get(a, [])
            if not kids:
                raise ValueError(f"aggs: {name[a]!r} sums nothing of job {job.id!r}")
            # model_construct: values this function built, of the fields' types (checked by
            # tests/optimizer/test_placement_digest.py); validating 28,000 of them took 0.5 s
            placed.append(
                Aggregator.model_construct(
                    switch=name[a],
                    children=kids,
                    fan_in=len(kids),
                    next_hop=job.ps if nxt < 0 else name[nxt],
                    pool=pools.take(name[a], job.pool_slots),
                )
            )
        out.append(
            JobPlacement.model_construct(
                job_id=job.id,
                aggregators=placed,
                worker_paths={
                    w: [w, *path[w_node[lo + i]], job.ps] for i, w in enumerate(job.workers)
                },
                ps_fan_in=len(children.get(-1, [])),
                predicted_cct_s=cct[j],
                surrogate_s=float(surrogate[j]),
            )
        )
    return out, surrogate.tolist()
