"""Where the service's jobs go: the instance a view and the store make, the joint solves
of each strategy's jobs (shared between concurrent callers with the same inputs), and the
slot pools fitted around those other jobs hold, so that no two jobs ever share a register."""

from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import Future
from typing import Any

from agg_optimizer.model.documents import (
    Instance,
    Job,
    JobPlacement,
    Placement,
    SlotPool,
    Telemetry,
    Topology,
)
from agg_optimizer.model.pools import PoolAllocator
from agg_optimizer.model.validation import InstanceError, check_instance
from agg_optimizer.placement.engine import solve
from agg_optimizer.service.errors import Conflict, NotFound
from agg_optimizer.service.settings import Settings
from agg_optimizer.service.store import HOLDING, PENDING, Store
from agg_optimizer.service.views import View

log = logging.getLogger(__name__)


class Planner:
    def __init__(self, settings: Settings, store: Store) -> None:
        self.s, self.store = settings, store
        # Solves in progress, by everything they read: a request that needs the same solve
        # (per-job dry runs of one strategy share their group's joint solve) waits for it
        # instead of repeating it. Nothing is kept once a solve ends: no cache.
        self._solve_lock = threading.Lock()
        self._solve_flight: dict[tuple, Future[tuple[Placement | None, dict[str, str]]]] = {}

    def instance(
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
        held = self.held(all_jobs, wanted)  # switch -> [(owner, pool)]
        out: dict[str, tuple[str, Placement]] = {}
        for strat, jobs in groups.items():
            if not any(j["id"] in wanted for j in jobs):
                continue
            members = {j["id"] for j in jobs}
            everything = _pools(held)
            # First as if the group's other jobs held nothing (they are solved here too, so
            # counting their applied pools again would take their slots twice); if the asked
            # jobs' pools then cannot avoid those applied pools, solve again holding them.
            placement = self.solve_isolating(
                view, jobs, strat, unplaceable, _pools(held, but=members)
            )
            if placement is not None and not self.fit_pools(view, placement, wanted, everything):
                placement = self.solve_isolating(view, jobs, strat, unplaceable, everything)
                if placement is not None and not self.fit_pools(
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

    def held(
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

    def fit_pools(
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

    def solve_isolating(
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
                ok = self.placeable(view, jobs, left_out)
                result = (
                    solve(self.instance(view, ok, reserved), strat, polish=False) if ok else None,
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
        # `fit_pools` replaces a job's aggregator list, never edits it: a copy per job will do.
        return placement.model_copy(update={"jobs": [jp.model_copy() for jp in placement.jobs]})

    def placeable(
        self, view: View, jobs: list[dict[str, Any]], unplaceable: dict[str, str]
    ) -> list[dict[str, Any]]:
        """`jobs` without those the instance check rejects (reasons in `unplaceable`). An
        error that names no single job (`current.<id>`, say) leaves out the job it names,
        or, naming none, every job: one job's trouble never blocks the others'."""
        jobs = list(jobs)
        while jobs:
            try:
                check_instance(self.instance(view, jobs))
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

    def refit(self, view: View, jid: str, jp: JobPlacement) -> JobPlacement | None:
        """`jp` with pools fitted first-fit around every pool any other job holds now."""
        slots = {n.id: n.slots for n in view.topology.nodes if n.kind == "switch"}
        alloc = PoolAllocator(slots, _pools(self.held(self.store.jobs(), {jid})))
        try:
            aggs = [
                a.model_copy(update={"pool": alloc.take(a.switch, a.pool.size)})
                for a in jp.aggregators
            ]
        except (ValueError, KeyError) as e:
            log.info("job %s: pools not fitted around the held ones: %s", jid, e)
            return None
        return jp.model_copy(update={"aggregators": aggs})

    def computed(
        self, view: View, job_ids: list[str] | None
    ) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], str, JobPlacement]]]:
        """The results of the jobs left out, and (job, strategy, placement) of the others,
        in job order (a job deleted since the solve began is skipped)."""
        unplaceable: dict[str, str] = {}
        computed = self.compute(view, job_ids, unplaceable=unplaceable)
        results = self.unplaceable(job_ids, unplaceable, computed)
        placed = []
        for jid in sorted(computed):
            strat, placement = computed[jid]
            job = self.store.job(jid)
            if job is not None:
                placed.append((job, strat, next(p for p in placement.jobs if p.job_id == jid)))
        return results, placed

    @staticmethod
    def unplaceable(
        job_ids: list[str] | None, unplaceable: dict[str, str], computed: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """The results of the jobs left out; a Conflict when every asked job was."""
        bad = sorted(j for j in unplaceable if not job_ids or j in job_ids)
        if bad and not computed:
            raise Conflict("; ".join(f"job {j!r}: {unplaceable[j]}" for j in bad))
        return [{"job_id": j, "status": "unplaceable", "reason": unplaceable[j]} for j in bad]


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
