"""What must never happen, watched while the service runs (docs/service.md, "Invariants"):
two jobs' slot pools overlapping on a switch, and a second writer on the same ONOS. The
planner, the store, the ONOS app and reconcile each refuse or repair on their own; this
part finds what got past them all, says so in `/healthz` (degraded) and `/metrics`, and
re-places the later of two overlapping jobs.

`/healthz` runs on the event loop and must never wait on the database or ONOS: it reads the
state the readiness probe (every `PROBE_PERIOD_S`) and each reconcile leave here."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from agg_optimizer.model.pools import Claim, describe
from agg_optimizer.service.store import Store

log = logging.getLogger(__name__)


class Invariants:
    def __init__(self, store: Store, count: Callable[[str, int], None]) -> None:
        self.store = store
        self._set_count = count
        self._lock = threading.Lock()
        self._overlaps: list[str] = []
        self._foreign: list[str] = []
        self._writer: str | None = None

    def health(self) -> dict[str, Any]:
        """`/healthz`'s answer: ok, or degraded with what is wrong."""
        with self._lock:
            out: dict[str, Any] = {"status": "ok"}
            if self._overlaps:
                out["overlaps"] = list(self._overlaps)
            if self._foreign:
                out["foreign_intents"] = len(self._foreign)
            if self._writer:
                out["writer"] = self._writer
            if len(out) > 1:
                out["status"] = "degraded"
            return out

    def check_pools(self) -> list[tuple[Claim, Claim]]:
        """The overlapping pools the store records now (none while the invariant holds),
        logged as errors when found."""
        pairs = self.store.overlaps()
        msgs = [describe(p) for p in pairs]
        with self._lock:
            new = [m for m in msgs if m not in self._overlaps]
            self._overlaps = msgs
        for m in new:
            log.error("slot pools overlap %s: reconcile re-places the later job", m)
        self._set_count("pool_overlaps", len(msgs))
        return pairs

    def foreign(self, keys: list[str]) -> None:
        """Intents of our app id that this store never recorded: another writer."""
        with self._lock:
            fresh = bool(keys) and not self._foreign
            self._foreign = list(keys)
        self._set_count("foreign_intents", len(keys))
        if fresh:
            log.error(
                "ONOS holds %d intent(s) of our app id this store never recorded (e.g. %s): "
                "another instance with another database writes to this ONOS",
                len(keys), keys[0],
            )  # fmt: skip

    def writer(self, problem: str | None) -> None:
        """Another writer's claim on this ONOS, or None when ownership is ours."""
        with self._lock:
            changed = problem != self._writer
            self._writer = problem
        if problem and changed:
            log.error("%s", problem)

    def later(self, pair: tuple[Claim, Claim]) -> str:
        """The job of the pair placed last (its latest placement row): the one to move."""
        currents = self.store.currents()

        def seq(jid: str) -> int:
            cur = currents.get(jid)
            return int(cur["seq"]) if cur else 1 << 62

        a, b = pair[0][0], pair[1][0]
        return max((a, b), key=lambda j: (seq(j), j))
