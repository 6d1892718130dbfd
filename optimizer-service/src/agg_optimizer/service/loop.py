"""The control loop: re-places applied jobs when the topology changes or link utilisation
moves past the threshold (and every period), with hysteresis, after reconciling ONOS with
the desired state (docs/service.md)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from agg_optimizer.model.documents import Job, JobPlacement
from agg_optimizer.model.network import Network
from agg_optimizer.model.pools import Claim, doc_claims, overlaps
from agg_optimizer.model.trees import cct_of
from agg_optimizer.placement.shared import EXACT_MAX_JOBS, shared_ccts
from agg_optimizer.service.errors import Unavailable
from agg_optimizer.service.lease import Lease
from agg_optimizer.service.onos import OnosClient, OnosUnavailable
from agg_optimizer.service.planner import Planner
from agg_optimizer.service.settings import Settings
from agg_optimizer.service.store import HOLDING, Store
from agg_optimizer.service.views import View

log = logging.getLogger(__name__)

# After a pass that could not finish, the next comes this soon, then twice as late each
# time up to the period (`ControlLoop._run`).
RETRY_FIRST_S = 2.0
# A wake (`ControlLoop.wake`) starts a pass at once, but not sooner than this after the
# last pass ended: an ONOS that flaps wakes the loop on every return, and without a gap the
# passes would run back to back for as long as it flaps.
WAKE_GAP_S = 2.0


@dataclass
class LoopState:
    last_links: frozenset[tuple[str, str]] | None = None
    last_util: dict[tuple[str, str], float] = field(default_factory=dict)
    runs: int = 0
    last_trigger: str | None = None


class Service(Protocol):
    """What the loop uses of the service (`core.Service`, which owns the loop): a
    protocol, so that the loop imports nothing of the module above it."""

    s: Settings
    store: Store
    onos: OnosClient
    lease: Lease
    apply_lock: Any
    _stop: threading.Event
    view: Callable[..., View]
    reconcile: Callable[[], dict[str, Any]]
    apply_all: Callable[..., Any]
    planner: Planner
    _worth_moving: Callable[..., bool]
    _count: Callable[[str], None]


class ControlLoop:
    def __init__(self, svc: Service) -> None:
        self.svc = svc
        self.state = LoopState()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        # `worth_moving`'s network of the view in force: the whole fabric compiled once
        # per view, not once per job judged (0.6 s each at k=64).
        self._net: tuple[int, Network] | None = None
        self._net_lock = threading.Lock()

    def step(self) -> dict[str, Any]:
        """One pass of the control loop: re-place applied jobs when the topology changed or
        a link's utilisation moved past the threshold (or when the period elapsed)."""
        try:
            return self._step()
        finally:
            self._net = None  # the pass's network is not kept until the next one

    def _step(self) -> dict[str, Any]:
        view = self.svc.view()
        links = frozenset((ln.src, ln.dst) for ln in view.topology.links)
        util = {}
        if view.snapshot:
            util = {(t.src, t.dst): t.utilization for t in view.snapshot.telemetry.links}
        trigger = "periodic"
        returned = False  # links (a switch, a link) came back since the last pass
        if self.state.last_links is not None and links != self.state.last_links:
            trigger = "topology"
            returned = bool(links - self.state.last_links)
        elif any(
            abs(u - self.state.last_util.get(k, 0.0)) >= self.svc.s.utilization_threshold
            for k, u in util.items()
        ) or any(
            k not in util and u >= self.svc.s.utilization_threshold
            for k, u in self.state.last_util.items()
        ):
            trigger = "telemetry"
        self.state.last_links, self.state.last_util = links, util
        self.state.runs += 1
        self.state.last_trigger = trigger
        active = (*HOLDING, "failed")
        deleting = self.svc.store.deleting()
        currents = self.svc.store.currents()
        placed = [
            j["id"]
            for j in self.svc.store.jobs()
            if (c := currents.get(j["id"])) and c["status"] in active
            and j["id"] not in deleting
        ]  # fmt: skip
        changed, kept, restored = [], [], []
        errors: dict[str, str] = {}
        repairs = self.svc.reconcile()
        unplaceable: dict[str, str] = {}
        if placed:
            with self.svc.apply_lock:
                try:
                    in_onos = self.svc.onos.our_intents()
                except OnosUnavailable as e:
                    raise Unavailable(str(e)) from None
                stored = self.svc.store.intents()
                computed = self.svc.planner.compute(view, placed, unplaceable=unplaceable)
                # Capacity came back: judged one by one on telemetry that shows no
                # congestion yet, no job gains, and load stays where the outage put it.
                # Judged together, sharing the fabric, the jobs may gain (`joint_gain`).
                joint = returned and self.joint_gain(view, computed)
                moves: dict[str, tuple[str, Any]] = {}  # job -> (strategy, new placement)
                stay: dict[str, list[dict]] = {}  # job -> the aggregators it keeps
                for jid, (strat, placement) in sorted(computed.items()):
                    jp = next(p for p in placement.jobs if p.job_id == jid)
                    cur = self.svc.store.current(jid)
                    old = cur["placement"] if cur else None
                    new = jp.model_dump(mode="json")
                    job = self.svc.store.job(jid)
                    assert job is not None
                    # Intents ONOS lost (restarted without its state, or withdrawn them).
                    lost = any(
                        j == jid and in_onos.get(k) not in ("INSTALLED", "INSTALLING", "COMPILING")
                        for k, (j, _) in stored.items()
                    )
                    if cur and cur["status"] == "applied":
                        same = (
                            old["aggregators"] == new["aggregators"]
                            and old["worker_paths"] == new["worker_paths"]
                        )
                        rerouted = old["worker_paths"] != new["worker_paths"] or [
                            a["switch"] for a in old["aggregators"]
                        ] != [a["switch"] for a in new["aggregators"]]
                        if (
                            same
                            or (joint and not rerouted)
                            or (not joint and not self.svc._worth_moving(view, job, old, new))
                        ):
                            stay[jid] = old["aggregators"]
                            if not lost:
                                kept += [] if same else [jid]
                                continue
                            jp = JobPlacement.model_validate(old)  # put it back as it was
                            restored.append(jid)
                    moves[jid] = (strat, jp)
                self.around_stayers(view, moves, stay, kept)
                items = []
                for jid, (strat, jp) in sorted(moves.items()):
                    job = self.svc.store.job(jid)
                    if job is not None:
                        items.append((job, strat, jp, "restore" if jid in restored else trigger))
                # ONOS failing one job leaves it in `errors`; the others still move.
                done, refused = self.svc.apply_all(view, items, errors)
                errors.update(refused)
                changed += sorted(done)
        self.svc._count("loop_runs")
        for jid, why in sorted(unplaceable.items()):
            log.warning("loop: job %s cannot be placed: %s", jid, why)
        return {
            "trigger": trigger,
            "jobs": placed,
            "changed": changed,
            "kept": kept,
            "restored": restored,
            "unplaceable": unplaceable,
            "errors": errors,
            "repaired": repairs["repaired"],
        }

    def around_stayers(
        self,
        view: View,
        moves: dict[str, tuple[str, Any]],
        stay: dict[str, list[dict]],
        kept: list[str],
    ) -> None:
        """The loop solves all placed jobs together, then keeps those whose move does not
        pay: a mover's new pools were given as if the kept jobs' pools were free, and may be
        the very registers a kept job sums into. Until no mover's new pools overlap a pool
        some job keeps (or another mover's), the movers are solved again holding every
        pool but their own (`compute` holds the pools of the jobs it is not asked to
        place); a mover whose new placement then no longer pays keeps its own, and the
        others are checked against it again: a drop after a re-solve frees nothing.

        Ends: each round either finds no overlap, or re-solves a smaller set of movers, or
        (a set solved already and still overlapping, which `compute` does not allow) drops
        the movers that overlap."""
        solved: frozenset[str] | None = None
        while True:
            movers = sorted(j for j in moves if j not in stay)
            clash = self.clashing(moves, movers)
            if not clash:
                return
            if solved == frozenset(movers):
                for jid in clash:
                    log.error(
                        "job %s stays where it is: its new pools overlap a pool another "
                        "job holds, even solved around them", jid,
                    )  # fmt: skip
                    del moves[jid]
                continue
            log.info("re-solving %s around the pools of the jobs the loop keeps", movers)
            again = self.svc.planner.compute(view, movers, unplaceable={})
            solved = frozenset(movers)
            for jid in movers:
                if jid not in again:  # no room around the kept pools: it stays as it is
                    del moves[jid]
                    continue
                strat, placement = again[jid]
                jp = next(p for p in placement.jobs if p.job_id == jid)
                cur = self.svc.store.current(jid)
                job = self.svc.store.job(jid)
                assert job is not None
                if (
                    cur
                    and cur["status"] == "applied"
                    and not self.svc._worth_moving(
                        view, job, cur["placement"], jp.model_dump(mode="json")
                    )
                ):
                    del moves[jid]
                    kept.append(jid)
                else:
                    moves[jid] = (strat, jp)

    def clashing(self, moves: dict[str, tuple[str, Any]], movers: list[str]) -> list[str]:
        """The movers whose new pools overlap a pool of a job that does not move now (its
        current one, and while its apply is pending the one it moves to) or another
        mover's new pool."""
        if not movers:
            return []
        held = self.svc.planner.held(self.svc.store.jobs(), set(movers))
        claims: list[Claim] = [
            (owner, sw, p.base, p.base + p.size) for sw, ps in held.items() for owner, p in ps
        ]
        for jid in movers:
            claims += doc_claims(jid, moves[jid][1].model_dump(mode="json"))
        mine = set(movers)
        return sorted({c[0] for pair in overlaps(claims) for c in pair if c[0] in mine})

    def joint_gain(self, view: View, computed: dict[str, tuple[str, Any]]) -> bool:
        """Whether the jobs' new placements, all sharing the fabric (`shared_ccts`: max-min
        fair shares on the capacity the background leaves), give a mean predicted CCT
        `min_improvement` (and at least `min_improvement_s`) below their applied ones'.
        Judged over the applied jobs the loop re-placed, up to `EXACT_MAX_JOBS` of them
        (above that, or where an applied placement no longer fits, each job is judged
        alone as before)."""
        olds, news, specs = [], [], []
        for jid, (_, placement) in sorted(computed.items()):
            cur = self.svc.store.current(jid)
            job = self.svc.store.job(jid)
            if not cur or cur["status"] != "applied" or job is None:
                continue
            olds.append(JobPlacement.model_validate(cur["placement"]))
            news.append(next(p for p in placement.jobs if p.job_id == jid))
            specs.append(job)
        if not olds or len(olds) > EXACT_MAX_JOBS:
            return False
        inst = self.svc.planner.instance(view, specs)
        try:
            before, after = shared_ccts(inst, olds), shared_ccts(inst, news)
        except (KeyError, ValueError, IndexError) as e:  # an applied path off the fabric
            log.info("joint re-placement not judged: %s", e)
            return False
        if not before or not after:
            return False
        b = sum(before.values()) / len(before)
        a = sum(after.values()) / len(after)
        move = a < b * (1.0 - self.svc.s.min_improvement) and b - a >= self.svc.s.min_improvement_s
        log.info(
            "capacity returned: %d jobs sharing the fabric, mean predicted transfer %.4f s "
            "as applied, %.4f s re-placed together: %s",
            len(olds), b, a, "moving them" if move else "keeping them",
        )  # fmt: skip
        return move

    def worth_moving(self, view: View, job: dict[str, Any], old: dict, new: dict) -> bool:
        """Whether the new placement's predicted CCT is `min_improvement` (and at least
        `min_improvement_s`) below the applied one's, both judged alone on this view's link
        state; a placement that no longer fits the fabric is always left."""
        net = self.network(view)
        spec = Job(**{k: v for k, v in job.items() if k in Job.model_fields})

        def cct(doc: dict) -> float | None:
            aggs = {a["switch"] for a in doc["aggregators"]}
            return cct_of(net, spec, doc["worker_paths"], aggs)

        before, after = cct(old), cct(new)
        if before is None or after is None:
            return True
        move = after < before * (1.0 - self.svc.s.min_improvement) and (
            before - after >= self.svc.s.min_improvement_s
        )
        if move:
            log.info(
                "moving job %s: predicted CCT %.4f s -> %.4f s on this view's link state "
                "(aggregators %s -> %s)",
                job["id"], before, after,
                [a["switch"] for a in old["aggregators"]],
                [a["switch"] for a in new["aggregators"]],
            )  # fmt: skip
        return move

    def network(self, view: View) -> Network:
        """The view's link state as one job alone sees it (no pools held, so the same for
        every job), compiled once per view."""
        with self._net_lock:
            if self._net is None or self._net[0] != view.seq:
                self._net = (view.seq, Network.from_instance(self.svc.planner.instance(view, [])))
            return self._net[1]

    def start(self) -> None:
        if self.svc.s.reoptimize_period_s <= 0 or self._thread:
            return
        self._thread = threading.Thread(target=self._run, name="reoptimize", daemon=True)
        self._thread.start()

    def wake(self, why: str) -> None:
        """A pass now rather than at the period's end (ONOS answered again, say)."""
        log.info("control loop woken: %s", why)
        self.svc._count("loop_wakes")
        self._wake.set()

    def unsettled(self) -> list[str]:
        """Jobs whose apply is unfinished, waiting on ONOS or its app (`partial`,
        `intents-only`), and not being deleted."""
        return self.svc.store.unsettled(("partial", "intents-only"))

    def _run(self) -> None:
        period = self.svc.s.reoptimize_period_s
        retry = RETRY_FIRST_S
        wait = period
        ended = -WAKE_GAP_S
        while not self.svc._stop.is_set():
            if self._wake.wait(wait):
                gap = WAKE_GAP_S - (time.monotonic() - ended)
                if gap > 0:
                    self.svc._stop.wait(gap)
            self._wake.clear()
            if self.svc._stop.is_set():
                break
            if not self.svc.lease.leading:
                wait = period
                continue
            try:
                out = self.step()
                pending = bool(out["errors"]) or bool(self.unsettled())
            except Exception as e:  # the loop must survive ONOS or InfluxDB outages
                log.warning("re-optimisation skipped: %s", e)
                self.svc._count("loop_errors")
                pending = True
            # A pass that could not finish (a dependency down, a job short of `applied`)
            # comes again sooner: after 2, 4, 8, ... s, never later than the period.
            if pending:
                wait, retry = min(period, retry), retry * 2
            else:
                wait, retry = period, RETRY_FIRST_S
            ended = time.monotonic()

    def stop(self) -> None:
        self._wake.set()
        if self._thread:
            self._thread.join(10)
            self._thread = None
