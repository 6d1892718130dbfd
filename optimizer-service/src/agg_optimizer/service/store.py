"""SQLite state: jobs, placements (history), and the intents the service believes it applied.

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
"""


class Store:
    def __init__(self, path: Path | str) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(SCHEMA)
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

    # intents believed applied
    def intents(self, job_id: str | None = None) -> dict[str, tuple[str, str]]:
        with self.lock:
            if job_id is None:
                rows = self.db.execute("SELECT key, job_id, digest FROM intents").fetchall()
            else:
                rows = self.db.execute(
                    "SELECT key, job_id, digest FROM intents WHERE job_id = ?", (job_id,)
                ).fetchall()
        return {k: (j, d) for k, j, d in rows}

    def intent_body(self, key: str) -> dict[str, Any] | None:
        with self.lock:
            row = self.db.execute("SELECT body FROM intents WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def put_intent(self, key: str, job_id: str, digest: str, body: dict[str, Any]) -> None:
        with self.lock:
            self.version += 1
            self.db.execute(
                "INSERT OR REPLACE INTO intents VALUES (?, ?, ?, ?)",
                (key, job_id, digest, json.dumps(body)),
            )

    def drop_intent(self, key: str) -> None:
        with self.lock:
            self.version += 1
            self.db.execute("DELETE FROM intents WHERE key = ?", (key,))
