"""What the API does: jobs, placements applied as ONOS intents, reconcile, control loop."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from ..documents import Instance, Job, Placement, Telemetry, Topology
from ..engine import STRATEGIES, solve
from ..validation import InstanceError
from .onos import (
    AggregationApi,
    HostInfo,
    OnosClient,
    OnosError,
    OnosUnavailable,
    intent_digest,
    job_of_key,
    resolve_host,
)
from .settings import Settings
from .store import Store
from .telemetry import InfluxUnavailable, Snapshot, TelemetryReader

log = logging.getLogger(__name__)


class NotFound(LookupError):
    pass


class Conflict(ValueError):
    pass


class TooLarge(ValueError):
    pass


class BadField(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class Unavailable(RuntimeError):
    """A dependency is down; the message says which and what state was left."""


@dataclass
class View:
    topology: Topology
    hosts: dict[str, HostInfo]
    devices: dict[str, Any]
    snapshot: Snapshot | None
    telemetry_error: str | None = None


@dataclass
class LoopState:
    last_links: frozenset[tuple[str, str]] | None = None
    last_util: dict[tuple[str, str], float] = field(default_factory=dict)
    runs: int = 0
    last_trigger: str | None = None


class Service:
    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self.store = Store(settings.db_path)
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
        self.influx = TelemetryReader(
            settings.influx_url,
            settings.influx_token.get_secret_value(),
            settings.influx_org,
            settings.influx_bucket,
            settings.telemetry_window_s,
            settings.telemetry_stale_s,
        )
        self.apply_lock = threading.Lock()
        self.loop = LoopState()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.counters: dict[str, int] = {}

    def close(self) -> None:
        self.stop_loop()
        self.influx.close()
        self.store.close()

    # --- views ----------------------------------------------------------------------------

    def view(self, with_telemetry: bool = True) -> View:
        try:
            topo, hosts, devices = self.onos.topology()
        except OnosUnavailable as e:
            raise Unavailable(str(e)) from None
        snap, err = None, None
        if with_telemetry:
            try:
                snap = self.influx.snapshot(topo, devices)
            except InfluxUnavailable as e:
                err = str(e)
        return View(topo, hosts, devices, snap, err)

    def readiness(self) -> dict[str, str]:
        out = {}
        try:
            self.onos.ping()
            out["onos"] = "ok"
        except (OnosUnavailable, OnosError) as e:
            out["onos"] = str(e)
        out["influxdb"] = "ok" if self.influx.ping() else f"InfluxDB at {self.s.influx_url} down"
        return out

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
        view = self.view(with_telemetry=False)
        resolved = []
        for i, ref in enumerate(spec["workers"]):
            hid = resolve_host(ref, view.hosts)
            if hid is None:
                raise BadField(f"workers[{i}]", f"{ref!r} is no host known to ONOS")
            if hid in resolved:
                raise BadField(f"workers[{i}]", f"{ref!r} is host {hid} listed twice")
            resolved.append(hid)
        ps = resolve_host(spec["ps"], view.hosts)
        if ps is None:
            raise BadField("ps", f"{spec['ps']!r} is no host known to ONOS")
        if ps in resolved:
            raise BadField("ps", f"{spec['ps']!r} is also a worker")
        doc = {
            **spec,
            "workers": resolved,
            "ps": ps,
            "requested": {"workers": spec["workers"], "ps": spec["ps"]},
        }
        try:
            self.store.add_job(spec["id"], doc, strategy)
        except Exception as e:  # a concurrent create of the same id
            raise Conflict(f"id: job {spec['id']!r} exists") from e
        return self.get_job(spec["id"])

    def get_job(self, job_id: str) -> dict[str, Any]:
        job = self.store.job(job_id)
        if job is None:
            raise NotFound(f"job {job_id!r}")
        cur = self.store.current(job_id)
        job["placement_status"] = cur["status"] if cur else "none"
        return job

    def set_strategy(self, job_id: str, strategy: str) -> dict[str, Any]:
        if strategy not in STRATEGIES:
            raise BadField("strategy", f"unknown {strategy!r}; one of {', '.join(STRATEGIES)}")
        self.get_job(job_id)
        self.store.set_strategy(job_id, strategy)
        return self.get_job(job_id)

    def delete_job(self, job_id: str) -> dict[str, Any]:
        self.get_job(job_id)
        with self.apply_lock:
            try:
                ours = self.onos.our_intents()
                keys = set(self.store.intents(job_id)) | {
                    k for k in ours if job_of_key(k) == job_id
                }
                for key in sorted(keys):
                    self.onos.delete_intent(key)
                    self.store.drop_intent(key)
                agg = self.aggregation.remove(job_id)
            except OnosUnavailable as e:
                raise Unavailable(
                    f"{e}; job {job_id!r} kept, delete it again when ONOS is back"
                ) from None
            self.store.delete_job(job_id)
        return {"job_id": job_id, "intents_removed": len(keys), "aggregation": agg}

    # --- placements -----------------------------------------------------------------------

    def _instance(self, view: View, jobs: list[dict[str, Any]]) -> Instance:
        current = {}
        for j in jobs:
            cur = self.store.current(j["id"])
            if cur and cur["status"] in ("applied", "partial"):
                current[j["id"]] = [a["switch"] for a in cur["placement"]["aggregators"]]
        tel = view.snapshot.telemetry if view.snapshot else Telemetry()
        return Instance(
            topology=view.topology,
            telemetry=tel,
            jobs=[Job(**{k: v for k, v in j.items() if k in Job.model_fields}) for j in jobs],
            current=current,
            switching_penalty_s=self.s.switching_penalty_s,
        )

    def compute(
        self, view: View, job_ids: list[str] | None, strategy: str | None = None
    ) -> dict[str, tuple[str, Placement]]:
        """Placements by job id. Jobs are solved together with the other jobs of the same
        strategy (shared links and slot pools); a strategy override solves the asked jobs."""
        all_jobs = self.store.jobs()
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
        out: dict[str, tuple[str, Placement]] = {}
        for strat, jobs in groups.items():
            if not any(j["id"] in wanted for j in jobs):
                continue
            inst = self._instance(view, jobs)
            try:
                placement = solve(inst, strat)
            except InstanceError as e:
                # Jobs refer to hosts ONOS no longer knows, or became unreachable.
                idx = (
                    e.field.split("]")[0].removeprefix("jobs[")
                    if e.field.startswith("jobs[")
                    else ""
                )
                name = jobs[int(idx)]["id"] if idx.isdigit() else "?"
                raise Conflict(f"job {name!r}: {e.message} ({e.field})") from None
            for jp in placement.jobs:
                if jp.job_id in wanted:
                    out[jp.job_id] = (strat, placement)
        return out

    def place(
        self, job_ids: list[str] | None, dry_run: bool, trigger: str = "api"
    ) -> list[dict[str, Any]]:
        view = self.view()
        results = []
        with self.apply_lock:
            computed = self.compute(view, job_ids)
            for jid in sorted(computed):
                strat, placement = computed[jid]
                jp = next(p for p in placement.jobs if p.job_id == jid)
                job = self.store.job(jid)
                assert job is not None
                if dry_run:
                    bodies = self.onos.intent_bodies(jp, view.hosts, job["ps"])
                    stored = self.store.intents(jid)
                    results.append(
                        {
                            "job_id": jid,
                            "strategy": strat,
                            "status": "dry-run",
                            "placement": jp.model_dump(mode="json"),
                            "changes": _diff(bodies, stored),
                            "telemetry": _tel_note(view),
                        }
                    )
                    continue
                results.append(self._apply(view, job, strat, jp, trigger))
        return results

    def _apply(self, view: View, job: dict[str, Any], strat: str, jp: Any, trigger: str) -> dict:
        jid = job["id"]
        bodies = self.onos.intent_bodies(jp, view.hosts, job["ps"])
        doc = jp.model_dump(mode="json")
        stored = self.store.intents(jid)
        submitted: list[str] = []
        try:
            self.onos.register_app()
            in_onos = self.onos.our_intents()
            changes = _diff(bodies, stored, in_onos)
            for key in changes["submit"]:
                self.onos.submit(bodies[key])
                self.store.put_intent(key, jid, intent_digest(bodies[key]), bodies[key])
                submitted.append(key)
            states = self.onos.wait_installed(changes["submit"], self.s.intent_wait_s)
            for key in changes["delete"]:
                self.onos.delete_intent(key)
                self.store.drop_intent(key)
            aggregation = self.aggregation.apply(jp, strat)
        except OnosUnavailable as e:
            reason = (
                f"{e}: {len(submitted)} intent(s) submitted before the failure; the state is "
                "recorded as partial and reconciled on the next apply or restart"
            )
            self.store.add_placement(jid, strat, "partial", reason, doc)
            self._count("placements_partial")
            raise Unavailable(reason) from None
        except OnosError as e:
            reason = f"ONOS rejected a request: {e}"
            self.store.add_placement(jid, strat, "failed", reason, doc)
            raise Unavailable(reason) from None
        failed = [s for s in states if s.state != "INSTALLED"]
        status = "applied" if not failed else "failed"
        reason = "; ".join(f"{s.key}: {s.state} ({s.reason})" for s in failed) or None
        self.store.add_placement(jid, strat, status, reason, doc)
        self._count(f"placements_{status}")
        self._decision(jid, strat, jp, trigger)
        return {
            "job_id": jid,
            "strategy": strat,
            "status": status,
            "reason": reason,
            "placement": doc,
            "changes": {k: v for k, v in changes.items()},
            "intents": [s.__dict__ for s in states],
            "aggregation": aggregation,
            "telemetry": _tel_note(view),
        }

    def _decision(self, jid: str, strat: str, jp: Any, trigger: str) -> None:
        bucket = self.s.decisions_bucket or self.s.influx_bucket
        try:
            self.influx.write_decision(
                bucket, jid, strat, [a.switch for a in jp.aggregators], jp.predicted_cct_s, trigger
            )
        except InfluxUnavailable as e:
            log.warning("decision for %s not written: %s", jid, e)
            self._count("decisions_unwritten")

    def what_if(self, job_id: str) -> dict[str, Any]:
        self.get_job(job_id)
        view = self.view()
        jobs = self.store.jobs()
        inst = self._instance(view, jobs)
        inst = inst.model_copy(update={"current": {}, "switching_penalty_s": 0.0})
        out = {}
        for strat in STRATEGIES:
            p = solve(inst, strat)
            jp = next(x for x in p.jobs if x.job_id == job_id)
            out[strat] = {
                "predicted_cct_s": jp.predicted_cct_s,
                "aggregators": [a.switch for a in jp.aggregators],
            }
        return {"job_id": job_id, "strategies": out, "telemetry": _tel_note(view)}

    # --- reconcile ------------------------------------------------------------------------

    def reconcile(self) -> dict[str, Any]:
        """Make ONOS hold exactly the intents the store says are applied: orphans (ours in
        ONOS, unknown or of a deleted job) are withdrawn, missing ones resubmitted."""
        with self.apply_lock:
            try:
                self.onos.register_app()
                in_onos = self.onos.our_intents()
                stored = self.store.intents()
                jobs = {j["id"] for j in self.store.jobs()}
                removed, resubmitted = [], []
                for key in sorted(in_onos):
                    if key not in stored or stored[key][0] not in jobs:
                        self.onos.delete_intent(key)
                        removed.append(key)
                for key, (jid, _) in sorted(stored.items()):
                    if jid not in jobs:
                        self.store.drop_intent(key)
                    elif key not in in_onos or in_onos[key] in ("WITHDRAWN", "FAILED"):
                        body = self.store.intent_body(key)
                        if body:
                            self.onos.submit(body)
                            resubmitted.append(key)
                states = self.onos.wait_installed(resubmitted, self.s.intent_wait_s)
            except OnosUnavailable as e:
                raise Unavailable(f"reconcile: {e}") from None
            for jid in jobs:
                cur = self.store.current(jid)
                if cur and cur["status"] == "partial":
                    ok = all(s.state == "INSTALLED" for s in states if job_of_key(s.key) == jid)
                    self.store.add_placement(
                        jid,
                        cur["strategy"],
                        "applied" if ok else "failed",
                        "reconciled after a partial apply",
                        cur["placement"],
                    )
        self._count("reconciles")
        return {
            "removed": removed,
            "resubmitted": resubmitted,
            "failed": [s.__dict__ for s in states if s.state != "INSTALLED"],
        }

    # --- control loop ---------------------------------------------------------------------

    def step(self) -> dict[str, Any]:
        """One pass of the control loop: re-place applied jobs when the topology changed or
        a link's utilisation moved past the threshold (or when the period elapsed)."""
        view = self.view()
        links = frozenset((ln.src, ln.dst) for ln in view.topology.links)
        util = {}
        if view.snapshot:
            util = {(t.src, t.dst): t.utilization for t in view.snapshot.telemetry.links}
        trigger = "periodic"
        if self.loop.last_links is not None and links != self.loop.last_links:
            trigger = "topology"
        elif any(
            abs(u - self.loop.last_util.get(k, 0.0)) >= self.s.utilization_threshold
            for k, u in util.items()
        ) or any(
            k not in util and u >= self.s.utilization_threshold
            for k, u in self.loop.last_util.items()
        ):
            trigger = "telemetry"
        self.loop.last_links, self.loop.last_util = links, util
        self.loop.runs += 1
        self.loop.last_trigger = trigger
        active = ("applied", "partial", "failed")
        placed = [
            j["id"]
            for j in self.store.jobs()
            if (c := self.store.current(j["id"])) and c["status"] in active
        ]
        changed = []
        if placed:
            with self.apply_lock:
                computed = self.compute(view, placed)
                for jid, (strat, placement) in sorted(computed.items()):
                    jp = next(p for p in placement.jobs if p.job_id == jid)
                    cur = self.store.current(jid)
                    old = cur["placement"] if cur else None
                    new = jp.model_dump(mode="json")
                    if (
                        cur
                        and cur["status"] == "applied"
                        and old["aggregators"] == new["aggregators"]
                        and old["worker_paths"] == new["worker_paths"]
                    ):
                        continue
                    job = self.store.job(jid)
                    self._apply(view, job, strat, jp, trigger)
                    changed.append(jid)
        self._count("loop_runs")
        return {"trigger": trigger, "jobs": placed, "changed": changed}

    def start_loop(self) -> None:
        if self.s.reoptimize_period_s <= 0 or self._thread:
            return
        self._thread = threading.Thread(target=self._run, name="reoptimize", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.s.reoptimize_period_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.step()
            except Exception as e:  # the loop must survive ONOS or InfluxDB outages
                log.warning("re-optimisation skipped: %s", e)
                self._count("loop_errors")

    def stop_loop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread:
            self._thread.join(10)
            self._thread = None

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1


def _diff(
    bodies: dict[str, dict[str, Any]],
    stored: dict[str, tuple[str, str]],
    in_onos: dict[str, str] | None = None,
) -> dict[str, list[str]]:
    submit, unchanged = [], []
    for key, body in sorted(bodies.items()):
        same = key in stored and stored[key][1] == intent_digest(body)
        present = in_onos is None or in_onos.get(key) in ("INSTALLED", "INSTALLING", "COMPILING")
        (unchanged if same and present else submit).append(key)
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
