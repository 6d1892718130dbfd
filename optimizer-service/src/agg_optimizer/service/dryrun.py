"""Answers that change nothing: dry runs (the placements an apply would make now, and the
intents it would change) and what-if (a job under every strategy), computed once per view,
store version and question, and shared by concurrent identical requests."""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import Future
from typing import Any

from agg_optimizer.placement.engine import STRATEGIES, solve
from agg_optimizer.service.errors import Conflict, NotFound
from agg_optimizer.service.onos import OnosClient, intent_digest
from agg_optimizer.service.planner import Planner
from agg_optimizer.service.settings import Settings
from agg_optimizer.service.store import Store
from agg_optimizer.service.views import View, Views

log = logging.getLogger(__name__)


class DryRuns:
    def __init__(
        self, settings: Settings, store: Store, onos: OnosClient, views: Views, planner: Planner
    ) -> None:
        self.s, self.store, self.onos = settings, store, onos
        self.views, self.planner = views, planner
        # Dry runs: results by (view, store version, jobs), computed once for concurrent
        # identical requests (`_dry_lock`).
        self._dry: dict[tuple, bytes] = {}
        self._what_if: dict[tuple, dict[str, Any]] = {}
        # The newest answer per job list: (view time, store version, view seq, JSON).
        self._dry_last: dict[tuple | None, tuple[float, int, int, bytes]] = {}
        self._refreshing: set[tuple | None] = set()
        self._dry_lock = threading.Lock()
        self._dry_flight: dict[tuple, Future[bytes]] = {}

    def cached(self, job_ids: list[str] | None) -> bytes | None:
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
        fresh = self.views.cached()
        if fresh is not None and fresh.seq == seq:
            return data
        if time.monotonic() - at > 4 * max(self.s.view_max_age_s, 0.25):
            return None
        with self._dry_lock:
            if jobs not in self._refreshing:
                self._refreshing.add(jobs)
                threading.Thread(target=self._refresh, args=(job_ids, jobs), daemon=True).start()
        return data

    def _refresh(self, job_ids: list[str] | None, jobs: tuple | None) -> None:
        try:
            self.json(job_ids)
        except Exception as e:  # the next request takes the slow path and reports it
            log.debug("dry-run refresh failed: %s", e)
        finally:
            with self._dry_lock:
                self._refreshing.discard(jobs)

    def json(self, job_ids: list[str] | None) -> bytes:
        """The dry-run placements as the JSON the API answers, computed once per view,
        store version and job list; concurrent identical requests wait for one solve, and
        different ones do not wait for each other (nor for an apply)."""
        view = self.views.get(fresh=False)
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
            hit = json.dumps(self.plan(view, job_ids)).encode()
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
            at = self.views.kept_at(view)
            self._dry_last[key[2]] = (at, version, view.seq, hit)
            self._dry_flight.pop(key, None)
        mine.set_result(hit)
        return hit

    def plan(self, view: View, job_ids: list[str] | None) -> list[dict[str, Any]]:
        """A dry run: computed on the store as it is, outside the apply lock (an apply in
        progress never delays it; its job counts with the pools it may hold)."""
        results, placed = self.planner.computed(view, job_ids)
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
                    "telemetry": view.telemetry_note(),
                }
            )
        return results

    def what_if_cached(self, job_id: str) -> dict[str, Any] | None:
        """The what-if answer already computed for the current view and store, or None."""
        view = self.views.cached()
        if view is None:
            return None
        return self._what_if.get((view.seq, self.store.version, job_id))

    def what_if(self, job_id: str) -> dict[str, Any]:
        view = self.views.get(fresh=False)
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
        jobs = self.planner.placeable(view, jobs, unplaceable)
        if job_id in unplaceable:
            raise Conflict(f"job {job_id!r}: {unplaceable[job_id]}")
        inst = self.planner.instance(view, jobs)
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
                "telemetry": view.telemetry_note()}  # fmt: skip


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
