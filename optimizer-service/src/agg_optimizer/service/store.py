"""The service's state: jobs, placements (history), each job's desired placement, the
intents the service owns, and the lease that says which replica leads. In SQLite (one
file, the embedded default) or in PostgreSQL (`AGG_OPTIMIZER_DB_PATH=postgresql://...`),
which replicas of the service share (docs/service.md, "Replicas").

Desired state first (docs/service.md, "Desired state and reconcile"): a job's target
placement and its intent bodies are recorded (`set_desired`) before anything is sent to
ONOS; an intent key is recorded as owned (`own_intent`) before it is submitted, with the
digest of the body ONOS holds only once ONOS accepted it (`confirm_intent`), and it is
marked retired before it is withdrawn. So whatever step a crash interrupts, the store
names everything that may be in ONOS, and reconcile can finish the job.

Every write bumps one counter row in the same transaction (`version`): what a computed
placement depends on has not changed while it has not, whichever replica wrote. One
connection per process guarded by a lock: FastAPI runs sync routes on a thread pool and
the control loop has its own thread. Changes to the fabric are serialised by
`apply_lock`, a lock in the database (PostgreSQL's advisory lock, which dies with its
session; a lock on a file next to the SQLite one), not in one process.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from agg_optimizer.model.pools import Claim, describe, doc_claims, overlaps
from agg_optimizer.service.backends import (
    ApplyLock,
    Query,
    StoreUnavailable,
    _Postgres,
    _Sqlite,
    is_url,
)
from agg_optimizer.service.errors import PoolConflict

T = TypeVar("T")
log = logging.getLogger(__name__)

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

__all__ = ["CONVERGED", "DELETING", "HOLDING", "PENDING", "Store", "StoreUnavailable"]


_PLACEMENT_COLUMNS = "seq, job_id, strategy, status, reason, doc, created"
# Each job's latest placement row, as `p` (`currents`, `unsettled`).
_CURRENT_PLACEMENTS = (
    "FROM placements p JOIN (SELECT job_id, MAX(seq) AS seq FROM placements GROUP BY job_id) m "
    "ON p.seq = m.seq"
)


def _placement(r: Sequence[Any]) -> dict[str, Any]:
    """A `placements` row, selected as `_PLACEMENT_COLUMNS`, as callers see it."""
    keys = ("seq", "job_id", "strategy", "status", "reason", "placement", "created")
    row = dict(zip(keys, r, strict=True))
    row["placement"] = json.loads(row["placement"])
    return row


class Store:
    def __init__(self, path: Path | str) -> None:
        self.path = str(path)
        self._db: _Sqlite | _Postgres = (
            _Postgres(self.path) if is_url(self.path) else _Sqlite(self.path)
        )
        self.backend = self._db.name
        self.where = self._db.where if isinstance(self._db, _Postgres) else self.path
        self._db.run("INSERT INTO version VALUES (0, 0) ON CONFLICT (id) DO NOTHING")
        self._db.run(
            "INSERT INTO meta VALUES ('store_id', ?) ON CONFLICT (key) DO NOTHING",
            (uuid.uuid4().hex[:16],),
        )
        self.store_id: str = self._db.run("SELECT value FROM meta WHERE key = 'store_id'")[0][0]
        if not self._db.run("SELECT 1 FROM meta WHERE key = 'pools_ledger'"):
            self._build_ledger()
        # Every job's spec, current placement and desired row, decoded once per version:
        # a dry run at 10,000 jobs spent most of its CPU decoding the same JSON again.
        self._memo: dict[str, tuple[int, Any]] = {}

    @property
    def version(self) -> int:
        """Bumped by every write of any replica: what a computed placement depends on has
        not changed while the version has not."""
        return int(self._db.run("SELECT value FROM version WHERE id = 0")[0][0])

    def _per_version(self, name: str, load: Callable[[], T]) -> T:
        """`load()`'s value, loaded again only once the version moved. The version is read
        before the rows: a write in between leaves newer rows under the older version,
        which the next call loads again. Callers get the cached objects' copies."""
        version = self.version
        hit = self._memo.get(name)
        if hit is not None and hit[0] == version:
            return hit[1]  # type: ignore[no-any-return]
        value = load()
        self._memo[name] = (version, value)
        return value

    def _write(self, fn: Callable[[Query], T]) -> T:
        """`fn`'s statements and the version's bump in one transaction."""
        with self._db.tx() as q:
            out = fn(q)
            q("UPDATE version SET value = value + 1 WHERE id = 0")
        return out

    def _run(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        return self._db.run(sql, params)

    # the slot ledger
    def _claim(self, q: Query, job_id: str, strict: bool = True) -> None:
        """Rewrite the job's claims from its current placement (while its status holds the
        fabric) and its desired one, in the caller's transaction. A pool of the desired
        placement that overlaps another job's claim raises PoolConflict (`strict`), and the
        transaction records nothing. A current pool that does (recorded before the ledger
        existed) is left unclaimed and logged: reconcile re-places the later job."""
        q("DELETE FROM pools WHERE job_id = ?", (job_id,))
        want: list[tuple[Claim, bool]] = []
        rows = q(
            "SELECT status, doc FROM placements WHERE job_id = ? ORDER BY seq DESC LIMIT 1",
            (job_id,),
        )
        if rows and rows[0][0] in HOLDING:
            want += [(c, False) for c in doc_claims(job_id, json.loads(rows[0][1]))]
        rows = q("SELECT doc FROM desired WHERE job_id = ?", (job_id,))
        if rows:
            want += [(c, strict) for c in doc_claims(job_id, json.loads(rows[0][0]))]
        done: set[Claim] = set()
        for c, must in want:
            if c in done:
                continue
            _, sw, lo, hi = c
            other = q(
                "SELECT job_id, lo, hi FROM pools WHERE switch = ? AND job_id <> ? "
                "AND lo < ? AND ? < hi ORDER BY lo LIMIT 1",
                (sw, job_id, hi, lo),
            )
            if other:
                clash = describe(((other[0][0], sw, other[0][1], other[0][2]), c))
                if must:
                    raise PoolConflict(f"slot pool refused: {clash}")
                log.error("store: claim not recorded (reconcile re-places one job): %s", clash)
                continue
            q("INSERT INTO pools VALUES (?, ?, ?, ?)", (job_id, sw, lo, hi))
            done.add(c)

    def _build_ledger(self) -> None:
        """A store written before the ledger: every job's claims, in the order of their
        latest placement (the earlier job keeps a contested pool)."""

        def fn(q: Query) -> None:
            q("DELETE FROM pools")
            order = q(
                "SELECT j.id FROM jobs j LEFT JOIN (SELECT job_id, MAX(seq) AS seq "
                "FROM placements GROUP BY job_id) m ON m.job_id = j.id ORDER BY m.seq, j.id"
            )
            for (jid,) in order:
                self._claim(q, jid, strict=False)
            q(
                "INSERT INTO meta VALUES ('pools_ledger', '1') ON CONFLICT (key) DO NOTHING",
            )

        self._write(fn)

    def claims(self) -> list[Claim]:
        """Every job's claims as recorded: current placement while it holds the fabric,
        desired placement, from the placements themselves (not the ledger)."""
        out: list[Claim] = []
        for jid, cur in self.currents().items():
            if cur["status"] in HOLDING:
                out += doc_claims(jid, cur["placement"])
        for jid, d in self.desired().items():
            out += doc_claims(jid, d["placement"])
        return out

    def overlaps(self) -> list[tuple[Claim, Claim]]:
        """Pairs of two jobs' recorded pools that share registers: none, while the
        invariant holds (`/healthz` says degraded otherwise)."""
        return self._per_version("overlaps", lambda: overlaps(self.claims()))

    def ping(self) -> None:
        """Raises StoreUnavailable when the database does not answer."""
        self._db.run("SELECT 1")

    def apply_lock(self, name: str) -> ApplyLock:
        """Held while changing fabric `name`: across replicas, not only threads."""
        return ApplyLock(self._db, name)

    def close(self) -> None:
        self._db.close()

    # jobs
    def add_job(self, job_id: str, spec: dict[str, Any], strategy: str) -> None:
        self._write(
            lambda q: q(
                f"INSERT INTO jobs VALUES (?, ?, ?, {self._db.NOW})",
                (job_id, json.dumps(spec), strategy),
            )
        )

    def set_strategy(self, job_id: str, strategy: str) -> None:
        self._write(lambda q: q("UPDATE jobs SET strategy = ? WHERE id = ?", (strategy, job_id)))

    def job(self, job_id: str) -> dict[str, Any] | None:
        rows = self._run("SELECT spec, strategy FROM jobs WHERE id = ?", (job_id,))
        return {**json.loads(rows[0][0]), "strategy": rows[0][1]} if rows else None

    def jobs(self) -> list[dict[str, Any]]:
        def load() -> list[dict[str, Any]]:
            rows = self._run("SELECT spec, strategy FROM jobs ORDER BY created, id")
            return [{**json.loads(s), "strategy": st} for s, st in rows]

        return [dict(j) for j in self._per_version("jobs", load)]

    def count_jobs(self) -> int:
        return int(self._run("SELECT COUNT(*) FROM jobs")[0][0])

    def delete_job(self, job_id: str) -> None:
        # Its history goes with it: a new job under the same id starts with none (and its
        # first placement is not judged against the old job's aggregators).
        def fn(q: Query) -> None:
            for table, col in (
                ("jobs", "id"),
                ("placements", "job_id"),
                ("progress", "job_id"),
                ("desired", "job_id"),
                ("pools", "job_id"),
            ):
                q(f"DELETE FROM {table} WHERE {col} = ?", (job_id,))

        self._write(fn)

    def created(self) -> dict[str, float]:
        """Each job's creation time (the scheduler's arrival)."""
        return dict(self._run("SELECT id, created FROM jobs"))

    # training progress, as the job reports it (the scheduler's input)
    def set_progress(self, job_id: str, doc: dict[str, Any]) -> None:
        self._write(
            lambda q: q(
                f"INSERT INTO progress VALUES (?, ?, {self._db.NOW}) ON CONFLICT (job_id) "
                "DO UPDATE SET doc = excluded.doc, updated = excluded.updated",
                (job_id, json.dumps(doc)),
            )
        )

    def progress(self) -> dict[str, dict[str, Any]]:
        rows = self._run("SELECT job_id, doc, updated FROM progress")
        return {j: {**json.loads(d), "updated": u} for j, d, u in rows}

    # placements
    def _insert_placement(
        self, q: Query, job_id: str, strategy: str, status: str, reason: str | None, doc: dict
    ) -> int:
        rows = q(
            "INSERT INTO placements (job_id, strategy, status, reason, doc, created) "
            f"VALUES (?, ?, ?, ?, ?, {self._db.NOW}) RETURNING seq",
            (job_id, strategy, status, reason, json.dumps(doc)),
        )
        return int(rows[0][0])

    def add_placement(
        self, job_id: str, strategy: str, status: str, reason: str | None, doc: dict[str, Any]
    ) -> int:
        def fn(q: Query) -> int:
            seq = self._insert_placement(q, job_id, strategy, status, reason, doc)
            self._claim(q, job_id, strict=False)  # its desired pools were claimed already
            return seq

        return self._write(fn)

    # What the last comparison of ONOS with the records found (the leader writes it, every
    # replica reads it): a job reads `applied` only while that holds (Service.observed).
    def set_fabric_check(self, verified: bool, reason: str | None,
                         drift: dict[str, str] | None = None) -> None:  # fmt: skip
        """Record a comparison: `verified` (every job's intents and documents were seen in
        ONOS, but those of `drift`), or not (`reason`). It covers the placements recorded
        up to now (their highest `seq`); a later one was converged, and seen, after it."""
        seq = self._run("SELECT COALESCE(MAX(seq), 0) FROM placements")[0][0]
        doc = {"verified": verified, "reason": reason, "drift": drift or {}, "seq": int(seq)}
        self._run(
            "INSERT INTO meta VALUES ('fabric_check', ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (json.dumps(doc),),
        )

    def fabric_check(self) -> dict[str, Any] | None:
        rows = self._run("SELECT value FROM meta WHERE key = 'fabric_check'")
        return json.loads(rows[0][0]) if rows else None

    def placements(self, job_id: str, limit: int = 50) -> list[dict[str, Any]]:
        rows = self._run(
            f"SELECT {_PLACEMENT_COLUMNS} FROM placements WHERE job_id = ? "
            "ORDER BY seq DESC LIMIT ?",
            (job_id, limit),
        )
        return [_placement(r) for r in rows]

    def current(self, job_id: str) -> dict[str, Any] | None:
        rows = self.placements(job_id, 1)
        return rows[0] if rows else None

    def currents(self) -> dict[str, dict[str, Any]]:
        """Every job's current placement (`current`), by job, in one query."""

        def load() -> dict[str, dict[str, Any]]:
            cols = ", ".join(f"p.{c}" for c in _PLACEMENT_COLUMNS.split(", "))
            rows = self._run(f"SELECT {cols} {_CURRENT_PLACEMENTS}")
            return {r[1]: _placement(r) for r in rows}

        return {j: dict(c) for j, c in self._per_version("currents", load).items()}

    def unsettled(self, statuses: Sequence[str]) -> list[str]:
        """The jobs whose current placement has one of `statuses` and whose deletion is not
        under way, sorted: one query, no placement decoded (`currents()` and `deleting()`
        decode every job's JSON after any write: 1.5 s at 10,000 jobs)."""
        marks = ", ".join("?" for _ in statuses)
        rows = self._run(
            f"SELECT p.job_id {_CURRENT_PLACEMENTS} WHERE p.status IN ({marks}) "
            "AND p.job_id NOT IN (SELECT job_id FROM desired WHERE state = ?) "
            "ORDER BY p.job_id",
            (*statuses, DELETING),
        )
        return [r[0] for r in rows]

    # desired state
    def set_desired(
        self, job_id: str, strategy: str, doc: dict[str, Any], bodies: dict[str, Any]
    ) -> int:
        """Record the job's target placement (state `pending`); returns its generation."""

        def fn(q: Query) -> int:
            rows = q(
                "INSERT INTO desired VALUES (?, 1, ?, ?, ?, ?, "
                f"{self._db.NOW}) ON CONFLICT (job_id) DO UPDATE SET "
                "generation = desired.generation + 1, strategy = excluded.strategy, "
                "doc = excluded.doc, bodies = excluded.bodies, state = excluded.state, "
                "updated = excluded.updated RETURNING generation",
                (job_id, strategy, json.dumps(doc), json.dumps(bodies), PENDING),
            )
            self._claim(q, job_id)
            return int(rows[0][0])

        return self._write(fn)

    def desired(self, job_id: str | None = None) -> dict[str, dict[str, Any]]:
        """Desired rows by job: generation, strategy, placement doc, intent bodies, state."""
        q = "SELECT job_id, generation, strategy, doc, bodies, state FROM desired"

        def decoded(rows: list[tuple]) -> dict[str, dict[str, Any]]:
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

        if job_id is not None:
            return decoded(self._run(q + " WHERE job_id = ?", (job_id,)))
        every = self._per_version("desired", lambda: decoded(self._run(q)))
        return {j: dict(d) for j, d in every.items()}

    def deleting(self) -> set[str]:
        """The jobs whose deletion is under way (desired state `deleting`)."""
        return {j for j, d in self.desired().items() if d["state"] == DELETING}

    def set_desired_state(self, job_id: str, state: str) -> None:
        self._write(
            lambda q: q(
                f"UPDATE desired SET state = ?, updated = {self._db.NOW} WHERE job_id = ?",
                (state, job_id),
            )
        )

    def mark_deleting(self, job_id: str) -> None:
        """The job is being removed: a crash from here on is finished by reconcile."""
        self._write(
            lambda q: q(
                f"INSERT INTO desired VALUES (?, 0, '', '{{}}', '{{}}', ?, {self._db.NOW}) "
                "ON CONFLICT (job_id) DO UPDATE SET state = excluded.state, "
                "updated = excluded.updated",
                (job_id, DELETING),
            )
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

        def fn(q: Query) -> int:
            seq = self._insert_placement(q, job_id, strategy, status, reason, doc)
            q(
                f"UPDATE desired SET state = ?, updated = {self._db.NOW} "
                "WHERE job_id = ? AND generation = ?",
                (CONVERGED, job_id, generation),
            )
            self._claim(q, job_id, strict=False)
            return seq

        return self._write(fn)

    # intents owned: recorded before they are submitted, retired before they are withdrawn
    def intents(self, job_id: str | None = None) -> dict[str, tuple[str, str]]:
        """Owned, not retired intents: key -> (job, digest of the body ONOS accepted, or
        UNCONFIRMED)."""
        if job_id is None:
            rows = self._run("SELECT key, job_id, digest FROM intents WHERE retired = 0")
        else:
            rows = self._run(
                "SELECT key, job_id, digest FROM intents WHERE job_id = ? AND retired = 0",
                (job_id,),
            )
        return {k: (j, d) for k, j, d in rows}

    def owned(self) -> dict[str, tuple[str, bool]]:
        """Every key this store owns: key -> (job, retired)."""
        rows = self._run("SELECT key, job_id, retired FROM intents")
        return {k: (j, bool(r)) for k, j, r in rows}

    def intent_body(self, key: str) -> dict[str, Any] | None:
        rows = self._run("SELECT body FROM intents WHERE key = ?", (key,))
        return json.loads(rows[0][0]) if rows else None

    def own_intent(self, key: str, job_id: str, body: dict[str, Any]) -> None:
        """Before submitting: the key is ours, the body ONOS holds unknown."""
        self._write(
            lambda q: q(
                "INSERT INTO intents VALUES (?, ?, ?, ?, 0) ON CONFLICT (key) DO UPDATE SET "
                "job_id = excluded.job_id, digest = excluded.digest, body = excluded.body, "
                "retired = 0",
                (key, job_id, UNCONFIRMED, json.dumps(body)),
            )
        )

    def confirm_intent(self, key: str, digest: str) -> None:
        """ONOS accepted the body whose digest this is."""
        self._write(lambda q: q("UPDATE intents SET digest = ? WHERE key = ?", (digest, key)))

    def retire_intent(self, key: str) -> None:
        """Before withdrawing: still ours (reconcile withdraws it), no longer wanted."""
        self._write(lambda q: q("UPDATE intents SET retired = 1 WHERE key = ?", (key,)))

    def drop_intent(self, key: str) -> None:
        """After ONOS withdrew it."""
        self._write(lambda q: q("DELETE FROM intents WHERE key = ?", (key,)))

    # leases: which replica of the ones sharing this store leads (runs the loop, the
    # scheduler and reconcile). Times are the database's clock, not the replicas'.
    def acquire_lease(self, name: str, holder: str, ttl_s: float) -> tuple[bool, str, float]:
        """Take or renew `name` for `holder` unless another holder's lease is unexpired, in
        one statement. Returns (held by us, holder, expiry)."""
        now = self._db.NOW
        session = self._db.session()

        def fn(q: Query) -> tuple[bool, str, float]:
            rows = q(
                f"INSERT INTO leases VALUES (?, ?, {now} + CAST(? AS DOUBLE PRECISION), ?) "
                "ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, "
                "expires = excluded.expires, session = excluded.session "
                f"WHERE leases.holder = excluded.holder OR leases.expires < {now} "
                "RETURNING holder, expires",
                (name, holder, ttl_s, session),
            )
            if rows:
                return True, holder, float(rows[0][1])
            h, e = q("SELECT holder, expires FROM leases WHERE name = ?", (name,))[0]
            return h == holder, h, float(e)

        with self._db.tx() as q:
            return fn(q)

    def lease_session_gone(self, name: str, holder: str) -> bool:
        """PostgreSQL: `holder` holds `name` from a database session that has ended (its
        process was killed); False where that cannot be told."""
        rows = self._run("SELECT session FROM leases WHERE name = ? AND holder = ?", (name, holder))
        if not rows or rows[0][0] is None:
            return False
        return not self._db.session_alive(int(rows[0][0]))

    def release_lease(self, name: str, holder: str) -> None:
        self._run("DELETE FROM leases WHERE name = ? AND holder = ?", (name, holder))
