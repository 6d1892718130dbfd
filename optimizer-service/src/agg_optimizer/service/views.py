"""What the service reads of the world: ONOS's topology and InfluxDB's latest link state,
fetched, shared between concurrent readers and kept for `view_max_age_s` (reads) or
`hosts_max_age_s` (registration), and warmed as the service starts."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from agg_optimizer.model import shortest_paths
from agg_optimizer.model.documents import Topology
from agg_optimizer.service.errors import Unavailable
from agg_optimizer.service.onos import HostIndex, HostInfo, OnosClient, OnosUnavailable
from agg_optimizer.service.settings import Settings
from agg_optimizer.service.telemetry import InfluxUnavailable, Snapshot, TelemetryReader

log = logging.getLogger(__name__)


@dataclass
class View:
    topology: Topology
    hosts: dict[str, HostInfo]
    devices: dict[str, Any]
    snapshot: Snapshot | None
    telemetry_error: str | None = None
    seq: int = field(default_factory=itertools.count().__next__)  # which fetch this is

    @cached_property
    def host_index(self) -> HostIndex:
        return HostIndex(self.hosts)

    @cached_property
    def programmable(self) -> tuple[int, int]:
        """How many programmable switches, and the most slots one has."""
        slots = [n.slots for n in self.topology.nodes if n.kind == "switch" and n.programmable]
        return len(slots), max(slots, default=0)

    def telemetry_note(self) -> dict[str, Any]:
        """What an answer says of the telemetry its placement read."""
        if self.snapshot is None:
            return {
                "status": "unavailable",
                "reason": self.telemetry_error,
                "note": "placed with no-data defaults (idle links)",
            }
        return {
            "status": "ok",
            "links": len(self.snapshot.telemetry.links),
            "stale": len(self.snapshot.stale),
        }


class Views:
    """Fetches and keeps views. `influx_state()` is the readiness probe's word on InfluxDB
    ("ok" or why not): while it is down, views carry no telemetry instead of waiting out a
    query timeout on every apply and dry run."""

    def __init__(
        self,
        settings: Settings,
        onos: OnosClient,
        influx: TelemetryReader,
        influx_state: Callable[[], str],
    ) -> None:
        self.s, self.onos, self.influx, self.influx_state = settings, onos, influx, influx_state
        self._view: tuple[float, View] | None = None  # the reads' view, by when it was kept
        self._view_lock = threading.Lock()
        # The newest topology fetched by anything (reads, applies, the loop, registration),
        # by when its fetch began: registration resolves hosts in it (`for_hosts`).
        self._latest: tuple[float, View] | None = None
        self._hosts_lock = threading.Lock()
        self.warmed = threading.Event()  # the start's topology fetch ended (`warm`)
        self.routing_warmed = False  # the compiled routing loaded at start (`_warm_routing`)
        self._warm_thread: threading.Thread | None = None

    def get(self, with_telemetry: bool = True, fresh: bool = True) -> View:
        """ONOS's topology and InfluxDB's latest link state. `fresh=False` (reads) reuses
        a view younger than `view_max_age_s`; concurrent readers share one fetch."""
        if not fresh:
            cached = self.cached()
            if cached is not None:
                return cached
            with self._view_lock:  # one fetch for every reader that waits here
                cached = self.cached()
                if cached is not None:
                    return cached
                view = self.fetch(True)
                self._view = (time.monotonic(), view)
                return view
        view = self.fetch(with_telemetry)
        if with_telemetry:
            self._view = (time.monotonic(), view)
        return view

    def cached(self) -> View | None:
        """The reads' view while it is younger than `view_max_age_s`."""
        if self._view is None:
            return None
        at, view = self._view
        return view if time.monotonic() - at <= self.s.view_max_age_s else None

    def kept_at(self, view: View) -> float:
        """When `view` became the reads' view (now, if it is not that one)."""
        kept = self._view
        return kept[0] if kept and kept[1] is view else time.monotonic()

    def forget(self) -> None:
        """The next read fetches a new view."""
        self._view = None

    def fetch(self, with_telemetry: bool) -> View:
        began = time.monotonic()
        try:
            topo, hosts, devices = self.onos.topology()
        except OnosUnavailable as e:
            raise Unavailable(str(e)) from None
        snap, err = None, None
        influx = self.influx_state()
        if with_telemetry and influx != "ok":
            # The probe found InfluxDB down (or hung): no 5 s query timeout on every apply
            # and dry run; placements use no-data defaults until the probe sees it again.
            err = f"{influx} (readiness probe)"
        elif with_telemetry:
            try:
                snap = self.influx.snapshot(topo, devices)
            except InfluxUnavailable as e:
                err = str(e)
        view = View(topo, hosts, devices, snap, err)
        latest = self._latest
        if latest is None or latest[0] <= began:
            self._latest = (began, view)
        return view

    def for_hosts(self, since: float | None = None) -> View:
        """ONOS's topology for registration: the newest any call fetched, if that fetch
        began at most `hosts_max_age_s` ago (and, given `since`, not before it); else one
        fetched now, without telemetry, shared by the registrations that wait meanwhile.
        A k=64 fat-tree's topology takes seconds to fetch and decode; a registration reads
        a few of its hosts."""
        floor = -float("inf") if since is None else since

        def usable() -> View | None:
            latest = self._latest
            if latest is None or latest[0] < floor:
                return None
            fresh = time.monotonic() - latest[0] <= self.s.hosts_max_age_s
            return latest[1] if fresh else None

        view = usable()
        if view is not None:
            return view
        with self._hosts_lock:
            return usable() or self.fetch(False)

    def warm(self) -> None:
        """Fetch ONOS's topology in the background as the service starts, for registration
        (`for_hosts`): the first registration then finds it, or waits for this fetch
        instead of starting its own (a k=64 fabric's took 9-27 s under load). ONOS not
        answering: logged, and the first registration fetches it as before."""

        def run() -> None:
            try:
                view = self.for_hosts()
            except Exception as e:  # ONOS down or answering nonsense: not fatal here
                log.info("topology not fetched at start (%s); registration fetches it", e)
                view = None
            finally:
                self.warmed.set()
            if view is not None:
                self._warm_routing(view.topology)

        self._warm_thread = threading.Thread(target=run, name="warm-topology", daemon=True)
        self._warm_thread.start()

    def _warm_routing(self, topo: Topology) -> None:
        """Load the compiled routing search now where this fabric's solves would use it
        once loaded (`shortest_paths.LOADED_MIN_WORK`), so that the first placement does not pay
        for building its C kernel (about 1 s, once per install) or loading numba's (3.1-3.4 s
        on a 2-core machine); a fresh process builds or loads it only for a single solve of
        `COMPILED_MIN_WORK`, or from `LOADED_MIN_WORK` where the C kernel is built.
        Its most work: a root per switch with hosts, times the directed switch-to-switch
        links."""
        kind = {n.id: n.kind for n in topo.nodes}
        ss = sum(1 for ln in topo.links if kind.get(ln.src) == kind.get(ln.dst) == "switch")
        edge = {
            ln.dst if kind.get(ln.src) == "host" else ln.src
            for ln in topo.links
            if "host" in (kind.get(ln.src), kind.get(ln.dst))
        }
        work = len(edge) * 2 * ss
        if work < shortest_paths.LOADED_MIN_WORK:
            return
        t = time.monotonic()
        if shortest_paths.preload():
            log.info("compiled routing loaded at start in %.1f s", time.monotonic() - t)
            self.routing_warmed = True
