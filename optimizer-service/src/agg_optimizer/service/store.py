"""SQLite state: jobs, placements (history), each job's desired placement, the intents the
service owns, and the lease that says which replica leads.

Desired state first (docs/service.md, "Desired state and reconcile"): a job's target
placement and its intent bodies are recorded (`set_desired`) before anything is sent to
ONOS; an intent key is recorded as owned (`own_intent`) before it is submitted, with the
digest of the body ONOS holds only once ONOS accepted it (`confirm_intent`), and it is
marked retired before it is withdrawn. So whatever step a crash interrupts, the store
names everything that may be in ONOS, and reconcile can finish the job.

One connection guarded by a lock: FastAPI runs sync routes on a thread pool and the control
loop has its own thread.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, spec TEXT NOT NULL, strategy TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS placements (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, strategy TEXT NOT NULL,
    status TEXT NOT NULL, reason TEXT, doc TEXT NOT NULL, created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS placements_job ON placements (job_id, seq);
CREATE TABLE IF NOT EXISTS intents (
    key TEXT PRIMARY KEY, job_id TEXT NOT NULL, digest TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS progress (
    job_id TEXT PRIMARY KEY, doc TEXT NOT NULL, updated REAL NOT NULL);
CREATE TABLE IF NOT EXISTS desired (
    job_id TEXT PRIMARY KEY, generation INTEGER NOT NULL, strategy TEXT NOT NULL,
    doc TEXT NOT NULL, bodies TEXT NOT NULL, state TEXT NOT NULL, updated REAL NOT NULL);
CREATE TABLE IF NOT EXISTS leases (
    name TEXT PRIMARY KEY, holder TEXT NOT NULL, expires REAL NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

# Placement statuses under which the job's paths (and maybe pools) are in the network:
# `partial` (ONOS failed mid-apply; reconcile finishes it) and `intents-only` (the paths are
# INSTALLED but the ONOS app that writes aggregation entries is missing; the control loop
# tries again).
HOLDING = ("applied", "partial", "intents-only")

# Desired-state rows: `pending` (recorded, the fabric may not hold it yet), `converged`
# (every step done and the placement row written), `deleting` (the job is being removed).
PENDING, CONVERGED, DELETING = "pending", "converged", "deleting"
# An owned intent whose body ONOS may not hold yet: never equal to a body's digest.
UNCONFIRMED = "-"


class Store:
    def __init__(self, path: Path | str) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA busy_timeout=10000")  # replicas on one file wait, not fail
        self.db.executescript(SCHEMA)
        cols = {r[1] for r in self.db.execute("PRAGMA table_info(intents)")}
        if "retired" not in cols:  # a store written before retirement was recorded
            self.db.execute("ALTER TABLE intents ADD COLUMN retired INTEGER NOT NULL DEFAULT 0")
        self.db.execute("INSERT OR IGNORE INTO meta VALUES ('store_id', lower(hex(randomblob(8))))")
        self.store_id: str = self.db.execute(
            "SELECT value FROM meta WHERE key = 'store_id'"
        ).fetchone()[0]
        self.lock = threading.RLock()
        # Bumped by every write: what a computed placement depends on has not changed while
        # the version has not.
        self.version = 0

    def close(self) -> None:
        with self.lock:
            self.db.close()

    # jobs
    def add_job(self, job_id: str, spec: dict[str, Any], strategy: str) -> None:
        with self.lock:
            self.version += 1
            self.db.execute(
                "INSERT INTO jobs VALUES (?, ?, ?, ?)",
                (job_id, json.dumps(spec), strategy, time.time()),
            )

    def set_strategy(self, job_id: str, strategy: str) -> None:
        with self.lock:
            self.version += 1
            self.db.execute("UPDATE jobs SET strategy = ? WHERE id = ?", (strategy, job_id))

    def job(self, job_id: str) -> dict[str, Any] | None:
        with self.lock:
            row = self.db.execute(
                "SELECT spec, strategy FROM jobs WHERE id = ?", (job_id,)
            ).fetchone()
        return {**json.loads(row[0]), "strategy": row[1]} if row else None

    def jobs(self) -> list[dict[str, Any]]:
        with self.lock:
            rows = self.db.execute("SELECT spec, strategy FROM jobs ORDER BY created").fetchall()
        return [{**json.loads(s), "strategy": st} for s, st in rows]

    def count_jobs(self) -> int:
        with self.lock:
            return self.db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]

    def delete_job(self, job_id: str) -> None:
        with self.lock:
            self.version += 1
            # Its history goes with it: a new job under the same id starts with none (and
            # its first placement is not judged against the old job's aggregators).
            self.db.execute("BEGIN")
            self.db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
            self.db.execute("DELETE FROM placements WHERE job_id = ?", (job_id,))
            self.db.execute("DELETE FROM progress WHERE job_id = ?", (job_id,))
            self.db.execute("DELETE FROM desired WHERE job_id = ?", (job_id,))
            self.db.execute("COMMIT")

    def created(self) -> dict[str, float]:
        """Each job's creation time (the scheduler's arrival)."""
        with self.lock:
            return dict(self.db.execute("SELECT id, created FROM jobs").fetchall())

    # training progress, as the job reports it (the scheduler's input)
    def set_progress(self, job_id: str, doc: dict[str, Any]) -> None:
        with self.lock:
            self.version += 1
            self.db.execute(
                "INSERT OR REPLACE INTO progress VALUES (?, ?, ?)",
                (job_id, json.dumps(doc), time.time()),
            )

    def progress(self) -> dict[str, dict[str, Any]]:
        with self.lock:
            rows = self.db.execute("SELECT job_id, doc, updated FROM progress").fetchall()
        return {j: {**json.loads(d), "updated": u} for j, d, u in rows}

    # placements
    def add_placement(
        self, job_id: str, strategy: str, status: str, reason: str | None, doc: dict[str, Any]
    ) -> int:
        with self.lock:
            self.version += 1
            cur = self.db.execute(
                "INSERT INTO placements (job_id, strategy, status, reason, doc, created) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (job_id, strategy, status, reason, json.dumps(doc), time.time()),
            )
            return int(cur.lastrowid or 0)

    def placements(self, job_id: str, limit: int = 50) -> list[dict[str, Any]]:
        with self.lock:
            rows = self.db.execute(
                "SELECT seq, strategy, status, reason, doc, created FROM placements "
                "WHERE job_id = ? ORDER BY seq DESC LIMIT ?",
                (job_id, limit),
            ).fetchall()
        return [
            {
                "seq": r[0],
                "job_id": job_id,
                "strategy": r[1],
                "status": r[2],
                "reason": r[3],
                "placement": json.loads(r[4]),
                "created": r[5],
            }
            for r in rows
        ]

    def current(self, job_id: str) -> dict[str, Any] | None:
        rows = self.placements(job_id, 1)
        return rows[0] if rows else None

    # desired state
    def set_desired(
        self, job_id: str, strategy: str, doc: dict[str, Any], bodies: dict[str, Any]
    ) -> int:
        """Record the job's target placement (state `pending`); returns its generation."""
        with self.lock:
            self.version += 1
            row = self.db.execute(
                "SELECT generation FROM desired WHERE job_id = ?", (job_id,)
            ).fetchone()
            gen = (row[0] if row else 0) + 1
            self.db.execute(
                "INSERT OR REPLACE INTO desired VALUES (?, ?, ?, ?, ?, ?, ?)",
                (job_id, gen, strategy, json.dumps(doc), json.dumps(bodies), PENDING,
                 time.time()),
            )  # fmt: skip
            return gen

    def desired(self, job_id: str | None = None) -> dict[str, dict[str, Any]]:
        """Desired rows by job: generation, strategy, placement doc, intent bodies, state."""
        with self.lock:
            q = "SELECT job_id, generation, strategy, doc, bodies, state FROM desired"
            rows = (
                self.db.execute(q).fetchall()
                if job_id is None
                else self.db.execute(q + " WHERE job_id = ?", (job_id,)).fetchall()
            )
        return {
            r[0]: {
                "generation": r[1],
                "strategy": r[2],
                "placement": json.loads(r[3]),
                "bodies": json.loads(r[4]),
                "state": r[5],
            }
            for r in rows
        }

    def set_desired_state(self, job_id: str, state: str) -> None:
        with self.lock:
            self.version += 1
            self.db.execute(
                "UPDATE desired SET state = ?, updated = ? WHERE job_id = ?",
                (state, time.time(), job_id),
            )

    def mark_deleting(self, job_id: str) -> None:
        """The job is being removed: a crash from here on is finished by reconcile."""
        with self.lock:
            self.version += 1
            self.db.execute(
                "INSERT INTO desired VALUES (?, 0, '', '{}', '{}', ?, ?) ON CONFLICT(job_id) "
                "DO UPDATE SET state = excluded.state, updated = excluded.updated",
                (job_id, DELETING, time.time()),
            )

    def converge(
        self,
        job_id: str,
        generation: int,
        strategy: str,
        status: str,
        reason: str | None,
        doc: dict[str, Any],
    ) -> int:
        """The placement row and the desired state's `converged`, in one transaction (a
        crash leaves both or neither); a newer generation recorded meanwhile stays pending."""
        with self.lock:
            self.version += 1
            self.db.execute("BEGIN")
            try:
                cur = self.db.execute(
                    "INSERT INTO placements (job_id, strategy, status, reason, doc, created) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    (job_id, strategy, status, reason, json.dumps(doc), time.time()),
                )
                self.db.execute(
                    "UPDATE desired SET state = ?, updated = ? WHERE job_id = ? AND generation = ?",
                    (CONVERGED, time.time(), job_id, generation),
                )
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            return int(cur.lastrowid or 0)

    # intents owned: recorded before they are submitted, retired before they are withdrawn
    def intents(self, job_id: str | None = None) -> dict[str, tuple[str, str]]:
        """Owned, not retired intents: key -> (job, digest of the body ONOS accepted, or
        UNCONFIRMED)."""
        with self.lock:
            if job_id is None:
                rows = self.db.execute(
                    "SELECT key, job_id, digest FROM intents WHERE retired = 0"
                ).fetchall()
            else:
                rows = self.db.execute(
                    "SELECT key, job_id, digest FROM intents WHERE job_id = ? AND retired = 0",
                    (job_id,),
                ).fetchall()
        return {k: (j, d) for k, j, d in rows}

    def owned(self) -> dict[str, tuple[str, bool]]:
        """Every key this store owns: key -> (job, retired)."""
        with self.lock:
            rows = self.db.execute("SELECT key, job_id, retired FROM intents").fetchall()
        return {k: (j, bool(r)) for k, j, r in rows}

    def intent_body(self, key: str) -> dict[str, Any] | None:
        with self.lock:
            row = self.db.execute("SELECT body FROM intents WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def own_intent(self, key: str, job_id: str, body: dict[str, Any]) -> None:
        """Before submitting: the key is ours, the body ONOS holds unknown."""
        with self.lock:
            self.version += 1
            self.db.execute(
                "INSERT OR REPLACE INTO intents VALUES (?, ?, ?, ?, 0)",
                (key, job_id, UNCONFIRMED, json.dumps(body)),
            )

    def confirm_intent(self, key: str, digest: str) -> None:
        """ONOS accepted the body whose digest this is."""
        with self.lock:
            self.version += 1
            self.db.execute("UPDATE intents SET digest = ? WHERE key = ?", (digest, key))

    def retire_intent(self, key: str) -> None:
        """Before withdrawing: still ours (reconcile withdraws it), no longer wanted."""
        with self.lock:
            self.version += 1
            self.db.execute("UPDATE intents SET retired = 1 WHERE key = ?", (key,))

    def drop_intent(self, key: str) -> None:
        """After ONOS withdrew it."""
        with self.lock:
            self.version += 1
            self.db.execute("DELETE FROM intents WHERE key = ?", (key,))

    # leases: which replica of the ones sharing this store leads (runs the loop, the
    # scheduler and reconcile, and applies)
    def acquire_lease(self, name: str, holder: str, ttl_s: float) -> tuple[bool, str, float]:
        """Take or renew `name` for `holder` unless another holder's lease is unexpired.
        Returns (held by us, holder, expiry)."""
        with self.lock:
            now = time.time()
            self.db.execute("BEGIN IMMEDIATE")
            try:
                row = self.db.execute(
                    "SELECT holder, expires FROM leases WHERE name = ?", (name,)
                ).fetchone()
                if row is None or row[0] == holder or row[1] < now:
                    self.db.execute(
                        "INSERT OR REPLACE INTO leases VALUES (?, ?, ?)",
                        (name, holder, now + ttl_s),
                    )
                    row = (holder, now + ttl_s)
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            return row[0] == holder, row[0], row[1]

    def release_lease(self, name: str, holder: str) -> None:
        with self.lock:
            self.db.execute("DELETE FROM leases WHERE name = ? AND holder = ?", (name, holder))
