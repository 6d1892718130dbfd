"""The service the routes call: it applies placements (desired state recorded, then the
fabric converged to it) and reconciles ONOS with the store, and hands every other concern
to a part of its own (views, readiness, jobs, planner, dry runs, decisions, the control
loop, the scheduler, replicas; docs/architecture.md)."""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from agg_optimizer.model.documents import JobPlacement
from agg_optimizer.service.applier import Applier, Partial
from agg_optimizer.service.decisions import Decisions
from agg_optimizer.service.dryrun import DryRuns
from agg_optimizer.service.errors import (
    BadField,
    Conflict,
    NotFound,
    PoolConflict,
    TooLarge,
    Unavailable,
)
from agg_optimizer.service.invariants import Invariants
from agg_optimizer.service.jobs import Jobs
from agg_optimizer.service.lease import Lease
from agg_optimizer.service.loop import ControlLoop
from agg_optimizer.service.onos import (
    AggregationApi,
    OnosClient,
    OnosError,
    OnosUnavailable,
    PriorityApi,
    job_of_key,
)
from agg_optimizer.service.ownership import NotOwner, Ownership
from agg_optimizer.service.planner import Planner
from agg_optimizer.service.readiness import Readiness
from agg_optimizer.service.scheduler import Scheduler, ScheduleState
from agg_optimizer.service.settings import Settings
from agg_optimizer.service.store import HOLDING, Store
from agg_optimizer.service.telemetry import TelemetryReader
from agg_optimizer.service.views import View, Views

__all__ = [
    "HOLDING", "BadField", "Conflict", "NotFound", "ScheduleState", "Service", "TooLarge",
    "Unavailable", "View",
]  # fmt: skip

log = logging.getLogger(__name__)


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
        self.probe = Readiness(
            settings, self.onos, self.influx, self.store, self.invariants, self._stop,
            self.unverified, self._onos_back,
        )  # fmt: skip
        self.views = Views(settings, self.onos, self.influx, self.probe.influx_state)
        self.jobs = Jobs(settings, self.store, self.views, lambda: self.wake_scheduler("stage"))
        # Peer plans of the view in force: workers that poll their plan share one solve
        # per view (NetMax takes ~0.15 s for 8 workers) instead of one each.
        self._peer_plans: tuple[View | None, dict[tuple, dict[str, Any]]] = (None, {})
        self._peer_lock = threading.Lock()
        self.planner = Planner(settings, self.store)
        self.dry = DryRuns(settings, self.store, self.onos, self.views, self.planner)
        self.decisions = Decisions(settings, self.influx, self._count)

    def close(self) -> None:
        self.stop_loop()
        self.ownership.stop(release=True)
        self.lease.stop()
        self.decisions.flush(10.0)
        self.influx.close()
        self.store.close()

    # --- views and readiness (views.py, readiness.py) ----------------------------------

    def view(self, with_telemetry: bool = True, fresh: bool = True) -> View:
        """ONOS's topology and InfluxDB's latest link state (`Views.get`)."""
        return self.views.get(with_telemetry, fresh)

    def readiness(self) -> dict[str, str]:
        return self.probe.state()

    def start_probe(self) -> None:
        self.probe.start()

    def warm_topology(self) -> None:
        self.views.warm()

    @property
    def warmed(self) -> threading.Event:
        return self.views.warmed

    @property
    def routing_warmed(self) -> bool:
        return self.views.routing_warmed

    def _onos_back(self) -> None:
        # ONOS is back (restarted, maybe without its state): the loop's pass reconciles
        # now, not at its period's end; the scheduler pushes again
        self.control.wake("ONOS answers again")
        self.scheduler.wake("onos-back")

    # --- jobs -----------------------------------------------------------------------------

    def create_job(self, spec: dict[str, Any], strategy: str) -> dict[str, Any]:
        return self.jobs.create(spec, strategy)

    def get_job(self, job_id: str) -> dict[str, Any]:
        return self.jobs.get(job_id)

    def observed(self, cur: dict[str, Any] | None) -> dict[str, Any] | None:
        return self.jobs.observed(cur)

    def unverified(self, reason: str) -> None:
        self.jobs.unverified(reason)

    def set_strategy(self, job_id: str, strategy: str) -> dict[str, Any]:
        return self.jobs.set_strategy(job_id, strategy)

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
        return self.jobs.report_progress(job_id, doc)

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
        from agg_optimizer.peers.selection import PeerError, pair_times, plan

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
            inst = self.planner.instance(view, [spec])
            try:
                t = pair_times(inst, spec["workers"], size)
                p = plan(policy, spec["workers"], t, compute_s, kappa)
            except PeerError as e:
                field_name, _, msg = str(e).partition(": ")
                raise BadField(field_name, msg) from None
            out = {"job_id": job_id, **p.as_json(), "model_bytes": size,
                   "telemetry": view.telemetry_note()}  # fmt: skip
            if seen is not view:
                plans = {}
                self._peer_plans = (view, plans)
            plans[key] = out
            return out

    # --- placements -----------------------------------------------------------------------

    def place(
        self, job_ids: list[str] | None, dry_run: bool, trigger: str = "api"
    ) -> list[dict[str, Any]]:
        if dry_run:
            return self._dry_run(job_ids)
        return self._place(self.view(), job_ids, False, trigger)

    def _dry_run(self, job_ids: list[str] | None) -> list[dict[str, Any]]:
        return json.loads(self.dry.json(job_ids))

    # --- dry runs and what-if (dryrun.py), planning (planner.py) --------------------------

    def dry_run_cached(self, job_ids: list[str] | None) -> bytes | None:
        return self.dry.cached(job_ids)

    def dry_run_json(self, job_ids: list[str] | None) -> bytes:
        return self.dry.json(job_ids)

    def what_if_cached(self, job_id: str) -> dict[str, Any] | None:
        return self.dry.what_if_cached(job_id)

    def what_if(self, job_id: str) -> dict[str, Any]:
        self.get_job(job_id)
        return self.dry.what_if(job_id)

    def flush_decisions(self, timeout_s: float = 30.0) -> bool:
        return self.decisions.flush(timeout_s)

    def _place(
        self, view: View, job_ids: list[str] | None, dry_run: bool, trigger: str
    ) -> list[dict[str, Any]]:
        if dry_run:
            return self.dry.plan(view, job_ids)
        with self.apply_lock:
            results, placed = self.planner.computed(view, job_ids)
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
                again = None if job["id"] in refitted else self.planner.refit(view, job["id"], jp)
                if again is None:
                    refused.update({it[0]["id"]: r for it, r in later})
                    for jid, r in sorted(refused.items()):
                        log.error("job %s not moved: %s", jid, r)
                    break
                refitted.add(job["id"])
                later[0] = ((job, strat, again, why), reason)
            waiting = [it for it, _ in later]
        return done, refused

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
        self.decisions.record(jid, strat, jp, trigger)
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
            "telemetry": view.telemetry_note(),
        }

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
            self.jobs.set_fabric_check(True, None, drift)
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
