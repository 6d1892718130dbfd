"""Which of the replicas sharing one database leads: a lease row in that database.

The leader runs the control loop, the scheduler and reconcile; every replica answers the
API, reads and changes alike (changes to the fabric go one at a time through the
database's apply lock, `Store.apply_lock`). The lease is renewed every third of its time to
live; a standby takes it once it expires unrenewed, and reconciles first. A holder known to
be gone is taken over at once: on this host, a process that no longer exists; on
PostgreSQL, a holder whose database session has ended (the kernel closes a killed
process's connections, and PostgreSQL ends their sessions). Times are the database's
clock, so replicas on hosts whose clocks differ agree on expiry (docs/service.md,
"Replicas").
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable

from agg_optimizer.service.store import Store, StoreUnavailable

log = logging.getLogger(__name__)


class Lease:
    def __init__(self, store: Store, fabric: str, ttl_s: float) -> None:
        self.store = store
        self.name = f"fabric:{fabric}"
        self.ttl_s = ttl_s
        self.host = socket.gethostname()
        self.holder = f"{self.host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.leading = False
        self.leader: str | None = None
        self.expires = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def try_acquire(self) -> bool:
        ours, holder, expires = self.store.acquire_lease(self.name, self.holder, self.ttl_s)
        if not ours and self._dead(holder):
            log.warning("lease %s: holder %s is gone (process or session): taking over", self.name,
                        holder)  # fmt: skip
            self.store.release_lease(self.name, holder)
            ours, holder, expires = self.store.acquire_lease(self.name, self.holder, self.ttl_s)
        self.leader, self.expires = holder, expires
        return ours

    def _dead(self, holder: str) -> bool:
        if holder == self.holder:
            return False
        try:
            if self.store.lease_session_gone(self.name, holder):
                return True
        except Exception as e:  # the database busy or gone: the lease's expiry decides
            log.warning("lease %s: could not ask after %s's session: %s", self.name, holder, e)
        host, _, rest = holder.partition(":")
        pid = rest.split(":", 1)[0]
        if host != self.host or not pid.isdigit() or int(pid) == os.getpid():
            return False
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def start(self, on_lead: Callable[[], None], on_lose: Callable[[], None]) -> None:
        """Take the lease now if free (`on_lead` runs in this thread), then keep renewing
        it, or keep trying to take it, every third of its time to live."""
        if self.try_acquire():
            self.leading = True
            on_lead()
        else:
            log.warning(
                "standby: %s leads this database until its lease expires; this instance "
                "answers the API and takes over the loop, the scheduler and reconcile then",
                self.leader,
            )

        def run() -> None:
            while not self._stop.wait(self.ttl_s / 3):
                try:
                    ours = self.try_acquire()
                except Exception as e:  # the database busy or gone: try again
                    log.warning("lease %s not renewed: %s", self.name, e)
                    continue
                if ours and not self.leading:
                    log.warning("lease %s taken: this instance leads now", self.name)
                    self.leading = True
                    on_lead()
                elif not ours and self.leading:
                    log.warning("lease %s lost to %s: standing by", self.name, self.leader)
                    self.leading = False
                    on_lose()

        self._thread = threading.Thread(target=run, name="lease", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(5)
            self._thread = None
        if self.leading:
            self.leading = False
            try:
                self.store.release_lease(self.name, self.holder)
            except StoreUnavailable as e:
                # The database is down as this instance stops: the lease expires unrenewed
                # (ttl_s) and a standby takes it then. Stopping must not fail for it.
                log.warning("lease %s not released (%s): it expires in %.0f s", self.name,
                            e, self.ttl_s)  # fmt: skip
