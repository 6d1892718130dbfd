"""Desired state and reconcile: every rule of what the service may send to ONOS, in one place.

A job's target placement is recorded first (`Store.set_desired`); `converge` then moves the
fabric towards it step by step, each step recorded before it is taken, and `reconcile`
compares what ONOS holds (intent states, the app's aggregation documents) with what the
store wants and repairs any difference. So a crash between any two steps (the steps are the
`fault` points) is repaired by one reconcile, the way ONOS's intent framework and
Kubernetes controllers work (docs/service.md, "Desired state and reconcile").

Ownership: an intent of the service's ONOS app id belongs to this store only if the store
recorded its key before submitting it. Reconcile withdraws only what it owns; intents of the
app id that the store never recorded are `foreign` (another instance with another database
may own them) and are left alone unless `withdraw_foreign_intents` is set.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agg_optimizer.model.documents import JobPlacement
from agg_optimizer.service.onos import (
    AggregationApi,
    IntentResult,
    OnosClient,
    OnosError,
    OnosUnavailable,
    PriorityApi,
    intent_digest,
    intent_shape,
    job_of_key,
)
from agg_optimizer.service.settings import Settings
from agg_optimizer.service.store import CONVERGED, DELETING, PENDING, Store

log = logging.getLogger(__name__)

# States under which ONOS holds (or is about to hold) an intent we submitted.
LIVE = ("INSTALLED", "INSTALLING", "COMPILING", "INSTALL_REQ")
# ONOS holds the intent but cannot install it (no path meets its waypoints: a switch or a
# link on it left); ONOS 2.7 says CORRUPT when a device of it went away. Re-placing the job
# is the control loop's work, not reconcile's: submitting it again changes nothing.
STUCK = ("FAILED", "CORRUPT")


class Killed(BaseException):
    """Raised by an in-process fault (tests): the service stops dead at that step."""


@dataclass
class Outcome:
    status: str
    reason: str | None
    changes: dict[str, list[str]]
    states: list[IntentResult]
    aggregation: str


@dataclass
class Repairs:
    removed: list[str] = field(default_factory=list)
    resubmitted: list[str] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    failed: list[IntentResult] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # job -> what ONOS refused


class Partial(RuntimeError):
    """ONOS went away mid-converge; what was sent before is recorded (the job is pending)."""

    def __init__(self, message: str, submitted: int) -> None:
        super().__init__(message)
        self.submitted = submitted


class Applier:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        onos: OnosClient,
        aggregation: AggregationApi,
        priority: PriorityApi,
        count: Callable[[str], None],
    ) -> None:
        self.s = settings
        self.store = store
        self.onos = onos
        self.aggregation = aggregation
        self.priority = priority
        self._count = count
        self._hits = 0
        self._fault_lock = threading.Lock()
        # Tests replace this to stop the service at a step without a process to kill.
        self.on_fault: Callable[[int, str], None] | None = None

    # --- fault points ---------------------------------------------------------------------

    def fault(self, point: str) -> None:
        """A step boundary. `fault_trace` lists the points passed (one per line);
        `fault_kill_at` = N kills the process with SIGKILL at the N-th (tests only)."""
        trace, kill_at = self.s.fault_trace, self.s.fault_kill_at
        if trace is None and kill_at is None and self.on_fault is None:
            return
        with self._fault_lock:
            self._hits += 1
            n = self._hits
        if trace is not None:
            with Path(trace).open("a") as f:
                f.write(f"{n} {point}\n")
        if self.on_fault is not None:
            self.on_fault(n, point)
        if kill_at is not None and n == kill_at:
            log.warning("fault injection: SIGKILL at step %d (%s)", n, point)
            os.kill(os.getpid(), signal.SIGKILL)

    # --- one job --------------------------------------------------------------------------

    def desire(
        self, jid: str, strategy: str, jp: JobPlacement, bodies: dict[str, dict[str, Any]]
    ) -> int:
        gen = self.store.set_desired(jid, strategy, jp.model_dump(mode="json"), bodies)
        self.fault("desired-recorded")
        return gen

    def converge(self, jid: str) -> Outcome:
        """Move ONOS to the job's desired placement: submit what it lacks, withdraw what the
        job no longer wants, write the aggregation document, then record the outcome.
        Idempotent: after a crash, calling it again finishes the work."""
        d = self.store.desired(jid)[jid]
        gen, strat, doc, bodies = d["generation"], d["strategy"], d["placement"], d["bodies"]
        jp = JobPlacement.model_validate(doc)
        submitted: list[str] = []
        try:
            self.onos.register_app()
            held = self.onos.our_intent_docs()
            owned = self.store.intents(jid)
            # What ONOS holds decides, not what we sent: an intent changed in ONOS under our
            # key (another writer, an operator) is submitted again.
            submit = [
                k
                for k in sorted(bodies)
                if owned.get(k, ("", ""))[1] != intent_digest(bodies[k])
                or held.get(k, {}).get("state") not in LIVE
                or intent_shape(held[k]) != intent_shape(bodies[k])
            ]
            unchanged = sorted(set(bodies) - set(submit))
            for key in submit:
                self.store.own_intent(key, jid, bodies[key])
                self.fault("intent-owned")
                self.onos.submit(bodies[key])
                submitted.append(key)
                self.fault("intent-submitted")
                self.store.confirm_intent(key, intent_digest(bodies[key]))
                self.fault("intent-confirmed")
            states = self.onos.wait_installed(submit, self.s.intent_wait_s, bodies=bodies)
            self.fault("intents-waited")
            every = self.store.owned()
            mine = {k for k, (j, _) in every.items() if j == jid}
            stale = sorted(mine - set(bodies))
            for key in stale:
                self._withdraw(key)
            aggregation = self.aggregation.apply(jp, strat)
            self.fault("aggregation-posted")
        except OnosUnavailable as e:
            raise Partial(str(e), len(submitted)) from None
        failed = [s for s in states if s.state != "INSTALLED"]
        status = "applied" if not failed else "failed"
        reason = "; ".join(f"{s.key}: {s.state} ({s.reason})" for s in failed) or None
        if not failed and jp.aggregators and aggregation != "applied":
            # The paths are in place but no switch sums: the job runs, without aggregation.
            status = "intents-only"
            reason = (
                f"aggregation not applied ({aggregation}): the innet-agg app's REST resource "
                "is missing from ONOS (install and activate org.innetagg.app); the intents are "
                "INSTALLED, so the job's traffic reaches its PS unaggregated"
            )
        self.store.converge(jid, gen, strat, status, reason, doc)
        self.fault("converged")
        changes = {"submit": submit, "unchanged": unchanged, "delete": stale}
        return Outcome(status, reason, changes, states, aggregation)

    def _withdraw(self, key: str) -> None:
        self.store.retire_intent(key)
        self.fault("intent-retired")
        self.onos.delete_intent(key)
        self.fault("intent-withdrawn")
        self.store.drop_intent(key)

    def remove(self, jid: str, pushed_class: bool) -> tuple[int, str]:
        """Delete the job from the fabric, then from the store; recorded first, so a crash
        or an ONOS outage is finished by reconcile. Returns (intents withdrawn, the
        aggregation resource's answer)."""
        self.store.mark_deleting(jid)
        self.fault("delete-recorded")
        ours = self.onos.our_intents()
        every = self.store.owned()
        keys = sorted(
            {k for k, (j, _) in every.items() if j == jid}
            | {k for k in ours if job_of_key(k) == jid and k in every}
        )
        for key in keys:
            self._withdraw(key)
        agg = self.aggregation.remove(jid)
        self.fault("aggregation-removed")
        if pushed_class:
            try:
                self.priority.remove(jid)
            except OnosError as e:
                log.warning("class of %s not removed: %s", jid, e)
        self.fault("class-removed")
        self.store.delete_job(jid)
        self.fault("deleted")
        return len(keys), agg

    # --- everything -----------------------------------------------------------------------

    def reconcile(self, pushed: Callable[[str], bool]) -> Repairs:
        """Compare ONOS with the desired state and repair: finish deletions and applies a
        crash interrupted, resubmit intents ONOS lost, write aggregation documents again
        where the app's differs, withdraw owned intents nothing wants. `pushed(job)`: the
        job's class is on the switches (its removal is part of a deletion)."""
        out = Repairs()
        self.onos.register_app()
        self._adopt_legacy()
        jobs = {j["id"] for j in self.store.jobs()}
        for jid, d in sorted(self.store.desired().items()):
            if d["state"] == DELETING:
                self.remove(jid, pushed(jid))
                out.deleted.append(jid)
        held = self.onos.our_intent_docs()
        desired = self.store.desired()
        for jid, d in sorted(desired.items()):
            if jid not in jobs or d["state"] == DELETING:
                continue
            why = self._drift(jid, d, held)
            if why is None:
                continue
            log.warning("reconcile: job %s differs from its desired state (%s)", jid, why)
            try:
                res = self.converge(jid)
            except OnosError as e:  # this job's trouble (a device gone): the others go on
                out.errors[jid] = str(e)
                continue
            out.repaired.append(jid)
            out.resubmitted += res.changes["submit"]
            out.removed += res.changes["delete"]
            out.failed += [s for s in res.states if s.state != "INSTALLED"]
        in_onos = self.onos.our_intents()
        every = self.store.owned()
        wanted = {k for jid, d in self.store.desired().items() if jid in jobs for k in d["bodies"]}
        for key in sorted(in_onos):
            if key in every:
                if key not in wanted:
                    self._withdraw(key)
                    out.removed.append(key)
            elif self.s.withdraw_foreign_intents:
                self.onos.delete_intent(key)
                out.removed.append(key)
            else:
                out.foreign.append(key)
        for key, (_, retired) in every.items():
            if key not in in_onos and (retired or key not in wanted):
                self.store.drop_intent(key)
        if out.foreign:
            log.warning(
                "ONOS holds %d intent(s) of app id %s this store does not own (e.g. %s): "
                "left alone; another instance may own them",
                len(out.foreign), self.s.onos_app_id, out.foreign[0],
            )  # fmt: skip
        return out

    def foreign(self) -> list[str]:
        """Intents of our app id in ONOS that this store never recorded."""
        every = self.store.owned()
        return sorted(k for k in self.onos.our_intents() if k not in every)

    def _drift(self, jid: str, d: dict[str, Any], held: dict[str, dict[str, Any]]) -> str | None:
        """Why the fabric differs from the job's desired state, or None. Intents are
        compared with what ONOS holds under their keys (selector, priority, points,
        waypoints), not with a digest of what was sent."""
        if d["state"] == PENDING:
            return "an apply did not finish"
        cur = self.store.current(jid)
        if cur is None or cur["status"] not in ("applied", "intents-only", "partial"):
            return None  # failed placements are the control loop's to re-place
        owned = self.store.intents(jid)
        for key, body in d["bodies"].items():
            state = held.get(key, {}).get("state")
            if state not in (*LIVE, *STUCK):
                return f"intent {key} is {state or 'missing'} in ONOS"
            if owned.get(key, ("", ""))[1] != intent_digest(body):
                return f"intent {key} was not confirmed with its desired body"
            if intent_shape(held[key]) != intent_shape(body):
                return f"intent {key} in ONOS differs from the desired one (changed in ONOS)"
        held = self._aggregation_doc(jid)
        if cur["status"] == "intents-only":
            # Placed while the app was missing (ONOS restarting, the app not yet installed):
            # once the app answers, its aggregation is written; until then nothing to do.
            return None if held is None else "the app is installed now; aggregation is not"
        want = [
            (a["switch"], a["pool"]["base"], a["pool"]["size"])
            for a in d["placement"]["aggregators"]
        ]
        if held is None:
            # The app is gone (uninstalled, deactivated, ONOS restarted without it): the job
            # is converged again and reads `intents-only` until the app is back.
            gone = "the innet-agg app does not answer: no switch holds the aggregation"
            return gone if want else None
        have = [
            (a["switch"], a["pool"]["base"], a["pool"]["size"])
            for jp in held.get("jobs", [])
            for a in jp.get("aggregators", [])
        ]
        if sorted(have) != sorted(want):
            return f"the app holds aggregators {sorted(have)}, not {sorted(want)}"
        return None

    def _aggregation_doc(self, jid: str) -> dict[str, Any] | None:
        """The app's aggregation document for the job; {} when it has none; None when the
        app is not installed."""
        r = self.onos._request("GET", self.aggregation._url(jid))
        if r.status_code == 404:
            try:
                message = str(r.json().get("message", ""))
            except ValueError:
                message = ""
            return {} if message.startswith("job:") else None
        if r.status_code != 200:
            raise OnosError(r.status_code, r.text[:200])
        return r.json()

    def _adopt_legacy(self) -> None:
        """A store written before desired state was recorded: each placed job's current
        placement, with the intents the store holds for it, becomes its desired state."""
        desired = self.store.desired()
        currents = self.store.currents()
        for j in self.store.jobs():
            jid = j["id"]
            if jid in desired:
                continue
            cur = currents.get(jid)
            if not cur or cur["status"] not in ("applied", "intents-only", "partial"):
                continue
            bodies = {
                k: body
                for k in self.store.intents(jid)
                if (body := self.store.intent_body(k)) is not None
            }
            self.store.set_desired(jid, cur["strategy"], cur["placement"], bodies)
            if cur["status"] != "partial":
                self.store.set_desired_state(jid, CONVERGED)
