"""What the API does: jobs, placements applied as ONOS intents, reconcile, control loop."""

from __future__ import annotations

import itertools
import json
import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from .. import shortest_paths
from ..documents import Instance, Job, JobPlacement, Placement, SlotPool, Telemetry, Topology
from ..engine import STRATEGIES, solve
from ..pools import PoolAllocator
from ..validation import InstanceError, check_instance
from .applier import Applier, Partial
from .errors import BadField, Conflict, NotFound, PoolConflict, TooLarge, Unavailable
from .invariants import Invariants
from .lease import Lease
from .loop import ControlLoop
from .onos import (
    AggregationApi,
    HostIndex,
    HostInfo,
    OnosClient,
    OnosError,
    OnosUnavailable,
    PriorityApi,
    intent_digest,
    job_of_key,
)
from .ownership import NotOwner, Ownership
from .scheduler import Scheduler, ScheduleState
from .settings import Settings
from .store import HOLDING, PENDING, Store

__all__ = [
    "HOLDING", "BadField", "Conflict", "NotFound", "ScheduleState", "Service", "TooLarge",
    "Unavailable", "View",
]  # fmt: skip
from .telemetry import InfluxUnavailable, Snapshot, TelemetryReader

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


class Service:
    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self.store = Store(settings.store_target())
        self.onos = OnosClient(
            settings.onos_url,
            settings.onos_user,
            settings.onos_password.get_secret_value(),
            app_id=settings.onos_app_id,
            timeout_s=settings.onos_timeout_s,
            retries=settings.onos_retries,
            priority=settings.intent_priority,
            capacity_gbps=settings.link_capacity_gbps,
        )
        self.aggregation = AggregationApi(self.onos)
        self.priority = PriorityApi(self.onos)
        self.applier = Applier(
            settings, self.store, self.onos, self.aggregation, self.priority, self._count
        )
        self.lease = Lease(self.store, settings.fabric_name(), settings.lease_ttl_s)
        self.influx = TelemetryReader(
            settings.influx_url,
            settings.influx_token.get_secret_value(),
            settings.influx_org,
            settings.influx_bucket,
            settings.telemetry_window_s,
            settings.telemetry_stale_s,
        )
        # Changes to the fabric one at a time, across every replica of this database
        self.apply_lock = self.store.apply_lock(settings.fabric_name())
        self.control = ControlLoop(self)
        self._stop = threading.Event()
        self.scheduler = Scheduler(
            settings, self.store, self.priority, self._count, self._stop,
            lambda: self.lease.leading,
        )  # fmt: skip
        self.counters: dict[str, int] = {}
        self.invariants = Invariants(self.store, self.counters.__setitem__)
        self.ownership = Ownership(
            settings, self.store, self.onos, self.lease.holder, self.invariants,
            self.applier.foreign,
        )  # fmt: skip
        self.scheduler.may_write = self.ownership.require
        self._view: tuple[float, View] | None = None
        self._view_lock = threading.Lock()
        # The newest topology fetched by anything (reads, applies, the loop, registration),
        # by when its fetch began: registration resolves hosts in it (`_hosts_view`).
        self._latest: tuple[float, View] | None = None
        self._hosts_lock = threading.Lock()
        self.warmed = threading.Event()  # the start's topology fetch ended (`warm_topology`)
        self.routing_warmed = False  # the compiled routing loaded at start (`_warm_routing`)
        self._warm_thread: threading.Thread | None = None
        # Peer plans of the view in force: workers that poll their plan share one solve
        # per view (NetMax takes ~0.15 s for 8 workers) instead of one each.
        self._peer_plans: tuple[View | None, dict[tuple, dict[str, Any]]] = (None, {})
        self._peer_lock = threading.Lock()
        # Dry runs: results by (view, store version, jobs), computed once for concurrent
        # identical requests (`_dry_lock`).
        self._dry: dict[tuple, bytes] = {}
        self._what_if: dict[tuple, dict[str, Any]] = {}
        # The newest answer per job list: (view time, store version, view seq, JSON).
        self._dry_last: dict[tuple | None, tuple[float, int, int, bytes]] = {}
        self._refreshing: set[tuple | None] = set()
        self._dry_lock = threading.Lock()
        self._dry_flight: dict[tuple, Future[bytes]] = {}
        # Solves in progress, by everything they read: a request that needs the same solve
        # (per-job dry runs of one strategy share their group's joint solve) waits for it
        # instead of repeating it. Nothing is kept once a solve ends: no cache.
        self._solve_lock = threading.Lock()
        self._solve_flight: dict[tuple, Future[tuple[Placement | None, dict[str, str]]]] = {}
        # Decisions go to InfluxDB from their own thread: a slow or hung InfluxDB never
        # holds the apply lock.
        self._decisions: queue.Queue[tuple] = queue.Queue(maxsize=1000)
        self._decision_thread: threading.Thread | None = None
        self._probe_thread: threading.Thread | None = None
        self._check_cache: tuple[float, dict[str, Any] | None] | None = None
        self._probe_lock = threading.Lock()
        self._probe_state: dict[str, str] = {}
        self._probe_at = 0.0

    def close(self) -> None:
        self.stop_loop()
        self.ownership.stop(release=True)
        self.lease.stop()
        self.flush_decisions(10.0)
        self.influx.close()
        self.store.close()

    # --- views ----------------------------------------------------------------------------

    def view(self, with_telemetry: bool = True, fresh: bool = True) -> View:
        """ONOS's topology and InfluxDB's latest link state. `fresh=False` (reads) reuses
        a view younger than `view_max_age_s`; concurrent readers share one fetch."""
        if not fresh:
            cached = self._cached_view()
            if cached is not None:
                return cached
            with self._view_lock:  # one fetch for every reader that waits here
                cached = self._cached_view()
                if cached is not None:
                    return cached
                view = self._fetch_view(True)
                self._view = (time.monotonic(), view)
                return view
        view = self._fetch_view(with_telemetry)
        if with_telemetry:
            self._view = (time.monotonic(), view)
        return view

    def _cached_view(self) -> View | None:
        if self._view is None:
            return None
        at, view = self._view
        return view if time.monotonic() - at <= self.s.view_max_age_s else None

    def _fetch_view(self, with_telemetry: bool) -> View:
        began = time.monotonic()
        try:
            topo, hosts, devices = self.onos.topology()
        except OnosUnavailable as e:
            raise Unavailable(str(e)) from None
        snap, err = None, None
        influx = self._probe_state.get("influxdb", "ok") if self._probe_thread else "ok"
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

    def _hosts_view(self, since: float | None = None) -> View:
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
            return usable() or self._fetch_view(False)

    def warm_topology(self) -> None:
        """Fetch ONOS's topology in the background as the service starts, for registration
        (`_hosts_view`): the first registration then finds it, or waits for this fetch
        instead of starting its own (a k=64 fabric's took 9-27 s under load). ONOS not
        answering: logged, and the first registration fetches it as before."""

        def run() -> None:
            try:
                view = self._hosts_view()
            except Exception as e:  # ONOS down or answering nonsense: not fatal here
                log.info("topology not fetched at start (%s); registration fetches it", e)
                view = None
            finally:
                self.warmed.set()
            if view is not None:
                self._warm_routing(view.topology)

        self._warm_thread = threading.Thread(target=run, name="warm-topology", daemon=True)
        self._warm_thread.start()

    def readiness(self) -> dict[str, str]:
        """The background probe's last answers (`start_probe`); a probe that has not come
        back within two periods is reported as such, so this never waits on ONOS."""
        if self._probe_thread is None:
            return self._probe_once()
        with self._probe_lock:
            checks, at = dict(self._probe_state), self._probe_at
        age = time.monotonic() - at
        if age > 2 * self.s.probe_period_s + (1 + len(self.onos.nodes)) * self.s.onos_timeout_s:
            return {k: f"no answer from the probe for {age:.1f} s" for k in checks}
        return checks

    def _probe_once(self) -> dict[str, str]:
        out = {}
        try:
            self.onos.ping()
            out["onos"] = "ok"
        except (OnosUnavailable, OnosError) as e:
            out["onos"] = str(e)
        if self.s.require_onos_app:
            missing = self.onos.app_missing() if out["onos"] == "ok" else None
            if missing is None:
                out["onos_app"] = "ONOS does not answer"
            elif missing:
                out["onos_app"] = (
                    f"the innet-agg app (org.innetagg.app) does not serve its REST on "
                    f"{', '.join(missing)}: not installed or not active there; placements "
                    "would be applied without aggregation"
                )
            else:
                out["onos_app"] = "ok"
        out["influxdb"] = "ok" if self.influx.ping() else f"InfluxDB at {self.s.influx_url} down"
        try:
            self.store.ping()
            out["database"] = "ok"
            self.invariants.check_pools()
        except Exception as e:  # down (StoreUnavailable), or closed while stopping
            out["database"] = str(e)
        return out

    def start_probe(self) -> None:
        if self._probe_thread is not None:
            return
        self._probe_state = self._probe_once()
        self._probe_at = time.monotonic()

        def run() -> None:
            while not self._stop.wait(self.s.probe_period_s):
                state = self._probe_once()
                with self._probe_lock:
                    was = self._probe_state.get("onos")
                    app_was = self._probe_state.get("onos_app", "ok")
                    self._probe_state, self._probe_at = state, time.monotonic()
                if was == "ok" and state["onos"] != "ok":
                    # It may come back empty (restarted): no job reads `applied` until a
                    # reconcile has seen ONOS hold it again.
                    self.unverified(f"ONOS stopped answering ({state['onos']})")
                if (
                    state["onos"] == "ok"
                    and state.get("onos_app", "ok") != "ok"
                    and app_was == "ok"
                ):
                    log.warning("not ready: %s", state["onos_app"])
                    self.unverified(state["onos_app"])
                if was != "ok" and state["onos"] == "ok":
                    # ONOS is back (restarted, maybe without its state): the loop's pass
                    # reconciles now, not at its period's end; the scheduler pushes again
                    self.control.wake("ONOS answers again")
                    self.scheduler.wake("onos-back")

        self._probe_thread = threading.Thread(target=run, name="readiness", daemon=True)
        self._probe_thread.start()

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

    # --- jobs -----------------------------------------------------------------------------

    def create_job(self, spec: dict[str, Any], strategy: str) -> dict[str, Any]:
        if strategy not in STRATEGIES:
            raise BadField("strategy", f"unknown {strategy!r}; one of {', '.join(STRATEGIES)}")
        if len(spec["workers"]) > self.s.max_workers_per_job:
            raise TooLarge(f"workers: {len(spec['workers'])} > limit {self.s.max_workers_per_job}")
        if self.store.job(spec["id"]) is not None:
            raise Conflict(f"id: job {spec['id']!r} exists")
        if self.store.count_jobs() >= self.s.max_jobs:
            raise TooLarge(f"jobs: the limit of {self.s.max_jobs} jobs is reached")
        view = self._hosts_view()
        refs = [*spec["workers"], spec["ps"]]
        if any(view.host_index.resolve(r) is None for r in refs):
            # a host ONOS may have learnt since that view: ask ONOS before refusing it
            view = self._hosts_view(since=time.monotonic())
        index = view.host_index
        resolved = []
        for i, ref in enumerate(spec["workers"]):
            hid = index.resolve(ref)
            if hid is None:
                raise BadField(f"workers[{i}]", f"{ref!r} is no host known to ONOS")
            if hid in resolved:
                raise BadField(f"workers[{i}]", f"{ref!r} is host {hid} listed twice")
            resolved.append(hid)
        ps = index.resolve(spec["ps"])
        if ps is None:
            raise BadField("ps", f"{spec['ps']!r} is no host known to ONOS")
        if ps in resolved:
            raise BadField("ps", f"{spec['ps']!r} is also a worker")
        cap = spec.get("max_aggregators")
        n_prog, most = view.programmable
        if cap is not None and cap > n_prog:
            raise BadField(
                "max_aggregators",
                f"{cap} exceeds the {n_prog} programmable switches ONOS knows",
            )
        pool = spec.get("pool_slots")
        if pool is not None and pool > most:
            raise BadField(
                "pool_slots",
                f"{pool} exceeds the {most} aggregation slots of the largest programmable "
                "switch ONOS knows: the job could aggregate nowhere",
            )
        doc = {
            **spec,
            "workers": resolved,
            "ps": ps,
            "requested": {"workers": spec["workers"], "ps": spec["ps"]},
        }
        try:
            self.store.add_job(spec["id"], doc, strategy)
        except Unavailable:
            raise
        except Exception as e:  # a concurrent create of the same id (on any replica)
            raise Conflict(f"id: job {spec['id']!r} exists") from e
        return self.get_job(spec["id"])

    def get_job(self, job_id: str) -> dict[str, Any]:
        job = self.store.job(job_id)
        if job is None:
            raise NotFound(f"job {job_id!r}")
        cur = self.observed(self.store.current(job_id))
        job["placement_status"] = cur["status"] if cur else "none"
        if cur and cur["status"] == "repairing":
            job["repairing"] = cur["repairing"]
        return job

    # --- what ONOS was last seen to hold ------------------------------------------------

    def observed(self, cur: dict[str, Any] | None) -> dict[str, Any] | None:
        """The job's current placement as the API reports it: a recorded `applied` or
        `intents-only` reads `repairing` (with `recorded_status` and why) while the last
        comparison with ONOS did not see it held (ONOS gone or restarted since, the app
        absent, the job's repair failed), until a reconcile or a new apply sees it again."""
        if cur is None or cur["status"] not in ("applied", "intents-only"):
            return cur
        check = self._fabric_check()
        if check is None or cur["seq"] > check["seq"]:
            return cur  # never compared, or converged (and seen) after the comparison
        why = check["drift"].get(cur["job_id"]) if check["verified"] else check["reason"]
        if why is None:
            return cur
        return {**cur, "status": "repairing", "recorded_status": cur["status"], "repairing": why}

    def _fabric_check(self) -> dict[str, Any] | None:
        """The store's record, read at most every 0.2 s (`GET /jobs` reads it per job);
        this instance's own writes are seen at once, another replica's within that."""
        now = time.monotonic()
        hit = self._check_cache
        if hit is None or now - hit[0] > 0.2:
            hit = self._check_cache = (now, self.store.fabric_check())
        return hit[1]

    def _set_fabric_check(self, verified: bool, reason: str | None,
                          drift: dict[str, str] | None = None) -> None:  # fmt: skip
        self.store.set_fabric_check(verified, reason, drift)
        self._check_cache = None

    def unverified(self, reason: str) -> None:
        """From now until a reconcile succeeds, no placement recorded so far reads as held."""
        try:
            self._set_fabric_check(False, f"{reason}; not yet compared again")
        except Exception as e:  # the database is down: readiness says so
            log.warning("could not record that ONOS is unverified: %s", e)

    def set_strategy(self, job_id: str, strategy: str) -> dict[str, Any]:
        if strategy not in STRATEGIES:
            raise BadField("strategy", f"unknown {strategy!r}; one of {', '.join(STRATEGIES)}")
        self.get_job(job_id)
        self.store.set_strategy(job_id, strategy)
        return self.get_job(job_id)

    def delete_job(self, job_id: str) -> dict[str, Any]:
        self.get_job(job_id)
        self.ownership.require()
        with self.apply_lock:
            with self.scheduler.lock:
                pushed = job_id in self.sched.pushed
            # The leader's scheduler pushes classes; a replica that does not lead cannot
            # tell whether this job's is on the switches, so it removes it anyway.
            pushed = pushed or (bool(self.s.schedule_policy) and not self.lease.leading)
            try:
                n, agg = self.applier.remove(job_id, pushed)
            except OnosUnavailable as e:
                raise Unavailable(
                    f"{e}; job {job_id!r} is marked for deletion and reconcile finishes it "
                    "when ONOS is back"
                ) from None
            except OnosError as e:
                raise Unavailable(
                    f"ONOS rejected a request: {e}; job {job_id!r} is marked for deletion "
                    "and reconcile finishes it"
                ) from None
            with self.scheduler.lock:
                self.sched.held_by.pop(job_id, None)
                self.sched.pushed.pop(job_id, None)
        return {"job_id": job_id, "intents_removed": n, "aggregation": agg}

    # --- scheduling -----------------------------------------------------------------------

    def report_progress(self, job_id: str, doc: dict[str, Any]) -> dict[str, Any]:
        """Store what a job says of its training (the scheduler's progress and stage)."""
        self.get_job(job_id)
        if doc.get("progress") is None:
            done, total = doc.get("iterations_done"), doc.get("iterations_total")
            if done is None or total is None:
                raise BadField(
                    "progress", "give progress, or iterations_done with iterations_total"
                )
            if done > total:
                raise BadField("iterations_done", f"{done} exceeds iterations_total {total}")
            doc = {**doc, "progress": done / total}
        before = self.store.progress().get(job_id, {})
        self.store.set_progress(job_id, doc)
        if self.s.schedule_policy and (
            before.get("stage") != doc.get("stage") or before.get("cojob") != doc.get("cojob")
        ):
            self.wake_scheduler("stage")  # a stage ended: the order changes now, not later
        return {"job_id": job_id, **self.store.progress()[job_id]}

    # --- scheduling (scheduler.py) --------------------------------------------------------

    @property
    def sched(self) -> ScheduleState:
        return self.scheduler.state

    def schedule(self, policy: str, classes: int) -> dict[str, Any]:
        return self.scheduler.schedule(policy, classes)

    def push_schedule(self, trigger: str = "request") -> dict[str, Any]:
        return self.scheduler.push(trigger)

    def schedule_status(self) -> dict[str, Any]:
        return self.scheduler.status()

    def wake_scheduler(self, trigger: str) -> None:
        self.scheduler.wake(trigger)

    def start_scheduler(self) -> None:
        self.scheduler.start()

    def peers(
        self,
        job_id: str,
        policy: str,
        compute_s: float = 0.0,
        kappa: float = 1.0,
        model_bytes: int | None = None,
    ) -> dict[str, Any]:
        """The job's workers' peer-selection probabilities under `policy` (NetMax and its
        baselines, docs/peers.md) on the current topology and telemetry."""
        from ..peers import PeerError, pair_times, plan

        spec = self.store.job(job_id)
        if spec is None:
            raise NotFound(f"job {job_id!r}")
        view = self.view(fresh=False)
        size = model_bytes or spec["update_bytes"]
        key = (job_id, tuple(spec["workers"]), policy, compute_s, kappa, size)
        with self._peer_lock:
            seen, plans = self._peer_plans
            if seen is view and key in plans:
                return plans[key]
            inst = self._instance(view, [spec])
            try:
                t = pair_times(inst, spec["workers"], size)
                p = plan(policy, spec["workers"], t, compute_s, kappa)
            except PeerError as e:
                field_name, _, msg = str(e).partition(": ")
                raise BadField(field_name, msg) from None
            out = {"job_id": job_id, **p.as_json(), "model_bytes": size,
                   "telemetry": _tel_note(view)}  # fmt: skip
            if seen is not view:
                plans = {}
                self._peer_plans = (view, plans)
            plans[key] = out
            return out

    # --- placements -----------------------------------------------------------------------

    def _instance(
        self,
        view: View,
        jobs: list[dict[str, Any]],
        reserved: dict[str, list[SlotPool]] | None = None,
    ) -> Instance:
        # The aggregators each job holds now, on the switches the topology still has: a
        # switch that left holds nothing, and its jobs are re-placed without it.
        live = {n.id for n in view.topology.nodes if n.kind == "switch"}
        current = {}
        currents = self.store.currents()
        for j in jobs:
            cur = currents.get(j["id"])
            if cur and cur["status"] in HOLDING:
                current[j["id"]] = [
                    a["switch"] for a in cur["placement"]["aggregators"] if a["switch"] in live
                ]
        tel = view.snapshot.telemetry if view.snapshot else Telemetry()
        return Instance(
            topology=view.topology,
            telemetry=tel,
            jobs=[Job(**{k: v for k, v in j.items() if k in Job.model_fields}) for j in jobs],
            current=current,
            switching_penalty_s=self.s.switching_penalty_s,
            reserved=_on_switches(view.topology, reserved or {}),
        )

    def compute(
        self,
        view: View,
        job_ids: list[str] | None,
        strategy: str | None = None,
        unplaceable: dict[str, str] | None = None,
    ) -> dict[str, tuple[str, Placement]]:
        """Placements by job id. Jobs are solved together with the other jobs of the same
        strategy (shared links and slot pools); a strategy override solves the asked jobs.
        Jobs left out go into `unplaceable` (id -> reason); they never block the others.

        One slot ledger for all jobs: the pools of applied jobs that are not re-placed now,
        whatever their strategy, and those given to the asked jobs of groups solved before,
        are held; the asked jobs' pools never overlap them."""
        unplaceable = {} if unplaceable is None else unplaceable
        deleting = self.store.deleting()
        all_jobs = [j for j in self.store.jobs() if j["id"] not in deleting]
        known = {j["id"] for j in all_jobs}
        for jid in job_ids or []:
            if jid not in known:
                raise NotFound(f"job {jid!r}")
        wanted = set(job_ids) if job_ids else known
        groups: dict[str, list[dict[str, Any]]] = {}
        for j in all_jobs:
            strat = strategy if (strategy and j["id"] in wanted) else j["strategy"]
            if strategy and j["id"] not in wanted:
                continue
            groups.setdefault(strat, []).append(j)
        held = self._held(all_jobs, wanted)  # switch -> [(owner, pool)]
        out: dict[str, tuple[str, Placement]] = {}
        for strat, jobs in groups.items():
            if not any(j["id"] in wanted for j in jobs):
                continue
            members = {j["id"] for j in jobs}
            everything = _pools(held)
            # First as if the group's other jobs held nothing (they are solved here too, so
            # counting their applied pools again would take their slots twice); if the asked
            # jobs' pools then cannot avoid those applied pools, solve again holding them.
            placement = self._solve_isolating(
                view, jobs, strat, unplaceable, _pools(held, but=members)
            )
            if placement is not None and not self._fit_pools(view, placement, wanted, everything):
                placement = self._solve_isolating(view, jobs, strat, unplaceable, everything)
                if placement is not None and not self._fit_pools(
                    view, placement, wanted, everything
                ):
                    raise Conflict(f"strategy {strat}: the asked jobs' slot pools do not fit")
            if placement is None:
                continue
            for jp in placement.jobs:
                if jp.job_id in wanted:
                    out[jp.job_id] = (strat, placement)
                    for a in jp.aggregators:
                        held.setdefault(a.switch, []).append((jp.job_id, a.pool))
        return out

    def _held(
        self, jobs: list[dict[str, Any]], wanted: set[str]
    ) -> dict[str, list[tuple[str, SlotPool]]]:
        """The pools jobs not in `wanted` may hold now, by switch: those of their current
        placement, and while an apply has not finished (`pending`), those of the placement
        it moves to as well (the switches may hold either)."""
        held: dict[str, list[tuple[str, SlotPool]]] = {}
        desired = self.store.desired()
        currents = self.store.currents()
        for j in jobs:
            if j["id"] in wanted:
                continue
            docs = []
            cur = currents.get(j["id"])
            if cur and cur["status"] in HOLDING:
                docs.append(cur["placement"])
            d = desired.get(j["id"])
            if d and d["state"] == PENDING:
                docs.append(d["placement"])
            seen = set()
            for doc in docs:
                for a in doc["aggregators"]:
                    pool = SlotPool(**a["pool"])
                    if (a["switch"], pool.base, pool.size) not in seen:
                        seen.add((a["switch"], pool.base, pool.size))
                        held.setdefault(a["switch"], []).append((j["id"], pool))
        return held

    def _fit_pools(
        self, view: View, placement: Placement, wanted: set[str], held: dict[str, list[SlotPool]]
    ) -> bool:
        """Give the asked jobs' aggregators pools around `held` (first fit, in place);
        False where a switch has no room left for one."""
        slots = {n.id: n.slots for n in view.topology.nodes if n.kind == "switch"}
        alloc = PoolAllocator(slots, held)
        fitted = []
        try:
            for jp in placement.jobs:
                if jp.job_id in wanted:
                    fitted.append(
                        (
                            jp,
                            [
                                a.model_copy(update={"pool": alloc.take(a.switch, a.pool.size)})
                                for a in jp.aggregators
                            ],
                        )
                    )
        except ValueError as e:
            log.info("slot pools re-solved holding every applied pool: %s", e)
            return False
        for jp, aggs in fitted:
            jp.aggregators = aggs
        return True

    def _solve_isolating(
        self,
        view: View,
        jobs: list[dict[str, Any]],
        strat: str,
        unplaceable: dict[str, str],
        reserved: dict[str, list[SlotPool]] | None = None,
    ) -> Placement | None:
        """Solve the jobs together; a job the instance rejects (its hosts gone from ONOS or
        unreachable, a cap the fabric cannot meet) is left out with its reason in
        `unplaceable`, and the others are solved without it.

        Concurrent callers with the same inputs (view, store version, jobs, strategy, held
        pools) share one solve: per-job dry runs of the jobs of one strategy all need that
        group's joint solve (50 clients over 6 jobs: 418 answers/s solving it for each
        request, 900/s sharing it). Each caller gets its own copy of the result's jobs
        (callers fit pools into them)."""
        key = (
            view.seq,
            self.store.version,
            strat,
            json.dumps(jobs, sort_keys=True, default=str),
            tuple(
                sorted(
                    (sw, tuple((p.base, p.size) for p in ps)) for sw, ps in (reserved or {}).items()
                )
            ),
        )
        with self._solve_lock:
            flight = self._solve_flight.get(key)
            if flight is None:
                self._solve_flight[key] = mine = Future()
        if flight is None:
            left_out: dict[str, str] = {}
            try:
                ok = self._placeable(view, jobs, left_out)
                result = (
                    solve(self._instance(view, ok, reserved), strat, polish=False) if ok else None,
                    left_out,
                )
            except BaseException as e:
                mine.set_exception(e)
                raise
            finally:
                with self._solve_lock:
                    self._solve_flight.pop(key, None)
            mine.set_result(result)
            flight = mine
        placement, left_out = flight.result()
        unplaceable.update(left_out)
        if placement is None:
            return None
        # `_fit_pools` replaces a job's aggregator list, never edits it: a copy per job will do.
        return placement.model_copy(update={"jobs": [jp.model_copy() for jp in placement.jobs]})

    def _placeable(
        self, view: View, jobs: list[dict[str, Any]], unplaceable: dict[str, str]
    ) -> list[dict[str, Any]]:
        """`jobs` without those the instance check rejects (reasons in `unplaceable`). An
        error that names no single job (`current.<id>`, say) leaves out the job it names,
        or, naming none, every job: one job's trouble never blocks the others'."""
        jobs = list(jobs)
        while jobs:
            try:
                check_instance(self._instance(view, jobs))
                return jobs
            except InstanceError as e:
                head = e.field.split(".", 1)[0]
                idx = head.removeprefix("jobs[").rstrip("]") if head.startswith("jobs[") else ""
                by_id = {j["id"]: i for i, j in enumerate(jobs)}
                if idx.isdigit() and int(idx) < len(jobs):
                    bad = [jobs.pop(int(idx))]
                    where = e.field.split("]", 1)[1].lstrip(".") or "job"
                elif head == "current" and e.field.split(".", 1)[-1] in by_id:
                    bad = [jobs.pop(by_id[e.field.split(".", 1)[1]])]
                    where = "current placement"
                else:
                    bad, jobs = jobs, []
                    where = e.field
                for b in bad:
                    unplaceable[b["id"]] = f"{where}: {e.message}"
                    log.warning("job %s left unplaced: %s", b["id"], unplaceable[b["id"]])
        return jobs

    def place(
        self, job_ids: list[str] | None, dry_run: bool, trigger: str = "api"
    ) -> list[dict[str, Any]]:
        if dry_run:
            return self._dry_run(job_ids)
        return self._place(self.view(), job_ids, False, trigger)

    def _dry_run(self, job_ids: list[str] | None) -> list[dict[str, Any]]:
        return json.loads(self.dry_run_json(job_ids))

    def dry_run_cached(self, job_ids: list[str] | None) -> bytes | None:
        """A dry-run answer without blocking, or None. The answer for the current view and
        store; once the view has expired, the last answer for the same store version while
        one background refresh computes the next (stale-while-revalidate), as long as that
        answer's view is at most `4 * view_max_age_s` old."""
        if not self.s.dry_run_cache:
            return None
        jobs = tuple(job_ids) if job_ids else None
        last = self._dry_last.get(jobs)
        if last is None or last[1] != self.store.version:
            return None
        at, seq, data = last[0], last[2], last[3]
        fresh = self._cached_view()
        if fresh is not None and fresh.seq == seq:
            return data
        if time.monotonic() - at > 4 * max(self.s.view_max_age_s, 0.25):
            return None
        with self._dry_lock:
            if jobs not in self._refreshing:
                self._refreshing.add(jobs)
                threading.Thread(
                    target=self._refresh_dry, args=(job_ids, jobs), daemon=True
                ).start()
        return data

    def _refresh_dry(self, job_ids: list[str] | None, jobs: tuple | None) -> None:
        try:
            self.dry_run_json(job_ids)
        except Exception as e:  # the next request takes the slow path and reports it
            log.debug("dry-run refresh failed: %s", e)
        finally:
            with self._dry_lock:
                self._refreshing.discard(jobs)

    def dry_run_json(self, job_ids: list[str] | None) -> bytes:
        """The dry-run placements as the JSON the API answers, computed once per view,
        store version and job list; concurrent identical requests wait for one solve, and
        different ones do not wait for each other (nor for an apply)."""
        view = self.view(fresh=False)
        version = self.store.version
        key = (view.seq, version, tuple(job_ids) if job_ids else None)
        with self._dry_lock:
            hit = self._dry.get(key) if self.s.dry_run_cache else None
            if hit is not None:
                return hit
            flight = self._dry_flight.get(key)
            if flight is None:
                self._dry_flight[key] = mine = Future()
        if flight is not None:
            return flight.result()
        try:
            hit = json.dumps(self._plan(view, job_ids)).encode()
        except BaseException as e:
            with self._dry_lock:
                self._dry_flight.pop(key, None)
            mine.set_exception(e)
            raise
        with self._dry_lock:
            if len(self._dry) >= 16:
                self._dry.pop(next(iter(self._dry)))
            self._dry[key] = hit
            if len(self._dry_last) >= 16 and key[2] not in self._dry_last:
                self._dry_last.pop(next(iter(self._dry_last)))
            at = self._view[0] if self._view and self._view[1] is view else time.monotonic()
            self._dry_last[key[2]] = (at, version, view.seq, hit)
            self._dry_flight.pop(key, None)
        mine.set_result(hit)
        return hit

    def _place(
        self, view: View, job_ids: list[str] | None, dry_run: bool, trigger: str
    ) -> list[dict[str, Any]]:
        if dry_run:
            return self._plan(view, job_ids)
        with self.apply_lock:
            results, placed = self._computed(view, job_ids)
            done, refused = self.apply_all(view, [(j, s, jp, trigger) for j, s, jp in placed])
            if refused:
                raise Conflict("; ".join(f"job {j!r}: {why}" for j, why in sorted(refused.items())))
            results += [done[j["id"]] for j, _, _ in placed]
        return results

    def apply_all(
        self,
        view: View,
        items: list[tuple[dict[str, Any], str, JobPlacement, str]],
        errors: dict[str, str] | None = None,
    ) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
        """Apply (job, strategy, placement, trigger) items; returns the results by job and
        the jobs refused with why. Jobs placed together may each take pools another of them
        leaves, and the store refuses a pool while any other job holds it: a refused job is
        tried again after the others moved. Where they wait on each other in a ring, the
        first one's pools are fitted anew around every pool held now (same switches and
        sizes); one that does not fit stays as it was. With `errors`, a job ONOS failed
        goes there and the others go on (else Unavailable propagates)."""
        done: dict[str, dict[str, Any]] = {}
        refused: dict[str, str] = {}
        refitted: set[str] = set()
        waiting = list(items)
        while waiting:
            later: list[tuple[tuple[dict[str, Any], str, JobPlacement, str], str]] = []
            for item in waiting:
                job, strat, jp, why = item
                try:
                    done[job["id"]] = self._apply(view, job, strat, jp, why)
                except PoolConflict as e:
                    later.append((item, str(e)))
                except Unavailable as e:
                    if errors is None:
                        raise
                    errors[job["id"]] = str(e)
            if later and len(later) == len(waiting):  # a ring, or a pool nobody leaves
                (job, strat, jp, why), reason = later[0]
                again = None if job["id"] in refitted else self._refit(view, job["id"], jp)
                if again is None:
                    refused.update({it[0]["id"]: r for it, r in later})
                    for jid, r in sorted(refused.items()):
                        log.error("job %s not moved: %s", jid, r)
                    break
                refitted.add(job["id"])
                later[0] = ((job, strat, again, why), reason)
            waiting = [it for it, _ in later]
        return done, refused

    def _refit(self, view: View, jid: str, jp: JobPlacement) -> JobPlacement | None:
        """`jp` with pools fitted first-fit around every pool any other job holds now."""
        slots = {n.id: n.slots for n in view.topology.nodes if n.kind == "switch"}
        alloc = PoolAllocator(slots, _pools(self._held(self.store.jobs(), {jid})))
        try:
            aggs = [
                a.model_copy(update={"pool": alloc.take(a.switch, a.pool.size)})
                for a in jp.aggregators
            ]
        except (ValueError, KeyError) as e:
            log.info("job %s: pools not fitted around the held ones: %s", jid, e)
            return None
        return jp.model_copy(update={"aggregators": aggs})

    def _computed(
        self, view: View, job_ids: list[str] | None
    ) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], str, JobPlacement]]]:
        """The results of the jobs left out, and (job, strategy, placement) of the others,
        in job order (a job deleted since the solve began is skipped)."""
        unplaceable: dict[str, str] = {}
        computed = self.compute(view, job_ids, unplaceable=unplaceable)
        results = self._unplaceable(job_ids, unplaceable, computed)
        placed = []
        for jid in sorted(computed):
            strat, placement = computed[jid]
            job = self.store.job(jid)
            if job is not None:
                placed.append((job, strat, next(p for p in placement.jobs if p.job_id == jid)))
        return results, placed

    def _plan(self, view: View, job_ids: list[str] | None) -> list[dict[str, Any]]:
        """A dry run: computed on the store as it is, outside the apply lock (an apply in
        progress never delays it; its job counts with the pools it may hold)."""
        results, placed = self._computed(view, job_ids)
        for job, strat, jp in placed:
            jid = job["id"]
            bodies = self.onos.intent_bodies(jp, view.hosts, job["ps"])
            results.append(
                {
                    "job_id": jid,
                    "strategy": strat,
                    "status": "dry-run",
                    "placement": jp.model_dump(mode="json"),
                    "changes": _diff(bodies, self.store.intents(jid)),
                    "telemetry": _tel_note(view),
                }
            )
        return results

    @staticmethod
    def _unplaceable(
        job_ids: list[str] | None, unplaceable: dict[str, str], computed: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """The results of the jobs left out; a Conflict when every asked job was."""
        bad = sorted(j for j in unplaceable if not job_ids or j in job_ids)
        if bad and not computed:
            raise Conflict("; ".join(f"job {j!r}: {unplaceable[j]}" for j in bad))
        return [{"job_id": j, "status": "unplaceable", "reason": unplaceable[j]} for j in bad]

    def _apply(self, view: View, job: dict[str, Any], strat: str, jp: Any, trigger: str) -> dict:
        """Record the job's new desired placement, then converge the fabric to it."""
        jid = job["id"]
        self.ownership.require()
        bodies = self.onos.intent_bodies(jp, view.hosts, job["ps"])
        doc = jp.model_dump(mode="json")
        self.applier.desire(jid, strat, jp, bodies)
        try:
            res = self.applier.converge(jid)
        except Partial as e:
            reason = (
                f"{e}: {e.submitted} intent(s) submitted before the failure; the state is "
                "recorded as partial and reconciled on the next apply, loop pass or restart"
            )
            self.store.add_placement(jid, strat, "partial", reason, doc)
            self._count("placements_partial")
            raise Unavailable(reason) from None
        except OnosError as e:
            reason = f"ONOS rejected a request: {e}"
            self.store.add_placement(jid, strat, "failed", reason, doc)
            raise Unavailable(reason) from None
        self._count(f"placements_{res.status}")
        self._decision(jid, strat, jp, trigger)
        if self.s.schedule_policy and jid not in self.sched.pushed:
            self.wake_scheduler("placement")
        return {
            "job_id": jid,
            "strategy": strat,
            "status": res.status,
            "reason": res.reason,
            "placement": doc,
            "changes": res.changes,
            "intents": [s.__dict__ for s in res.states],
            "aggregation": res.aggregation,
            "telemetry": _tel_note(view),
        }

    def _decision(self, jid: str, strat: str, jp: Any, trigger: str) -> None:
        item = (jid, strat, [a.switch for a in jp.aggregators], jp.predicted_cct_s, trigger)
        try:
            self._decisions.put_nowait(item)
        except queue.Full:
            self._count("decisions_unwritten")
            return
        if self._decision_thread is None:
            self._decision_thread = threading.Thread(
                target=self._write_decisions, name="decisions", daemon=True
            )
            self._decision_thread.start()

    def _write_decisions(self) -> None:
        bucket = self.s.decisions_bucket or self.s.influx_bucket
        while True:
            item = self._decisions.get()
            if item is None:
                return
            try:
                self.influx.write_decision(bucket, *item)
            except InfluxUnavailable as e:
                log.warning("decision for %s not written: %s", item[0], e)
                self._count("decisions_unwritten")
            finally:
                self._decisions.task_done()

    def flush_decisions(self, timeout_s: float = 30.0) -> bool:
        """Wait until every queued decision is written (or failed); False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self._decisions.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.02)
        return not self._decisions.unfinished_tasks

    def what_if_cached(self, job_id: str) -> dict[str, Any] | None:
        """The what-if answer already computed for the current view and store, or None."""
        view = self._cached_view()
        if view is None:
            return None
        return self._what_if.get((view.seq, self.store.version, job_id))

    def what_if(self, job_id: str) -> dict[str, Any]:
        self.get_job(job_id)
        view = self.view(fresh=False)
        key = (view.seq, self.store.version, job_id)
        hit = self._what_if.get(key)
        if hit is not None:
            return hit
        out = self._what_if_compute(view, job_id)
        if len(self._what_if) >= 64:
            self._what_if.pop(next(iter(self._what_if)))
        self._what_if[key] = out
        return out

    def _what_if_compute(self, view: View, job_id: str) -> dict[str, Any]:
        jobs = self.store.jobs()
        unplaceable: dict[str, str] = {}
        jobs = self._placeable(view, jobs, unplaceable)
        if job_id in unplaceable:
            raise Conflict(f"job {job_id!r}: {unplaceable[job_id]}")
        inst = self._instance(view, jobs)
        inst = inst.model_copy(update={"current": {}, "switching_penalty_s": 0.0})
        out = {}
        floor = None
        for strat in STRATEGIES:
            p = solve(inst, strat, polish=False)
            jp = next((x for x in p.jobs if x.job_id == job_id), None)
            if jp is None:  # deleted meanwhile
                raise NotFound(f"job {job_id!r}")
            out[strat] = {
                "predicted_cct_s": jp.predicted_cct_s,
                "aggregators": [a.switch for a in jp.aggregators],
            }
            floor = jp.floor_cct_s
        return {"job_id": job_id, "strategies": out, "floor_cct_s": floor,
                "telemetry": _tel_note(view)}  # fmt: skip

    # --- reconcile ------------------------------------------------------------------------

    def reconcile(self) -> dict[str, Any]:
        """Compare what ONOS holds with each job's desired state and repair it
        (`Applier.reconcile`): at start, every loop pass and on request. Pools two jobs'
        records share are repaired first: the later job is placed again around the
        other's."""
        try:
            self.ownership.require()
        except NotOwner as e:
            self.unverified(f"the last reconcile failed: {e}")
            raise
        moved = self._repair_overlaps()
        with self.apply_lock:
            try:
                r = self.applier.reconcile(lambda jid: jid in self.sched.pushed)
            except (OnosUnavailable, Partial) as e:
                self.unverified(f"the last reconcile failed: {e}")
                raise Unavailable(f"reconcile: {e}") from None
            except OnosError as e:
                self.unverified(f"the last reconcile failed: ONOS rejected a request: {e}")
                raise Unavailable(f"reconcile: ONOS rejected a request: {e}") from None
            drift = dict(r.errors)
            for s in r.failed:
                jid = job_of_key(s.key)
                if jid is not None:
                    drift.setdefault(jid, f"intent {s.key} is {s.state} in ONOS")
            self._set_fabric_check(True, None, drift)
        self._count("reconciles")
        self.invariants.foreign(r.foreign)
        return {
            "overlaps_repaired": moved,
            "removed": r.removed,
            "resubmitted": r.resubmitted,
            "repaired": r.repaired,
            "deleted": r.deleted,
            "foreign": r.foreign,
            "failed": [s.__dict__ for s in r.failed],
            "errors": r.errors,
        }

    def _repair_overlaps(self) -> list[str]:
        """Re-place the later job of every pair whose recorded pools overlap; the jobs
        moved. A job that cannot be placed again is logged and left for the next pass."""
        moved: list[str] = []
        pairs = self.invariants.check_pools()
        for pair in pairs:
            jid = self.invariants.later(pair)
            if jid in moved:
                continue
            try:
                self._place(self.view(), [jid], False, "repair")
            except (Conflict, NotFound, Unavailable) as e:
                log.error("overlapping pools of job %s not repaired: %s", jid, e)
                continue
            moved.append(jid)
        if pairs:
            self.invariants.check_pools()
        return moved

    # --- control loop (loop.py) ----------------------------------------------------------

    def step(self) -> dict[str, Any]:
        return self.control.step()

    def _worth_moving(self, view: View, job: dict[str, Any], old: dict, new: dict) -> bool:
        return self.control.worth_moving(view, job, old, new)

    def start_loop(self) -> None:
        self.control.start()

    def stop_loop(self) -> None:
        self._stop.set()
        self.control.stop()
        self.scheduler.stop()

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1


def _diff(
    bodies: dict[str, dict[str, Any]], stored: dict[str, tuple[str, str]]
) -> dict[str, list[str]]:
    """What applying `bodies` would change, against the intents the store owns."""
    submit, unchanged = [], []
    for key, body in sorted(bodies.items()):
        same = key in stored and stored[key][1] == intent_digest(body)
        (unchanged if same else submit).append(key)
    delete = sorted(k for k in stored if k not in bodies)
    return {"submit": submit, "unchanged": unchanged, "delete": delete}


def _tel_note(view: View) -> dict[str, Any]:
    if view.snapshot is None:
        return {
            "status": "unavailable",
            "reason": view.telemetry_error,
            "note": "placed with no-data defaults (idle links)",
        }
    return {
        "status": "ok",
        "links": len(view.snapshot.telemetry.links),
        "stale": len(view.snapshot.stale),
    }


def _pools(
    held: dict[str, list[tuple[str, SlotPool]]],
    but: set[str] = frozenset(),  # type: ignore[assignment]
) -> dict[str, list[SlotPool]]:
    """`held` without owners, leaving out those in `but`."""
    out: dict[str, list[SlotPool]] = {}
    for sw, pools in held.items():
        kept = [p for owner, p in pools if owner not in but]
        if kept:
            out[sw] = kept
    return out


def _on_switches(topo: Topology, held: dict[str, list[SlotPool]]) -> dict[str, list[SlotPool]]:
    """The held pools on switches the topology still has, within their slots (a switch
    gone from ONOS holds nothing; its entries went with it)."""
    slots = {n.id: n.slots for n in topo.nodes if n.kind == "switch"}
    return {
        sw: [p for p in pools if p.base + p.size <= slots[sw]]
        for sw, pools in held.items()
        if sw in slots
    }
