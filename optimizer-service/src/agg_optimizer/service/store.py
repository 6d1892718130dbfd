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

import contextlib
import fcntl
import hashlib
import json
import logging
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ..pools import Claim, describe, doc_claims, overlaps
from .errors import PoolConflict, Unavailable

T = TypeVar("T")
log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, spec TEXT NOT NULL, strategy TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS placements (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, strategy TEXT NOT NULL,
    status TEXT NOT NULL, reason TEXT, doc TEXT NOT NULL, created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS placements_job ON placements (job_id, seq);
CREATE TABLE IF NOT EXISTS intents (
    key TEXT PRIMARY KEY, job_id TEXT NOT NULL, digest TEXT NOT NULL, body TEXT NOT NULL,
    retired INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS progress (
    job_id TEXT PRIMARY KEY, doc TEXT NOT NULL, updated REAL NOT NULL);
CREATE TABLE IF NOT EXISTS desired (
    job_id TEXT PRIMARY KEY, generation INTEGER NOT NULL, strategy TEXT NOT NULL,
    doc TEXT NOT NULL, bodies TEXT NOT NULL, state TEXT NOT NULL, updated REAL NOT NULL);
CREATE TABLE IF NOT EXISTS leases (
    name TEXT PRIMARY KEY, holder TEXT NOT NULL, expires REAL NOT NULL, session INTEGER);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS version (id INTEGER PRIMARY KEY, value BIGINT NOT NULL);
"""

# The slot ledger (docs/service.md, "Invariants"): each job's claims on switch registers, its
# current placement's pools while it holds them and its desired placement's, rewritten in the
# transaction that records either. The database itself refuses two jobs' overlapping claims:
# a trigger in SQLite, an exclusion constraint over int4range in PostgreSQL (btree_gist gives
# `=` and `<>` to GiST; it is a trusted extension from PostgreSQL 13).
POOLS_SQLITE = """
CREATE TABLE IF NOT EXISTS pools (
    job_id TEXT NOT NULL, switch TEXT NOT NULL, lo INTEGER NOT NULL, hi INTEGER NOT NULL,
    CHECK (0 <= lo AND lo < hi));
CREATE INDEX IF NOT EXISTS pools_switch ON pools (switch, lo);
CREATE INDEX IF NOT EXISTS pools_job ON pools (job_id);
CREATE TRIGGER IF NOT EXISTS pools_disjoint BEFORE INSERT ON pools
WHEN EXISTS (SELECT 1 FROM pools WHERE switch = NEW.switch AND job_id <> NEW.job_id
             AND lo < NEW.hi AND NEW.lo < hi)
BEGIN SELECT RAISE(ABORT, 'pools_disjoint: two jobs claim the same slots'); END;
"""
POOLS_PG = """
CREATE EXTENSION IF NOT EXISTS btree_gist;
CREATE TABLE IF NOT EXISTS pools (
    job_id TEXT NOT NULL, switch TEXT NOT NULL, lo INTEGER NOT NULL, hi INTEGER NOT NULL,
    CHECK (0 <= lo AND lo < hi),
    CONSTRAINT pools_disjoint EXCLUDE USING gist
        (switch WITH =, int4range(lo, hi) WITH &&, job_id WITH <>));
CREATE INDEX IF NOT EXISTS pools_job ON pools (job_id);
"""

# PostgreSQL's spelling of the same tables: double precision times, a sequence for seq.
PG_SCHEMA = SCHEMA.replace(" REAL ", " DOUBLE PRECISION ").replace(
    "seq INTEGER PRIMARY KEY AUTOINCREMENT", "seq BIGSERIAL PRIMARY KEY"
)

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

Query = Callable[..., list[tuple]]


class StoreUnavailable(Unavailable):
    """The database cannot be reached (PostgreSQL down or restarting): a 503 naming it;
    the next call connects again."""


def is_url(target: str) -> bool:
    return target.startswith(("postgresql://", "postgres://"))


def _redacted(url: str) -> str:
    """The URL without its password (messages and logs)."""
    u = urlsplit(url)
    host = u.hostname or ""
    if u.port:
        host += f":{u.port}"
    return f"{u.scheme}://{u.username + '@' if u.username else ''}{host}{u.path}"


class _Sqlite:
    """One file (or :memory:); `now` is SQLite's clock, as PostgreSQL's is there."""

    name = "sqlite"
    NOW = "((julianday('now') - 2440587.5) * 86400.0)"

    def __init__(self, path: str) -> None:
        self.path = path
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA busy_timeout=10000")  # replicas on one file wait, not fail
        self.lock = threading.RLock()
        with self.lock:
            self.db.executescript(SCHEMA + POOLS_SQLITE)
            # a store written before retirement, or lease sessions, were recorded
            for table, col, decl in (
                ("intents", "retired", "INTEGER NOT NULL DEFAULT 0"),
                ("leases", "session", "INTEGER"),
            ):
                cols = {r[1] for r in self.db.execute(f"PRAGMA table_info({table})")}
                if col not in cols:
                    self.db.execute(f"ALTER TABLE {table} ADD COLUMN {col} {decl}")
        self._file_lock = threading.Lock()
        self._fh: Any = None

    def run(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        with self.lock, self._errors():
            return self.db.execute(sql, params).fetchall()

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.IntegrityError as e:
            if "pools_disjoint" in str(e):
                raise PoolConflict(f"the store refused overlapping slot pools ({e})") from None
            raise
        except sqlite3.OperationalError as e:  # locked past busy_timeout, disk, I/O
            if "pools_disjoint" in str(e):
                raise PoolConflict(f"the store refused overlapping slot pools ({e})") from None
            raise StoreUnavailable(f"SQLite at {self.path}: {e}") from None

    @contextlib.contextmanager
    def tx(self) -> Iterator[Query]:
        with self.lock, self._errors():
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield lambda sql, params=(): self.db.execute(sql, params).fetchall()
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")

    def session(self) -> int | None:
        return None

    def session_alive(self, session: int) -> bool:
        return True

    def lock_apply(self, name: str) -> None:
        """This process's threads, then every process on the file (flock: released when
        the process dies)."""
        self._file_lock.acquire()
        if self.path == ":memory:":
            return
        try:
            key = hashlib.sha256(name.encode()).hexdigest()[:16]
            self._fh = open(f"{self.path}.apply-{key}.lock", "a+")  # noqa: SIM115
            fcntl.flock(self._fh, fcntl.LOCK_EX)
        except BaseException:
            self._file_lock.release()
            raise

    def unlock_apply(self, name: str) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None
        self._file_lock.release()

    def close(self) -> None:
        with self.lock:
            self.db.close()


class _Postgres:
    """A PostgreSQL database that replicas share: one connection for the store's queries
    and one for the apply lock (an advisory lock held across ONOS calls must not pin the
    queries' connection). A connection that breaks is dropped and the call answers
    StoreUnavailable; the next call connects again."""

    name = "postgresql"
    NOW = "CAST(extract(epoch FROM clock_timestamp()) AS DOUBLE PRECISION)"
    CONNECT_TIMEOUT_S = 10

    def __init__(self, url: str) -> None:
        import psycopg  # the PostgreSQL backend only

        self.psycopg = psycopg
        self.url = url
        self.where = _redacted(url)
        self.lock = threading.RLock()
        self.conn: Any = None
        self._lock_conn: Any = None
        self._apply = threading.Lock()
        with self.tx() as q:
            # replicas starting together: one creates the tables, the others wait
            q("SELECT pg_advisory_xact_lock(?)", (_key("innet-agg schema"),))
            for stmt in (PG_SCHEMA + POOLS_PG).split(";"):
                if stmt.strip():
                    q(stmt)

    def _connect(self) -> Any:
        try:
            return self.psycopg.connect(
                self.url, autocommit=True, connect_timeout=self.CONNECT_TIMEOUT_S
            )
        except self.psycopg.OperationalError as e:
            raise StoreUnavailable(f"PostgreSQL at {self.where} unreachable: {_first(e)}") from None

    def _conn(self) -> Any:
        if self.conn is None or self.conn.closed:
            self.conn = self._connect()
        return self.conn

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except self.psycopg.errors.ExclusionViolation as e:
            raise PoolConflict(f"the store refused overlapping slot pools ({_first(e)})") from None
        except self.psycopg.OperationalError as e:
            with contextlib.suppress(Exception):
                self.conn.close()
            self.conn = None
            raise StoreUnavailable(f"PostgreSQL at {self.where}: {_first(e)}") from None

    @staticmethod
    def _sql(sql: str) -> str:
        return sql.replace("?", "%s")

    def run(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        with self.lock, self._errors():
            cur = self._conn().execute(self._sql(sql), params)
            return cur.fetchall() if cur.description else []

    @contextlib.contextmanager
    def tx(self) -> Iterator[Query]:
        with self.lock, self._errors():
            conn = self._conn()
            with conn.transaction():

                def q(sql: str, params: Sequence[Any] = ()) -> list[tuple]:
                    cur = conn.execute(self._sql(sql), params)
                    return cur.fetchall() if cur.description else []

                yield q

    def session(self) -> int | None:
        with self.lock, self._errors():
            return int(self._conn().info.backend_pid)

    def session_alive(self, session: int) -> bool:
        return bool(self.run("SELECT 1 FROM pg_stat_activity WHERE pid = ?", (session,)))

    def lock_apply(self, name: str) -> None:
        """A session-level advisory lock on a connection of its own: every replica's
        changes to one fabric one after another, and a replica that dies (SIGKILL) frees it
        with its session."""
        self._apply.acquire()
        try:
            if self._lock_conn is None or self._lock_conn.closed:
                self._lock_conn = self._connect()
            self._lock_conn.execute("SELECT pg_advisory_lock(%s)", (_key(name),))
        except BaseException as e:
            self._lock_conn = None
            self._apply.release()
            if isinstance(e, self.psycopg.OperationalError):
                raise StoreUnavailable(f"PostgreSQL at {self.where}: {_first(e)}") from None
            raise

    def unlock_apply(self, name: str) -> None:
        try:
            self._lock_conn.execute("SELECT pg_advisory_unlock(%s)", (_key(name),))
        except self.psycopg.Error:  # the session is gone, and the lock with it
            with contextlib.suppress(Exception):
                self._lock_conn.close()
            self._lock_conn = None
        finally:
            self._apply.release()

    def close(self) -> None:
        with self.lock:
            for c in (self.conn, self._lock_conn):
                if c is not None:
                    with contextlib.suppress(Exception):
                        c.close()


class ApplyLock:
    """`with lock:` around a change to the fabric; reusable, by any thread."""

    def __init__(self, db: _Sqlite | _Postgres, name: str) -> None:
        self.db, self.name = db, name

    def __enter__(self) -> None:
        self.db.lock_apply(self.name)

    def __exit__(self, *exc: object) -> None:
        self.db.unlock_apply(self.name)


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


def _key(name: str) -> int:
    """A signed 64-bit advisory lock key for `name`."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


def _first(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


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
