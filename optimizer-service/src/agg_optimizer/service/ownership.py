"""One writer per ONOS, fail closed (docs/service.md, "Invariants").

The service writes to ONOS (intents, aggregation documents, classes) only while it holds the
owner claim in our ONOS app (`/onos/innet-agg/owner`, a compare-and-set in ONOS's
distributed store): claimed for this service's database (its replicas share the claim; the
lease decides which of them acts), renewed every third of `lease_ttl_s`, trusted for two
thirds of it. So a second instance with its own database sees the claim taken even while the
first holds no intent, and an instance that cannot reach ONOS, or cannot renew, writes
nothing until it can: every write path calls `require()` first.

Where ONOS has no such resource (our app not installed: nothing aggregates either), the
check falls back to the intents themselves: ownership holds while ONOS holds no intent of
our app id that this database did not record."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from agg_optimizer.service.errors import Unavailable
from agg_optimizer.service.invariants import Invariants
from agg_optimizer.service.onos import OnosClient, OnosError, OnosUnavailable, _message
from agg_optimizer.service.settings import Settings
from agg_optimizer.service.store import Store

log = logging.getLogger(__name__)

OWNER_PATH = "/onos/innet-agg/owner"


class NotOwner(Unavailable):
    """This instance may not write to ONOS now: another owns it, or ownership is unchecked."""


class Ownership:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        onos: OnosClient,
        holder: str,
        invariants: Invariants,
        foreign: Callable[[], list[str]],
    ) -> None:
        self.s = settings
        self.store = store
        self.onos = onos
        self.holder = holder
        self.invariants = invariants
        self._foreign = foreign
        self.ttl_s = max(3, round(settings.lease_ttl_s))
        self._until = 0.0  # monotonic time until which the last claim is trusted
        self._why = "ownership of ONOS not checked yet"
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def ours(self) -> bool:
        return time.monotonic() < self._until

    def require(self) -> None:
        """Raises NotOwner unless this instance may write to ONOS now."""
        if not self.ours:
            raise NotOwner(f"not writing to ONOS: {self._why}")

    def check(self) -> bool:
        """Take or renew the claim once; True when ours. Never raises."""
        asked = time.monotonic()
        try:
            r = self.onos._request(
                "POST",
                self.onos.root + OWNER_PATH,
                json={"owner": self.store.store_id, "holder": self.holder, "ttl_s": self.ttl_s},
                app_errors=True,
            )
            if r.status_code == 404:
                foreign = [] if self.s.withdraw_foreign_intents else self._foreign()
                problem = (
                    f"ONOS holds {len(foreign)} intent(s) of app id {self.s.onos_app_id} this "
                    f"database never recorded (e.g. {foreign[0]}): another optimizer writes "
                    "to this ONOS"
                    if foreign
                    else None
                )
            elif r.status_code == 409:
                problem = f"another optimizer owns this ONOS ({_message(r)})"
            elif r.status_code == 200:
                problem = None
            else:
                raise OnosError(r.status_code, _message(r))
        except (OnosUnavailable, OnosError) as e:
            with self._lock:
                self._why = f"ownership not renewed: {e}"
            return self.ours
        with self._lock:
            if problem is None:
                self._until = asked + self.ttl_s * 2 / 3
            else:
                self._until, self._why = 0.0, problem
        self.invariants.writer(problem)
        return problem is None

    def start(self) -> None:
        """Claim now, then renew every third of the TTL (more often while it fails)."""
        if self._thread is not None:
            return

        def run() -> None:
            while not self._stop.is_set():
                ok = self.check()
                self._stop.wait(self.ttl_s / 3 if ok else 1.0)

        self._thread = threading.Thread(target=run, name="ownership", daemon=True)
        self._thread.start()

    def stop(self, release: bool) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        if release and self.ours:
            try:
                self.onos._request(
                    "DELETE",
                    f"{self.onos.root}{OWNER_PATH}?owner={self.store.store_id}",
                )
            except (OnosUnavailable, OnosError) as e:
                log.warning("owner claim not released (it expires in %d s): %s", self.ttl_s, e)
        self._until = 0.0
