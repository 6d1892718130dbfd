"""Where the store keeps its rows: SQLite (one file, the embedded default) or PostgreSQL
(shared by replicas), behind one small interface (`run`, `tx`, sessions, the apply lock), and
the schema both use. `store.Store` is what the service calls."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agg_optimizer.service.errors import PoolConflict, Unavailable

Query = Callable[..., list[tuple]]

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


def _key(name: str) -> int:
    """A signed 64-bit advisory lock key for `name`."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


def _first(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


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
