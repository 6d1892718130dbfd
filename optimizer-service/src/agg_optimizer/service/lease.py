"""Which of the instances sharing one database leads: a lease row in that database.

The leader applies placements and runs the control loop, the scheduler and reconcile; a
standby answers reads and refuses changes (503 naming the leader) until the lease expires
unrenewed, then takes over and reconciles first. A holder on this host whose process is
gone (killed) is taken over at once. The lease names the fabric (ONOS URL and app id), so
it extends to replicas on a shared PostgreSQL later (docs/service.md, "One writer per
fabric").
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable

from .store import Store

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
            log.warning("lease %s: holder %s is gone from this host: taking over", self.name,
                        holder)  # fmt: skip
            self.store.release_lease(self.name, holder)
            ours, holder, expires = self.store.acquire_lease(self.name, self.holder, self.ttl_s)
        self.leader, self.expires = holder, expires
        return ours

    def _dead(self, holder: str) -> bool:
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
                "answers reads and takes over then",
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
            self.store.release_lease(self.name, self.holder)
            self.leading = False
