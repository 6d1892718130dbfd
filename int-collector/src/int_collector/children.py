"""Child processes that end with whoever started them: the demo's, the harnesses' and the
tests' servers (InfluxDB, the collector, the service, ONOS).

Each child gets a process group of its own, so `stop` reaches everything it started in
turn (the collector's fork server and workers, the shell script in front of ONOS's Java);
and the kernel sends it SIGTERM when the thread that started it dies (`PR_SET_PDEATHSIG`),
so even a parent killed with SIGKILL leaves nothing behind. `on_signals` turns SIGTERM and
SIGHUP into `SystemExit`, so that a parent stopped by `timeout`, a closed terminal or a CI
runner runs its `finally` blocks, as Ctrl-C does.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

_PR_SET_PDEATHSIG = 1
# Resolved before any fork: the child runs only this call between fork and exec.
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None


def _die_with_parent() -> None:
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def spawn(
    argv: Sequence[str],
    *,
    log: Path | None = None,
    env: dict[str, str] | None = None,
    stdout: int | IO[Any] | None = None,
    stderr: int | IO[Any] | None = None,
    **kw: Any,
) -> subprocess.Popen:
    """`subprocess.Popen` in a new process group that dies with its parent. `log`: stdout
    and stderr go there (the file is created anew)."""
    if log is not None:
        with open(log, "wb") as f:
            return spawn(argv, env=env, stdout=f, stderr=subprocess.STDOUT, **kw)
    return subprocess.Popen(
        list(argv),
        env=env,
        stdout=stdout,
        stderr=stderr,
        stdin=kw.pop("stdin", subprocess.DEVNULL),
        start_new_session=True,
        preexec_fn=_die_with_parent,
        **kw,
    )


def stop(proc: subprocess.Popen, timeout_s: float = 15.0) -> int | None:
    """SIGTERM to the child's whole process group, SIGKILL to it after `timeout_s`; waits
    until the group is empty (a member that ignored SIGTERM is killed too)."""
    if proc.poll() is None or group_alive(proc.pid):
        _killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout_s)
    while group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    _killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
    return proc.returncode


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_alive(pgid: int) -> bool:
    """Whether any process (zombies aside) is left in process group `pgid`."""
    return bool(group_members(pgid))


def group_members(pgid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses.
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(d))
    return out


class Stopped(SystemExit):
    """SIGTERM or SIGHUP arrived: unwinds like Ctrl-C, running every `finally`."""


def on_signals() -> None:
    """Make SIGTERM and SIGHUP unwind the main thread (exit status 128 + signal), and SIGINT
    raise KeyboardInterrupt even where this process was started with it ignored (a shell
    starts a script's background jobs so, and Python then keeps ignoring it: a demo run
    from CI in the background ran on through Ctrl-C's signal)."""

    def handler(signum: int, _frame: object) -> None:
        raise Stopped(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)


class NotReady(RuntimeError):
    """A part did not come up: one line naming it and where its log is."""


def wait_ready(
    check: Callable[[], bool],
    what: str,
    *,
    timeout_s: float,
    proc: subprocess.Popen | None = None,
    log: Path | None = None,
    say: Callable[[str], None] | None = None,
    every_s: float = 10.0,
    poll_s: float = 0.1,
) -> float:
    """Poll `check` (exceptions but `NotReady` count as not yet) until it is true; every
    `every_s` say what is awaited and for how long. Raises `NotReady` naming `what` and
    `log` when `proc` exits or `timeout_s` passes. Returns the seconds waited."""
    t0 = time.monotonic()
    said = t0
    where = f"; its log: {log}" if log is not None else ""
    while True:
        if proc is not None and proc.poll() is not None:
            raise NotReady(f"{what}: the process exited with status {proc.returncode}{where}")
        try:
            if check():
                return time.monotonic() - t0
        except NotReady:  # the check itself found a part dead
            raise
        except Exception:  # not up yet, whatever it says
            pass
        now = time.monotonic()
        if now - t0 > timeout_s:
            raise NotReady(f"{what}: not ready after {timeout_s:.0f} s{where}")
        if say is not None and now - said >= every_s:
            said = now
            say(f"still waiting for {what} ({now - t0:.0f} s)")
        time.sleep(poll_s)
