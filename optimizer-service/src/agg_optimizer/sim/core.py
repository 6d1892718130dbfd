"""Event-driven flow-level simulation: flows share links max-min fairly, rates are recomputed
at every flow arrival and completion, and time jumps from event to event.

Bytes are counted per link and per traffic class, so the INT observer can report classes apart
the way a collector can (INT reports carry the 5-tuple, and the aggregation protocol has its
own UDP port and a job id): class 0 is background; a job's gradient streams use a class of
their own (1 + the job's index), or AGGREGATION when nobody needs them apart.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from agg_optimizer.sim.fabric import Fabric
from agg_optimizer.sim.fairshare import fill, fill_by_priority, fill_numpy

BACKGROUND, AGGREGATION = 0, 1
# A flow is done when less than this many bytes are left (floating-point slack).
DONE_BYTES = 1e-3


@dataclass
class Flow:
    """Something that moves at one rate: `size_bytes` cross each link `mult` times."""

    links: np.ndarray  # directed link indices (unique)
    mult: np.ndarray  # streams of this flow on each of those links
    size_bytes: float  # math.inf: runs until removed
    cls: int = BACKGROUND
    # Strict priority: higher levels are served first, lower ones share what is left
    # (switches' priority queues); equal levels share max-min fairly.
    priority: int = 0
    on_done: Callable[[Flow], None] | None = None
    id: int = -1
    start: float = 0.0
    end: float | None = None
    _slot: int = -1  # row in the simulator's arrays while the flow is alive


class Simulator:
    def __init__(
        self, fabric: Fabric, n_classes: int = 2, *, compiled: bool = True, width: int = 8
    ) -> None:
        """`compiled=False`: fair shares without numba (`fairshare.fill_numpy`), for a caller
        that solves a few times and should not pay numba's import and load. `width`: links
        of the longest flow to come, when known (wider flows widen the tables as they come)."""
        self.fabric = fabric
        self._fill = fill if compiled else fill_numpy
        self.t = 0.0
        self.capacity = np.ascontiguousarray(fabric.capacity, dtype=np.float64)
        n = 64
        self._rem = np.zeros(n)
        self._rate = np.zeros(n)
        self._alive = np.zeros(n, dtype=bool)
        self._flows: list[Flow | None] = [None] * n
        self._width = np.zeros(n, dtype=np.int64)
        self._links = np.zeros((n, width), dtype=np.int64)
        self._mult = np.zeros((n, width))
        self._cls = np.zeros(n, dtype=np.int64)
        self._prio = np.zeros(n, dtype=np.int64)
        self._free = list(range(n - 1, -1, -1))
        self._dirty = True
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._ids = itertools.count()
        self.link_bytes = np.zeros((n_classes, fabric.n_links))  # cumulative, per class
        self.link_rate = np.zeros((n_classes, fabric.n_links))  # bit/s now, per class
        self.rate_solves = 0
        self.events_run = 0
        # Called with (self, dt) before every advance: rates are constant over dt (analysis).
        self.probe: Callable[[Simulator, float], None] | None = None

    # -- flows ------------------------------------------------------------------------------

    def add(self, flow: Flow) -> Flow:
        if flow.links.size == 0:
            raise ValueError("flow.links: a flow must cross at least one link")
        if not 0 <= flow.cls < self.link_rate.shape[0]:
            raise ValueError(f"flow.cls: {flow.cls} is not a class of this simulator")
        if not self._free:
            self._grow()
        slot = self._free.pop()
        flow.id = next(self._ids)
        flow.start = self.t
        self._flows[slot] = flow
        self._rem[slot] = flow.size_bytes
        self._rate[slot] = 0.0
        self._alive[slot] = True
        w = flow.links.size
        if w > self._links.shape[1]:
            extra = w - self._links.shape[1]
            self._links = np.pad(self._links, ((0, 0), (0, extra)))
            self._mult = np.pad(self._mult, ((0, 0), (0, extra)))
        self._width[slot] = w
        self._links[slot, :w] = flow.links
        self._mult[slot, :w] = flow.mult
        self._mult[slot, w:] = 0.0
        self._cls[slot] = flow.cls
        self._prio[slot] = flow.priority
        flow._slot = slot
        self._dirty = True
        return flow

    def remove(self, flow: Flow) -> None:
        """Take a flow out before it is done (a moving hotspot, a cancelled transfer)."""
        slot = flow._slot
        if self._flows[slot] is flow:
            self._release(slot)

    def set_priority(self, flow: Flow, priority: int) -> None:
        """Move a running flow to another priority level (a scheduler re-ordering)."""
        flow.priority = priority
        slot = flow._slot
        if self._flows[slot] is flow and self._prio[slot] != priority:
            # events run after the simulator advanced to now: bytes so far moved at the
            # old rates, from here the new ones
            self._prio[slot] = priority
            self._dirty = True

    def remaining(self, flow: Flow) -> float:
        slot = flow._slot
        return float(self._rem[slot]) if self._flows[slot] is flow else 0.0

    def rate(self, flow: Flow) -> float:
        slot = flow._slot
        if self._dirty:
            self._solve()
        return float(self._rate[slot]) if self._flows[slot] is flow else 0.0

    def alive(self) -> list[tuple[int, float, np.ndarray, np.ndarray]]:
        """(class, rate in bit/s, links, streams per link) of every flow moving now."""
        return [
            (
                int(self._cls[i]),
                float(self._rate[i]),
                self._links[i, : self._width[i]],
                self._mult[i, : self._width[i]],
            )
            for i in np.flatnonzero(self._alive)
        ]

    def stream_counts(self) -> np.ndarray:
        """Streams crossing each link now, per class (a component counts each of its
        streams): what INT per-flow reports let a collector count."""
        counts = np.zeros_like(self.link_rate)
        rows = np.flatnonzero(self._alive)
        if rows.size:
            cls = np.broadcast_to(self._cls[rows][:, None], self._links[rows].shape)
            np.add.at(counts, (cls, self._links[rows]), self._mult[rows])
        return counts

    @property
    def n_flows(self) -> int:
        return int(self._alive.sum())

    def _grow(self) -> None:
        n = len(self._flows)
        self._rem = np.concatenate([self._rem, np.zeros(n)])
        self._rate = np.concatenate([self._rate, np.zeros(n)])
        self._alive = np.concatenate([self._alive, np.zeros(n, dtype=bool)])
        self._width = np.concatenate([self._width, np.zeros(n, dtype=np.int64)])
        self._cls = np.concatenate([self._cls, np.zeros(n, dtype=np.int64)])
        self._prio = np.concatenate([self._prio, np.zeros(n, dtype=np.int64)])
        self._links = np.concatenate([self._links, np.zeros_like(self._links)])
        self._mult = np.concatenate([self._mult, np.zeros_like(self._mult)])
        self._flows.extend([None] * n)
        self._free.extend(range(2 * n - 1, n - 1, -1))

    def _release(self, slot: int) -> Flow:
        flow = self._flows[slot]
        assert flow is not None
        self._flows[slot] = None
        self._alive[slot] = False
        self._rate[slot] = 0.0
        self._free.append(slot)
        self._dirty = True
        return flow

    # -- events -----------------------------------------------------------------------------

    def at(self, time: float, fn: Callable[[], None]) -> None:
        """Run `fn` at `time` (not before now)."""
        heapq.heappush(self._events, (max(time, self.t), next(self._seq), fn))

    def after(self, delay: float, fn: Callable[[], None]) -> None:
        self.at(self.t + delay, fn)

    def run(self, until: float = np.inf, stop: Callable[[], bool] | None = None) -> None:
        """Advance until `until`, until `stop()` is true after an event, or until nothing is
        left to happen."""
        while True:
            if stop is not None and stop():
                return
            if self._dirty:
                self._solve()
            t_ext = self._events[0][0] if self._events else np.inf
            alive = np.flatnonzero(self._alive)
            t_done = np.inf
            if alive.size:
                r = self._rate[alive]
                with np.errstate(divide="ignore", invalid="ignore"):
                    dt = np.where(r > 0, self._rem[alive] * 8.0 / r, np.inf)
                t_done = self.t + float(dt.min())
            t_next = min(t_ext, t_done, until)
            if t_next == np.inf:
                return
            self._advance(t_next - self.t)
            if t_next >= until and t_next < min(t_ext, t_done):
                return
            if t_done <= t_ext:
                self._complete(alive)
            else:
                while self._events and self._events[0][0] <= self.t:
                    _, _, fn = heapq.heappop(self._events)
                    self.events_run += 1
                    fn()

    def _advance(self, dt: float) -> None:
        if dt <= 0:
            return
        if self.probe is not None:
            self.probe(self, dt)
        self._rem -= self._rate * dt / 8.0
        self.link_bytes += self.link_rate * dt / 8.0
        self.t += dt

    def _complete(self, alive: np.ndarray) -> None:
        done = alive[self._rem[alive] <= DONE_BYTES]
        if done.size == 0:  # rounding: finish the one that was due
            done = alive[[int(np.argmin(self._rem[alive] * 8.0 / self._rate[alive]))]]
        for slot in done:
            flow = self._release(int(slot))
            flow.end = self.t
            self.events_run += 1
            if flow.on_done is not None:
                flow.on_done(flow)

    def _solve(self) -> None:
        alive = np.flatnonzero(self._alive)
        self.link_rate[:] = 0.0
        self._dirty = False
        if alive.size == 0:
            return
        self._rate[alive] = fill_by_priority(
            self._fill,
            alive.astype(np.int64),
            self._prio,
            self._width,
            self._links,
            self._mult,
            self._cls,
            self.capacity,
            self.link_rate,
        )
        self.rate_solves += 1
