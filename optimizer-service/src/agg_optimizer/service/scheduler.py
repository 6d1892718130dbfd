"""The scheduler in the service: orders the placed jobs by the configured policy and keeps
each job's strict-priority class on the switches through the ONOS app's traffic-class
resource (docs/scheduling.md, "In the service")."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agg_optimizer.service.errors import BadField, Unavailable
from agg_optimizer.service.onos import OnosError, OnosUnavailable, PriorityApi
from agg_optimizer.service.settings import Settings
from agg_optimizer.service.store import HOLDING, Store

log = logging.getLogger(__name__)


@dataclass
class ScheduleState:
    """What the scheduler last pushed to the switches (docs/scheduling.md, "In the service")."""

    pushed: dict[str, int] = field(default_factory=dict)  # job -> class the app holds
    held_by: dict[str, list[str]] = field(default_factory=dict)  # job -> switches with it
    # off, ok, no-switch, app-not-installed, onos-unavailable, onos-error
    status: str = "off"
    error: str | None = None
    runs: int = 0
    last_trigger: str | None = None
    last_run_at: float | None = None
    order: list[str] = field(default_factory=list)


class Scheduler:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        priority: PriorityApi,
        count: Callable[[str], None],
        stop: threading.Event,
        leading: Callable[[], bool],
    ) -> None:
        self.s = settings
        self.store = store
        self.priority = priority
        self._count = count
        self._stop = stop
        self.leading = leading
        self.state = ScheduleState()
        # Raises (NotOwner) while this instance may not write to ONOS (ownership.py).
        self.may_write: Callable[[], None] = lambda: None
        self.lock = threading.Lock()
        self._wake = threading.Event()
        self._trigger = "periodic"
        self._thread: threading.Thread | None = None

    def schedule(self, policy: str, classes: int) -> dict[str, Any]:
        """Order the jobs that hold a placement by `policy` and map them onto `classes`
        priority queues: jobs on 1 .. classes-1, everything else (background) on 0."""
        from agg_optimizer.model.documents import Job, JobPlacement
        from agg_optimizer.scheduling.policies import POLICIES, Demand, link_bytes, schedule

        if policy not in POLICIES:
            raise BadField("policy", f"unknown {policy!r}; one of {', '.join(POLICIES)}")
        progress, created = self.store.progress(), self.store.created()
        demands = []
        currents = self.store.currents()
        for spec in self.store.jobs():
            cur = currents.get(spec["id"])
            if not cur or cur["status"] not in HOLDING:
                continue
            job = Job.model_validate({k: spec[k] for k in Job.model_fields if k in spec})
            jp = JobPlacement.model_validate(cur["placement"])
            info = progress.get(job.id, {})
            demands.append(
                Demand(
                    job=job.id,
                    links=link_bytes(job.update_bytes, jp),
                    arrival_s=created.get(job.id, 0.0),
                    weight=job.weight,
                    progress=float(info.get("progress", 0.0)),
                    cojob=info.get("cojob"),
                    stage=int(info.get("stage", 0)),
                    rounds_left=int(info.get("rounds_left", 1)),
                )
            )
        s = schedule(policy, demands, classes - 1)
        return {
            "policy": policy,
            "classes": classes,
            "order": s.order,
            "class_of": {j: c + 1 for j, c in s.classes.items()},
            "background_class": 0,
        }

    def push(self, trigger: str = "request") -> dict[str, Any]:
        """Order the placed jobs by the configured policy and write each job's class to the
        switches through the ONOS app (only the classes that changed; the classes of jobs
        no longer placed are removed). ONOS down: `Unavailable`, state kept for next time."""
        policy = self.s.schedule_policy
        if policy is None:
            raise BadField(
                "schedule_policy", "no policy configured (AGG_OPTIMIZER_SCHEDULE_POLICY)"
            )
        self.may_write()
        with self.lock:
            st = self.state
            st.runs += 1
            st.last_trigger, st.last_run_at = trigger, time.time()
            s = self.schedule(policy, self.s.schedule_classes)
            st.order = s["order"]
            want: dict[str, int] = s["class_of"]
            written: dict[str, int] = {}
            removed: list[str] = []
            try:
                for jid in sorted(want, key=s["order"].index):
                    # a class no switch took is written again: a device may run ours now
                    if st.pushed.get(jid) == want[jid] and st.held_by.get(jid) != []:
                        continue
                    outcome, switches = self.priority.apply(jid, want[jid])
                    if outcome == "app-not-installed":
                        st.status, st.error = (
                            "app-not-installed",
                            ("the innet-agg app's priority resource is missing from ONOS"),
                        )
                        break
                    st.pushed[jid] = written[jid] = want[jid]
                    if switches is None:
                        st.held_by.pop(jid, None)
                    else:
                        st.held_by[jid] = switches
                else:
                    for jid in sorted(set(st.pushed) - set(want)):
                        self.priority.remove(jid)
                        del st.pushed[jid]
                        st.held_by.pop(jid, None)
                        removed.append(jid)
                    unheld = sorted(j for j in st.pushed if st.held_by.get(j) == [])
                    if unheld:
                        st.status, st.error = (
                            "no-switch",
                            f"ONOS accepted the classes of {', '.join(unheld)} but no switch "
                            "holds them: no device runs the innet-agg pipeconf",
                        )
                    else:
                        st.status, st.error = "ok", None
            except OnosUnavailable as e:
                st.status, st.error = "onos-unavailable", str(e)
                self._count("schedule_errors")
                raise Unavailable(f"{e}; classes pushed so far are kept") from None
            except OnosError as e:
                st.status, st.error = "onos-error", str(e)
                self._count("schedule_errors")
                raise Unavailable(f"ONOS rejected a class: {e}") from None
            self._count("schedule_pushes")
            return {**self.status(), "written": written, "removed": removed}

    def status(self) -> dict[str, Any]:
        st = self.state
        return {
            "policy": self.s.schedule_policy,
            "classes": self.s.schedule_classes,
            "status": st.status if self.s.schedule_policy else "off",
            "error": st.error,
            "runs": st.runs,
            "last_trigger": st.last_trigger,
            "last_run_at": st.last_run_at,
            "order": st.order,
            "pushed": dict(st.pushed),
            # switches holding each pushed class, as the ONOS app answered (absent when
            # it did not say)
            "held_by": {j: list(v) for j, v in st.held_by.items()},
        }

    def wake(self, trigger: str) -> None:
        self._trigger = trigger
        self._wake.set()

    def start(self) -> None:
        if self.s.schedule_policy is None or self._thread:
            return
        self._thread = threading.Thread(target=self._run, name="schedule", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        period = self.s.schedule_period_s or None
        while not self._stop.is_set():
            woke = self._wake.wait(period)
            self._wake.clear()
            if self._stop.is_set():
                break
            trigger = self._trigger if woke else "periodic"
            self._trigger = "periodic"
            if not self.leading():
                continue
            try:
                self.push(trigger)
            except Exception as e:  # ONOS down: status says so, the next run retries
                log.warning("classes not pushed: %s", e)

    def stop(self) -> None:
        self._wake.set()
        if self._thread:
            self._thread.join(10)
            self._thread = None
