"""`agg-optimizer demo` as a user runs it, stopped every way a run ends: it finishes, a part
fails to start, Ctrl-C, `timeout` (SIGTERM), and SIGKILL. Each time no process it started
(InfluxDB, the collector's supervisor, fork server and workers, the service) survives it,
and an earlier run's results never remain to be taken for this run's.

Every process of a run is found by a marker in its environment, which every child inherits,
so a survivor is found even after its parent died and it was re-parented."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from int_collector import children
from int_collector.influxd import default_binary

MARK = "INNET_AGG_TEST_RUN"
# A cold start on a loaded 2-core machine: the demo waits for each part up to minutes.
START_S = 900.0


def _marked(token: str) -> list[tuple[int, str]]:
    """(pid, command line) of every live process whose environment carries the token."""
    needle = f"{MARK}={token}".encode()
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            if needle not in Path(f"/proc/{d}/environ").read_bytes().split(b"\0"):
                continue
            stat = Path(f"/proc/{d}/stat").read_text()
            if stat[stat.rindex(")") + 2] == "Z":
                continue
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        out.append((int(d), cmd.strip()))
    return out


class Demo:
    def __init__(self, out: Path, *extra: str, **env: str) -> None:
        if not default_binary().is_file():
            pytest.skip(f"no influxd at {default_binary()}: `make influxdb` builds it")
        self.token = uuid.uuid4().hex
        self.out = out
        exe = Path(sys.executable).parent / "agg-optimizer"
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [str(exe), "demo", "--out", str(out), *extra],
            env={**os.environ, MARK: self.token, "COLUMNS": "200", **env},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip

    def until(self, text: str, timeout_s: float = START_S) -> None:
        """Read the demo's output until a line holds `text`."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line.rstrip())
            if text in line:
                return
        self.proc.kill()
        pytest.fail(f"the demo never printed {text!r}:\n" + "\n".join(self.lines[-30:]))

    def finish(self, timeout_s: float = START_S) -> int:
        out, _ = self.proc.communicate(timeout=timeout_s)
        self.lines += out.splitlines()
        return self.proc.returncode

    def survivors(self, grace_s: float = 60.0) -> list[tuple[int, str]]:
        """What is still running of the run after `grace_s` (a worker flushing, say)."""
        deadline = time.monotonic() + grace_s
        while (left := _marked(self.token)) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid, _ in left:  # leave nothing behind for the next test either
            os.kill(pid, signal.SIGKILL)
        return left


def _stale(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "timeline.json").write_text('{"an": "earlier run"}')
    (out / "loop.png").write_bytes(b"not this run's plot")


def test_a_run_to_the_end_leaves_its_results_and_no_process(tmp_path: Path) -> None:
    _stale(tmp_path)
    d = Demo(tmp_path, "--duration", "10")
    assert d.finish() == 0, "\n".join(d.lines[-30:])
    assert not d.survivors(), "processes survived the run"
    assert "earlier run" not in (tmp_path / "timeline.json").read_text()
    assert (tmp_path / "loop.png").read_bytes().startswith(b"\x89PNG")


def test_a_part_that_fails_to_start_ends_the_run_in_one_line(tmp_path: Path) -> None:
    _stale(tmp_path)
    # The service refuses this setting at start (exit status 2): the demo must say which
    # part failed and where its log is, without a traceback, and stop the others.
    d = Demo(tmp_path, AGG_OPTIMIZER_ONOS_TIMEOUT_S="-1")
    code = d.finish()
    text = "\n".join(d.lines)
    assert code == 1, text
    assert "Traceback" not in text, text
    err = [ln for ln in d.lines if ln.startswith("agg-optimizer demo:")]
    assert len(err) == 1 and "agg-optimizer serve" in err[0], text
    assert str(tmp_path / "run" / "service.log") in err[0], err
    assert not d.survivors(), "processes survived the failed run"
    assert not (tmp_path / "timeline.json").exists() and not (tmp_path / "loop.png").exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL],
                         ids=["ctrl-c", "sigterm", "sigkill"])  # fmt: skip
def test_a_run_stopped_half_way_leaves_no_process(tmp_path: Path, sig: signal.Signals) -> None:
    d = Demo(tmp_path, "--duration", "60")
    d.until("congestion ")  # every part is up and the scenario runs
    running = _marked(d.token)
    names = " ".join(cmd for _, cmd in running)
    assert "influxd" in names and "int-collector" in names and "agg-optimizer serve" in names
    d.proc.send_signal(sig)
    code = d.finish(120)
    assert code != 0
    assert not d.survivors(), f"processes survived {sig.name}"
    assert not children.group_alive(d.proc.pid)
