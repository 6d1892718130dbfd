"""The service's jobs as users see them: registration (hosts resolved against ONOS's
topology, every bad field named), a job's record with the status of its placement as last
compared with ONOS (`observed`), its strategy, and the progress it reports."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from agg_optimizer.placement.engine import STRATEGIES
from agg_optimizer.service.errors import BadField, Conflict, NotFound, TooLarge, Unavailable
from agg_optimizer.service.settings import Settings
from agg_optimizer.service.store import Store
from agg_optimizer.service.views import Views

log = logging.getLogger(__name__)


class Jobs:
    """`stage_ended()`: a job reported the end of a stage (the scheduler re-orders now)."""

    def __init__(
        self, settings: Settings, store: Store, views: Views, stage_ended: Callable[[], None]
    ) -> None:
        self.s, self.store, self.views, self._stage_ended = settings, store, views, stage_ended
        self._check_cache: tuple[float, dict[str, Any] | None] | None = None

    def create(self, spec: dict[str, Any], strategy: str) -> dict[str, Any]:
        if strategy not in STRATEGIES:
            raise BadField("strategy", f"unknown {strategy!r}; one of {', '.join(STRATEGIES)}")
        if len(spec["workers"]) > self.s.max_workers_per_job:
            raise TooLarge(f"workers: {len(spec['workers'])} > limit {self.s.max_workers_per_job}")
        if self.store.job(spec["id"]) is not None:
            raise Conflict(f"id: job {spec['id']!r} exists")
        if self.store.count_jobs() >= self.s.max_jobs:
            raise TooLarge(f"jobs: the limit of {self.s.max_jobs} jobs is reached")
        view = self.views.for_hosts()
        refs = [*spec["workers"], spec["ps"]]
        if any(view.host_index.resolve(r) is None for r in refs):
            # a host ONOS may have learnt since that view: ask ONOS before refusing it
            view = self.views.for_hosts(since=time.monotonic())
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
        return self.get(spec["id"])

    def get(self, job_id: str) -> dict[str, Any]:
        job = self.store.job(job_id)
        if job is None:
            raise NotFound(f"job {job_id!r}")
        cur = self.observed(self.store.current(job_id))
        job["placement_status"] = cur["status"] if cur else "none"
        if cur and cur["status"] == "repairing":
            job["repairing"] = cur["repairing"]
        return job

    def observed(self, cur: dict[str, Any] | None) -> dict[str, Any] | None:
        """The job's current placement as the API reports it: a recorded `applied` or
        `intents-only` reads `repairing` (with `recorded_status` and why) while the last
        comparison with ONOS did not see it held (ONOS gone or restarted since, the app
        absent, the job's repair failed), until a reconcile or a new apply sees it again."""
        if cur is None or cur["status"] not in ("applied", "intents-only"):
            return cur
        check = self.fabric_check()
        if check is None or cur["seq"] > check["seq"]:
            return cur  # never compared, or converged (and seen) after the comparison
        why = check["drift"].get(cur["job_id"]) if check["verified"] else check["reason"]
        if why is None:
            return cur
        return {**cur, "status": "repairing", "recorded_status": cur["status"], "repairing": why}

    def fabric_check(self) -> dict[str, Any] | None:
        """The store's record, read at most every 0.2 s (`GET /jobs` reads it per job);
        this instance's own writes are seen at once, another replica's within that."""
        now = time.monotonic()
        hit = self._check_cache
        if hit is None or now - hit[0] > 0.2:
            hit = self._check_cache = (now, self.store.fabric_check())
        return hit[1]

    def set_fabric_check(self, verified: bool, reason: str | None,
                          drift: dict[str, str] | None = None) -> None:  # fmt: skip
        self.store.set_fabric_check(verified, reason, drift)
        self._check_cache = None

    def unverified(self, reason: str) -> None:
        """From now until a reconcile succeeds, no placement recorded so far reads as held."""
        try:
            self.set_fabric_check(False, f"{reason}; not yet compared again")
        except Exception as e:  # the database is down: readiness says so
            log.warning("could not record that ONOS is unverified: %s", e)

    def set_strategy(self, job_id: str, strategy: str) -> dict[str, Any]:
        if strategy not in STRATEGIES:
            raise BadField("strategy", f"unknown {strategy!r}; one of {', '.join(STRATEGIES)}")
        self.get(job_id)
        self.store.set_strategy(job_id, strategy)
        return self.get(job_id)

    def report_progress(self, job_id: str, doc: dict[str, Any]) -> dict[str, Any]:
        """Store what a job says of its training (the scheduler's progress and stage)."""
        self.get(job_id)
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
            self._stage_ended()  # a stage ended: the order changes now, not later
        return {"job_id": job_id, **self.store.progress()[job_id]}
