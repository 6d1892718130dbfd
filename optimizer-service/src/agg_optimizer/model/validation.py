"""Whole-document checks of an instance. Every error names the field it is about."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain, pairwise
from operator import attrgetter
from typing import TYPE_CHECKING

from pydantic import ValidationError

from agg_optimizer.model.arrays import has_duplicates, index_pairs
from agg_optimizer.model.documents import Instance, Job, Topology

if TYPE_CHECKING:
    import numpy as np


class InstanceError(ValueError):
    """Bad input. `field` is a path such as `jobs[2].workers[0]`."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def __reduce__(self) -> tuple:  # picklable: raised in `evaluate --processes` workers too
        return (type(self), (self.field, self.message))


@dataclass(frozen=True)
class Checked:
    """What `check_instance` worked out that compiling the network needs again
    (`Network.from_instance`): each node's position (topology order), and each link's and
    each telemetry entry's ends as positions. Reading the ends of a k=64 fat-tree's 196,608
    links and 393,216 telemetry entries took 0.3 s, once here and once there."""

    index: dict[str, int]
    ends: np.ndarray
    telemetry_ends: np.ndarray | None  # None: not computed (a bad entry made the check slow)
    # Each job's PS, and every job's workers in order, as positions (None: not computed);
    # the engine's routing and forest read them instead of looking 90,000 names up again.
    jobs: JobNodes | None = None


@dataclass
class JobNodes:
    ps: np.ndarray  # per job
    workers: np.ndarray  # every job's workers, job after job
    counts: np.ndarray  # workers per job

    @classmethod
    def of(cls, jobs: list[Job], index: dict[str, int]) -> JobNodes:
        """Each job's PS and every job's workers as positions in `index`; KeyError for a
        name it lacks."""
        import numpy as np

        workers = list(map(_WORKERS, jobs))
        counts = np.fromiter(map(len, workers), np.int64, len(jobs))
        get = index.__getitem__
        ps = np.fromiter(map(get, map(_PS, jobs)), np.int64, len(jobs))
        w = np.fromiter(map(get, chain.from_iterable(workers)), np.int64, int(counts.sum()))
        return cls(ps, w, counts)


def describe_validation_error(err: ValidationError) -> str:
    """One line per problem, `field.path: message`, from a pydantic error."""
    lines = []
    for e in err.errors():
        loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e["loc"]).lstrip(".")
        lines.append(f"{loc or '(document)'}: {e['msg']}")
    return "; ".join(lines)


def _check_links(
    topo: Topology, kinds: dict[str, str]
) -> tuple[set[frozenset[str]], dict[str, int]]:
    """The links one by one: raises for the first bad one; the links as unordered pairs and
    each node's degree otherwise."""
    edges: set[frozenset[str]] = set()
    degree = dict.fromkeys(kinds, 0)
    for i, ln in enumerate(topo.links):
        for end in ("src", "dst"):
            nid = getattr(ln, end)
            if nid not in kinds:
                raise InstanceError(f"topology.links[{i}].{end}", f"unknown node {nid!r}")
        if ln.src == ln.dst:
            raise InstanceError(f"topology.links[{i}]", f"self-loop on {ln.src!r}")
        if kinds[ln.src] == "host" and kinds[ln.dst] == "host":
            raise InstanceError(f"topology.links[{i}]", "a link between two hosts")
        edge = frozenset((ln.src, ln.dst))
        if edge in edges:
            raise InstanceError(f"topology.links[{i}]", f"duplicate link {ln.src}-{ln.dst}")
        edges.add(edge)
        degree[ln.src] += 1
        degree[ln.dst] += 1
    return edges, degree


def _pair_keys(a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
    import numpy as np

    return np.minimum(a, b) * n + np.maximum(a, b)


def _links_look_valid(
    topo: Topology, index: dict[str, int], is_host: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """What `_check_links` checks, as arrays: the links' ends, their unordered pairs (sorted
    keys) and every node's degree when no link is bad, else None."""
    import numpy as np

    try:
        ends = index_pairs(topo.links, index)
    except KeyError:
        return None
    n = len(index)
    keys = np.sort(_pair_keys(ends[:, 0], ends[:, 1], n))
    if (
        np.any(ends[:, 0] == ends[:, 1])
        or np.any(is_host[ends[:, 0]] & is_host[ends[:, 1]])
        or np.any(keys[1:] == keys[:-1])
    ):
        return None
    return ends, keys, np.bincount(ends.ravel(), minlength=n)


def _telemetry_looks_valid(
    inst: Instance, index: dict[str, int], link_keys: np.ndarray
) -> np.ndarray | None:
    """The telemetry's ends as positions when every direction is on a link (`link_keys`:
    `_links_look_valid`'s), else None."""
    import numpy as np

    tl = inst.telemetry.links

    try:
        ends = index_pairs(tl, index)
    except KeyError:
        return None
    keys = _pair_keys(ends[:, 0], ends[:, 1], len(index))
    at = np.minimum(np.searchsorted(link_keys, keys), max(len(link_keys) - 1, 0))
    ok = len(keys) == 0 or (len(link_keys) > 0 and bool(np.all(link_keys[at] == keys)))
    return ends if ok else None


def _check_unique_directions(
    inst: Instance, index: dict[str, int], t_ends: np.ndarray | None
) -> None:
    """At most one telemetry record a link direction: two would be two measurements with
    nothing to say which holds, so neither is picked silently."""
    import numpy as np

    tl = inst.telemetry.links
    if t_ends is not None:  # as arrays first; the loop below only names the duplicate
        keys = t_ends[:, 0].astype(np.int64) * len(index) + t_ends[:, 1]  # directed
        if len(np.unique(keys)) == len(keys):
            return
    seen: dict[tuple[str, str], int] = {}
    for i, lt in enumerate(tl):
        j = seen.setdefault((lt.src, lt.dst), i)
        if j != i:
            raise InstanceError(
                f"telemetry.links[{i}]",
                f"a second record of {lt.src}->{lt.dst} (telemetry.links[{j}] has it)",
            )


def check_instance(inst: Instance) -> Checked:
    """Raise `InstanceError` for the first structural problem found; else what the checks
    computed that `Network.from_instance` can reuse."""
    # scipy, not networkx: the solve that follows loads scipy's graph routines anyway, and
    # networkx alone added 0.18 s to every `agg-optimizer solve` (docs/benchmarks/cli.md).
    import numpy as np
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    topo = inst.topology
    kinds: dict[str, str] = {}
    for i, n in enumerate(topo.nodes):
        if n.id in kinds:
            raise InstanceError(f"topology.nodes[{i}].id", f"duplicate node id {n.id!r}")
        kinds[n.id] = n.kind
    if not any(k == "switch" for k in kinds.values()):
        raise InstanceError("topology.nodes", "no switch in the topology")
    index = {nid: k for k, nid in enumerate(kinds)}
    is_host = np.array([k == "host" for k in kinds.values()], dtype=bool)
    # The links and the telemetry checked as arrays first (a k=64 fat-tree has 196,608 links
    # and twice that telemetry, and the loops below took a second); the loops run only to
    # name the first problem when the arrays show one.
    fast = _links_look_valid(topo, index, is_host)
    if fast is not None:
        ends, link_keys, degrees = fast
        degree = dict(zip(kinds, degrees.tolist(), strict=True))
    else:
        edges, degree = _check_links(topo, kinds)
    for nid, kind in kinds.items():
        if kind == "host" and degree[nid] != 1:
            raise InstanceError(
                "topology.links", f"host {nid!r} must have exactly one link, has {degree[nid]}"
            )

    t_ends = None if fast is None else _telemetry_looks_valid(inst, index, link_keys)
    if t_ends is None:
        if fast is not None:
            edges = {frozenset((ln.src, ln.dst)) for ln in topo.links}
        for i, lt in enumerate(inst.telemetry.links):
            if frozenset((lt.src, lt.dst)) not in edges:
                raise InstanceError(f"telemetry.links[{i}]", f"no link {lt.src}->{lt.dst}")
    _check_unique_directions(inst, index, t_ends)
    for i, st in enumerate(inst.telemetry.switches):
        if kinds.get(st.switch) != "switch":
            raise InstanceError(f"telemetry.switches[{i}].switch", f"unknown switch {st.switch!r}")

    slots = {n.id: n.slots for n in topo.nodes if n.kind == "switch"}
    for sw, held in inst.reserved.items():
        if sw not in slots:
            raise InstanceError(f"reserved.{sw}", f"unknown switch {sw!r}")
        for k, p in enumerate(held):
            if p.base + p.size > slots[sw]:
                raise InstanceError(
                    f"reserved.{sw}[{k}]",
                    f"pool {p.base}..{p.base + p.size - 1} beyond the switch's {slots[sw]} slots",
                )
        # two reserved pools sharing a slot would be two jobs summing into one register
        order = sorted(range(len(held)), key=lambda k: held[k].base)
        for a, b in pairwise(order):
            if held[b].base < held[a].base + held[a].size:
                lo, hi = held[a].base, held[a].base + held[a].size - 1
                raise InstanceError(
                    f"reserved.{sw}[{b}]",
                    f"pool {held[b].base}..{held[b].base + held[b].size - 1} overlaps "
                    f"reserved.{sw}[{a}] ({lo}..{hi}): no two pools may share a slot",
                )

    if fast is None:
        ends = np.array([(index[ln.src], index[ln.dst]) for ln in topo.links], dtype=np.int64)
        ends = ends.reshape(-1, 2)
    adj = coo_matrix((np.ones(len(ends)), (ends[:, 0], ends[:, 1])), shape=(len(index),) * 2)
    labels = connected_components(adj, directed=False)[1]
    n_prog = sum(1 for n in topo.nodes if n.kind == "switch" and n.programmable)
    # The jobs as arrays first (10,000 jobs have 80,000 workers); the loops name the problem.
    job_nodes = _jobs_look_valid(inst, index, is_host, labels)
    jobs_ok = job_nodes is not None
    if not jobs_ok:
        seen_ids: set[str] = set()
        for i, job in enumerate(inst.jobs):
            if job.id in seen_ids:
                raise InstanceError(f"jobs[{i}].id", f"duplicate job id {job.id!r}")
            seen_ids.add(job.id)
    for i, job in enumerate(inst.jobs):
        f = f"jobs[{i}]"
        if not jobs_ok:
            _check_job(job, f, kinds, index, labels)
        if job.max_aggregators is not None and job.max_aggregators > n_prog:
            raise InstanceError(
                f"{f}.max_aggregators",
                f"{job.max_aggregators} exceeds the {n_prog} programmable switches in the network",
            )
    job_ids = {j.id for j in inst.jobs}
    for jid, switches in inst.current.items():
        if jid not in job_ids:
            raise InstanceError(f"current.{jid}", "unknown job id")
        for s in switches:
            if kinds.get(s) != "switch":
                raise InstanceError(f"current.{jid}", f"unknown switch {s!r}")
    return Checked(index, ends, t_ends, job_nodes)


def _jobs_look_valid(
    inst: Instance, index: dict[str, int], is_host: np.ndarray, labels: np.ndarray
) -> JobNodes | None:
    """What `_check_job` checks, for every job at once, plus unique job ids: the jobs' nodes
    when they pass, None when the loops must name a problem."""
    import numpy as np

    jobs = inst.jobs
    if len({j.id for j in jobs}) != len(jobs):
        return None
    try:
        nodes = JobNodes.of(jobs, index)
    except KeyError:
        return None
    ps, w, counts = nodes.ps, nodes.workers, nodes.counts
    wps = np.repeat(ps, counts)
    pair = np.repeat(np.arange(len(jobs), dtype=np.int64), counts) * len(index) + w
    ok = (
        is_host[ps].all()
        and is_host[w].all()
        and not np.any(w == wps)
        and np.array_equal(labels[w], labels[wps])
        and not has_duplicates(pair)
    )
    return nodes if ok else None


def _check_job(
    job: Job, f: str, kinds: dict[str, str], index: dict[str, int], labels: np.ndarray
) -> None:
    """One job's parameter server and workers: raises for the first problem."""
    if job.ps not in kinds:
        raise InstanceError(f"{f}.ps", f"unknown node {job.ps!r}")
    if kinds[job.ps] != "host":
        raise InstanceError(f"{f}.ps", f"{job.ps!r} is a switch, not a host")
    seen: set[str] = set()
    for k, w in enumerate(job.workers):
        wf = f"{f}.workers[{k}]"
        if w not in kinds:
            raise InstanceError(wf, f"unknown node {w!r}")
        if kinds[w] != "host":
            raise InstanceError(wf, f"{w!r} is a switch, not a host")
        if w == job.ps:
            raise InstanceError(wf, f"{w!r} is also the job's parameter server")
        if w in seen:
            raise InstanceError(wf, f"worker {w!r} listed twice")
        seen.add(w)
        if labels[index[w]] != labels[index[job.ps]]:
            raise InstanceError(f"{f}.ps", f"parameter server unreachable from worker {w!r}")


_PS = attrgetter("ps")
_WORKERS = attrgetter("workers")
