"""A private PostgreSQL server for tests: Debian's `postgresql` binaries (`.ci/run` installs
them), a fresh cluster in a temporary directory, a free TCP port on loopback, password
authentication (the URL carries it, as a deployment's would). As root the server runs as
the `postgres` user (PostgreSQL refuses root); it dies with the test process.

    with PgServer(tmp) as pg:
        pg.url  # postgresql://innetagg:<password>@127.0.0.1:<port>/innetagg
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from int_collector import children
from int_collector.influxd import free_port

START_S = 180  # initdb and a first start on a loaded 2-core machine


def bindir() -> Path | None:
    """The newest installed PostgreSQL's binaries, or None."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4])
    )
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def skip_reason() -> str | None:
    if bindir() is None:
        return "no PostgreSQL server binaries (initdb): apt-get install postgresql (.ci/run does)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and no `postgres` user to run PostgreSQL as"
    return None


class PgServer:
    def __init__(self, base: Path, name: str = "pg") -> None:
        # Its own directory under /tmp, not under `base`: pytest's are 0700 root's, which
        # the postgres user cannot pass through. Removed on stop; the log stays in `base`.
        self.dir = Path(tempfile.mkdtemp(prefix=f"innet-agg-{name}-"))
        self.port = free_port()
        self.user = "innetagg"
        self.password = secrets.token_urlsafe(12)
        self.db = "innetagg"
        self.proc: subprocess.Popen | None = None
        self.log = base / f"{name}.log"
        bins = bindir()
        if bins is None:
            raise RuntimeError(skip_reason() or "no PostgreSQL")
        self.bin = bins
        self._as: dict = {}
        if os.geteuid() == 0:
            self._as = {"user": "postgres", "group": "postgres", "extra_groups": []}

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}:{self.password}@127.0.0.1:{self.port}/{self.db}"

    def _own(self, path: Path) -> None:
        if self._as:
            pw = pwd.getpwnam("postgres")
            os.chown(path, pw.pw_uid, pw.pw_gid)

    def __enter__(self) -> PgServer:
        try:
            self._init()
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _init(self) -> None:
        self._own(self.dir)
        pwfile = self.dir / "pw"
        pwfile.write_text(self.password + "\n")
        self._own(pwfile)
        data = self.dir / "data"
        subprocess.run(
            [str(self.bin / "initdb"), "-D", str(data), "-U", self.user, "--pwfile", str(pwfile),
             "--auth=scram-sha-256", "-E", "UTF8", "--no-instructions"],
            check=True, capture_output=True, timeout=START_S, **self._as,
        )  # fmt: skip
        pwfile.unlink()

    def start(self) -> None:
        """Start (again) on the same data and port; returns once it accepts connections."""
        sock = self.dir / "sock"
        sock.mkdir(exist_ok=True)
        self._own(sock)
        self.proc = children.spawn(
            [str(self.bin / "postgres"), "-D", str(self.dir / "data"), "-p", str(self.port),
             "-k", str(sock), "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
             "-c", "max_connections=200"],
            log=self.log, **self._as,
        )  # fmt: skip
        self._create_db()

    def _create_db(self) -> None:
        import psycopg

        admin = f"postgresql://{self.user}:{self.password}@127.0.0.1:{self.port}/postgres"

        def up() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise children.NotReady(f"postgres exited: {self.log.read_text()[-2000:]}")
            try:
                with psycopg.connect(admin, autocommit=True, connect_timeout=5) as c:
                    if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                                     (self.db,)).fetchall():  # fmt: skip
                        c.execute(f'CREATE DATABASE "{self.db}"')
                return True
            except psycopg.OperationalError:
                return False

        children.wait_ready(up, "PostgreSQL", timeout_s=START_S, proc=self.proc, log=self.log)

    def kill(self) -> None:
        """SIGKILL the server (the database gone at once, as a crashed host's)."""
        if self.proc is not None:
            children.stop(self.proc, timeout_s=0.1)
            self.proc = None

    def stop(self) -> None:
        """Stop the server for good and remove its files."""
        self.halt()
        shutil.rmtree(self.dir, ignore_errors=True)

    def halt(self) -> None:
        """A clean shutdown; `start` brings it back on the same data. PostgreSQL's "fast"
        mode (SIGINT to the postmaster: sessions rolled back and ended), not SIGTERM's
        "smart" mode, which waits for every client to leave: with a service's connection
        pool open it waited out the whole 30 s before the SIGKILL, in every test's teardown."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(30)
            children.stop(self.proc, timeout_s=5)
            self.proc = None


def connections(url: str) -> int:
    """Client sessions open on `url`'s database (besides this one)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as c:
        return int(
            c.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()"
            ).fetchone()[0]
        )


def wait_gone(proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
