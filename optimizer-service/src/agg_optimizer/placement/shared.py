"""Predicted CCT with every placed job sharing the fabric.

`trees.evaluate`'s CCT judges a job alone: its slowest link, shared only among its own
unsummed streams. On a fabric where several jobs cross the same links that was 40-60% of
what max-min sharing between them gives. Here one communication round of every job starts
at once, on the links' residual capacity after the measured background (`Network.resid`,
the capacities AGG itself plans with), and the simulator's fluid core (`sim.core`, the
model `sim.training` runs: a job's streams grouped into components that move at one rate,
max-min fair shares between them) gives each job the time its last component finishes.
The job's path latency (`JobTree.worker_delay`) is added as in the isolated figure."""

from __future__ import annotations

from typing import Any

import numpy as np

from agg_optimizer.model.documents import Instance, JobPlacement
from agg_optimizer.model.network import Network
from agg_optimizer.sim.core import AGGREGATION, Flow, Simulator
from agg_optimizer.sim.fabric import Fabric
from agg_optimizer.sim.training import components

# Up to this many jobs every round is simulated to its end (each completion re-shares the
# links). Above it no shared figure is computed (`Placement.cct_model` says "isolated"):
# the simulation of 1000 jobs on a k=32 fat-tree took 20 s, and reading times off the fair
# shares at the start alone still tripled that solve's 0.7 s.
EXACT_MAX_JOBS = 64
# Up to this many jobs the fair shares are filled with numpy: cheaper than loading numba.
NUMPY_MAX_JOBS = 16


def shared_ccts(
    inst: Instance, placed: list[JobPlacement], net: Network | None = None
) -> dict[str, float] | None:
    """Seconds until each job's round completes with all of `placed` sharing the fabric
    (transfer only; the caller adds latency); None above EXACT_MAX_JOBS jobs."""
    if len(placed) > EXACT_MAX_JOBS:
        return None
    fabric = Fabric.from_topology(inst.topology)
    net = net if net is not None else Network.from_instance(inst)
    fabric.capacity = np.array([net.resid[e] for e in fabric.links], dtype=np.float64)
    jobs = {j.id: j for j in inst.jobs}
    rounds = []
    for jp in placed:
        job = jobs[jp.job_id]
        held = {a.switch for a in jp.aggregators}
        rounds.append((jp.job_id, float(job.update_bytes), job_flows(fabric, jp, held, job.ps)))
    return round_ends(fabric, rounds, compiled=len(placed) > NUMPY_MAX_JOBS)


Flows = list[tuple[np.ndarray, np.ndarray]]


def job_flows(fabric: Fabric, placed: JobPlacement | Any, held: set[str], ps: str) -> Flows:
    """A job's streams as the simulator's flows: one per component (`components`: the
    streams that move at one rate), its links and how many of the job's streams cross each.
    `placed` needs only `worker_paths`."""
    out = []
    for segs in components(placed, held, ps):
        idx = np.concatenate([fabric.path_links(p) for p in segs])
        links, mult = np.unique(idx, return_counts=True)
        out.append((links, mult.astype(float)))
    return out


def round_ends(
    fabric: Fabric, rounds: list[tuple[str, float, Flows]], *, compiled: bool, width: int = 8
) -> dict[str, float]:
    """One round of every job at once, (job id, bytes, `job_flows`) each, on `fabric`'s
    capacities: the time each job's last component finishes. `width`: links of the longest
    flow, when known (`Simulator`)."""
    sim = Simulator(fabric, compiled=compiled, width=width)
    left: dict[str, int] = {}
    done: dict[str, float] = {}

    def finished(jid: str) -> None:
        left[jid] -= 1
        if not left[jid]:
            done[jid] = sim.t

    for jid, size, flows in rounds:
        for links, mult in flows:
            left[jid] = left.get(jid, 0) + 1
            sim.add(Flow(links, mult, size, AGGREGATION, on_done=lambda _f, j=jid: finished(j)))
    sim.run()
    return done
