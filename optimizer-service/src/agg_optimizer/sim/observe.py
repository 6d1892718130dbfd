"""INT as the strategies see it: per-link utilisation, queue and latency sampled from the
simulator every `period_s`, averaged over `window_s`, and delivered `staleness_s` late.

The simulator is a fluid model and has no queues; the queue a link would hold is estimated
from its utilisation as an M/M/1 queue in packets, `pkt * u / (1 - u)`, capped by the
buffer. That is what an INT queue-occupancy field would show on average.

All traffic is reported, except the classes a caller excludes: when a strategy re-places a
job, the job's own gradient streams are left out (a collector can tell them apart by the
aggregation protocol's UDP port and job id, and a job's own streams are not congestion it
should route around), while other jobs' streams count like any other load.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import numpy as np

from agg_optimizer.model.documents import LinkTelemetry, Telemetry
from agg_optimizer.sim.core import Simulator

PACKET_BYTES = 1500
BUFFER_BYTES = 1_000_000
LINK_LATENCY_US = 2.0
MAX_UTIL_FOR_QUEUE = 0.98


class IntObserver:
    def __init__(
        self,
        sim: Simulator,
        *,
        period_s: float = 0.01,
        window_s: float = 0.05,
        staleness_s: float = 0.0,
    ) -> None:
        if period_s <= 0 or window_s < period_s:
            raise ValueError("int: need period_s > 0 and window_s >= period_s")
        self.sim = sim
        self.period, self.window, self.staleness = period_s, window_s, staleness_s
        keep = int(np.ceil((window_s + staleness_s) / period_s)) + 3
        self.samples: deque[tuple[float, np.ndarray, np.ndarray]] = deque(maxlen=keep)

    def start(self) -> None:
        self._sample()

    def _sample(self) -> None:
        self.samples.append((self.sim.t, self.sim.link_bytes.copy(), self.sim.stream_counts()))
        self.sim.after(self.period, self._sample)

    def _window(self) -> tuple[tuple, tuple] | None:
        """The samples that bound the window ending `staleness_s` ago."""
        t_obs = self.sim.t - self.staleness
        newest = None
        for i in range(len(self.samples) - 1, -1, -1):
            if self.samples[i][0] <= t_obs + 1e-12:
                newest = i
                break
        if newest is None or newest == 0:
            return None
        t1 = self.samples[newest][0]
        oldest = newest
        while oldest > 0 and t1 - self.samples[oldest - 1][0] <= self.window + 1e-12:
            oldest -= 1
        if oldest == newest:
            oldest = newest - 1
        return self.samples[oldest], self.samples[newest]

    def _keep(self, exclude: Iterable[int]) -> np.ndarray:
        keep = np.ones(self.sim.link_bytes.shape[0], dtype=bool)
        keep[list(exclude)] = False
        return keep

    def utilisation(self, exclude: Iterable[int] = ()) -> np.ndarray:
        """Per directed link, what INT shows now: the average over the window that ended
        `staleness_s` ago (zeros before two samples exist), classes in `exclude` left out."""
        w = self._window()
        if w is None:
            return np.zeros(self.sim.fabric.n_links)
        (t0, b0, _), (t1, b1, _) = w
        keep = self._keep(exclude)
        moved = (b1[keep] - b0[keep]).sum(axis=0)
        util = moved * 8.0 / (self.sim.capacity * (t1 - t0))
        return np.clip(util, 0.0, 1.0)

    def flows(self, exclude: Iterable[int] = ()) -> np.ndarray:
        """Per directed link, the streams crossing it, averaged over the same window."""
        w = self._window()
        if w is None:
            return np.zeros(self.sim.fabric.n_links)
        first, last = w
        keep = self._keep(exclude)
        inside = [s for s in self.samples if first[0] < s[0] <= last[0]]
        return np.mean([s[2][keep].sum(axis=0) for s in inside], axis=0)

    def telemetry(self, exclude: Iterable[int] = (), *, flow_counts: bool = True) -> Telemetry:
        """The INT snapshot a strategy gets; `flow_counts=False` leaves out the per-link flow
        counts (utilisation, queue and latency only)."""
        util = self.utilisation(exclude)
        n = self.flows(exclude) if flow_counts else None
        u = np.minimum(util, MAX_UTIL_FOR_QUEUE)
        queue = np.minimum(PACKET_BYTES * u / (1.0 - u), BUFFER_BYTES)
        links = [
            LinkTelemetry(
                src=s,
                dst=d,
                utilization=round(float(util[i]), 4),
                queue_bytes=round(float(queue[i]), 1),
                latency_us=LINK_LATENCY_US,
                flows=None if n is None else round(float(n[i]), 2),
            )
            for i, (s, d) in enumerate(self.sim.fabric.links)
        ]
        return Telemetry(links=links)
