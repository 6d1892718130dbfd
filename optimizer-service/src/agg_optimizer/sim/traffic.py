"""Background traffic: Poisson flow arrivals with heavy-tailed sizes, and hotspots that move.

Offered load is a fraction of every host's access-link capacity: each host starts flows to
uniformly chosen other hosts at rate  load * c / E[size],  so on a non-blocking fabric the
average link carries about `load` of its capacity, unevenly and changing over time. Flow
sizes follow a bounded Pareto law (heavy tail: most bytes are in the few largest flows).
Mice (flows of kilobytes) carry a negligible share of bytes and are left out: they do not
change how bandwidth is shared, only how many events there are.

A hotspot is a set of long-lived flows from random hosts into one rack; every
`period_s` it moves to another rack, so the congested links change while jobs run.
"""

from __future__ import annotations

import math

import numpy as np

from agg_optimizer.sim.core import BACKGROUND, Flow, Simulator
from agg_optimizer.sim.fabric import Fabric


def bounded_pareto_mean(alpha: float, lo: float, hi: float) -> float:
    """Mean of the Pareto law with shape `alpha` truncated to [lo, hi]."""
    if math.isclose(alpha, 1.0):
        return lo * hi / (hi - lo) * math.log(hi / lo)
    norm = lo**alpha / (1.0 - (lo / hi) ** alpha)
    return norm * alpha / (alpha - 1.0) * (lo ** (1.0 - alpha) - hi ** (1.0 - alpha))


def bounded_pareto(
    rng: np.random.Generator, alpha: float, lo: float, hi: float, n: int
) -> np.ndarray:
    """Inverse-CDF draws of the Pareto law with shape `alpha` truncated to [lo, hi]."""
    u = rng.random(n)
    ratio = (lo / hi) ** alpha
    return lo / (1.0 - u * (1.0 - ratio)) ** (1.0 / alpha)


class Background:
    """Starts and stops background flows on a simulator; every draw comes from `rng`."""

    def __init__(
        self,
        sim: Simulator,
        rng: np.random.Generator,
        *,
        load: float,
        size_alpha: float,
        size_min_bytes: float,
        size_max_bytes: float,
        hotspots: int = 0,
        hotspot_flows: int = 4,
        hotspot_period_s: float = 1.0,
        host_gbps: float | None = None,
    ) -> None:
        self.sim = sim
        self.fabric: Fabric = sim.fabric
        self.rng = rng
        self.load = load
        self.alpha, self.lo, self.hi = size_alpha, size_min_bytes, size_max_bytes
        self.started = 0
        self.finished = 0
        self.fct_s: list[float] = []  # completion times of the finished flows
        self.bytes_started = 0.0
        hosts = self.fabric.hosts
        c = (host_gbps or self._access_gbps()) * 1e9
        mean = bounded_pareto_mean(size_alpha, size_min_bytes, size_max_bytes)
        # Aggregate arrival rate over all hosts (flows/s).
        self.rate = load * c * len(hosts) / (8.0 * mean) if load > 0 else 0.0
        self.mean_size = mean
        self.hotspots = [_Hotspot(self, hotspot_flows, hotspot_period_s) for _ in range(hotspots)]

    def _access_gbps(self) -> float:
        fab = self.fabric
        h = fab.hosts[0]
        return float(fab.capacity[fab.index[(h, fab.attach[h])]]) / 1e9

    def start(self) -> None:
        if self.rate > 0:
            self.sim.after(float(self.rng.exponential(1.0 / self.rate)), self._arrive)
        for hs in self.hotspots:
            hs.move()

    def _arrive(self) -> None:
        hosts = self.fabric.hosts
        i, j = self.rng.choice(len(hosts), size=2, replace=False)
        size = float(bounded_pareto(self.rng, self.alpha, self.lo, self.hi, 1)[0])
        self.flow(hosts[i], hosts[j], size)
        self.sim.after(float(self.rng.exponential(1.0 / self.rate)), self._arrive)

    def flow(self, src: str, dst: str, size: float) -> Flow:
        path = self.fabric.ecmp_path(src, dst, self.rng)
        links = np.array(self.fabric.path_links(path))
        self.started += 1
        if math.isfinite(size):
            self.bytes_started += size
        return self.sim.add(Flow(links, np.ones(links.size), size, BACKGROUND, on_done=self._done))

    def _done(self, flow: Flow) -> None:
        self.finished += 1
        if flow.end is not None:
            self.fct_s.append(flow.end - flow.start)


class _Hotspot:
    def __init__(self, bg: Background, n_flows: int, period_s: float) -> None:
        self.bg, self.n, self.period = bg, n_flows, period_s
        self.flows: list[Flow] = []
        self.rack: str | None = None

    def move(self) -> None:
        bg = self.bg
        for f in self.flows:
            bg.sim.remove(f)
        racks = bg.fabric.racks()
        names = sorted(racks)
        self.rack = names[int(bg.rng.integers(len(names)))]
        inside = racks[self.rack]
        outside = [h for h in bg.fabric.hosts if bg.fabric.attach[h] != self.rack]
        self.flows = []
        for _ in range(self.n):
            src = outside[int(bg.rng.integers(len(outside)))]
            dst = inside[int(bg.rng.integers(len(inside)))]
            self.flows.append(bg.flow(src, dst, math.inf))
        bg.sim.after(self.period, self.move)
