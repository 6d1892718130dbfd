"""Whether the service can do its work: ONOS, the ONOS app, InfluxDB and the database,
probed in the background every `probe_period_s` so that `/readyz` never waits on them, and
the two transitions the rest of the service acts on (ONOS lost, ONOS back)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from agg_optimizer.service.invariants import Invariants
from agg_optimizer.service.onos import OnosClient, OnosError, OnosUnavailable
from agg_optimizer.service.settings import Settings
from agg_optimizer.service.store import Store
from agg_optimizer.service.telemetry import TelemetryReader

log = logging.getLogger(__name__)


class Readiness:
    """`unverified(reason)`: ONOS stopped answering, or its app stopped serving (no job may
    read `applied` until a reconcile has seen ONOS hold it again); `onos_back()`: ONOS
    answers again (reconcile and push the schedule now)."""

    def __init__(
        self,
        settings: Settings,
        onos: OnosClient,
        influx: TelemetryReader,
        store: Store,
        invariants: Invariants,
        stop: threading.Event,
        unverified: Callable[[str], None],
        onos_back: Callable[[], None],
    ) -> None:
        self.s, self.onos, self.influx, self.store = settings, onos, influx, store
        self.invariants, self._stop = invariants, stop
        self._unverified, self._onos_back = unverified, onos_back
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._state: dict[str, str] = {}
        self._at = 0.0

    def state(self) -> dict[str, str]:
        """The background probe's last answers (`start`); a probe that has not come back
        within two periods is reported as such, so this never waits on ONOS. Before `start`,
        a probe now."""
        if self._thread is None:
            return self.probe()
        with self._lock:
            checks, at = dict(self._state), self._at
        age = time.monotonic() - at
        if age > 2 * self.s.probe_period_s + (1 + len(self.onos.nodes)) * self.s.onos_timeout_s:
            return {k: f"no answer from the probe for {age:.1f} s" for k in checks}
        return checks

    def influx_state(self) -> str:
        """The probe's last word on InfluxDB ("ok" until the probe runs)."""
        return self._state.get("influxdb", "ok") if self._thread else "ok"

    def probe(self) -> dict[str, str]:
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

    def start(self) -> None:
        if self._thread is not None:
            return
        self._state = self.probe()
        self._at = time.monotonic()

        def run() -> None:
            while not self._stop.wait(self.s.probe_period_s):
                state = self.probe()
                with self._lock:
                    was = self._state.get("onos")
                    app_was = self._state.get("onos_app", "ok")
                    self._state, self._at = state, time.monotonic()
                if was == "ok" and state["onos"] != "ok":
                    # It may come back empty (restarted): no job reads `applied` until a
                    # reconcile has seen ONOS hold it again.
                    self._unverified(f"ONOS stopped answering ({state['onos']})")
                if (
                    state["onos"] == "ok"
                    and state.get("onos_app", "ok") != "ok"
                    and app_was == "ok"
                ):
                    log.warning("not ready: %s", state["onos_app"])
                    self._unverified(state["onos_app"])
                if was != "ok" and state["onos"] == "ok":
                    self._onos_back()

        self._thread = threading.Thread(target=run, name="readiness", daemon=True)
        self._thread.start()
