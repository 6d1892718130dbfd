"""`make influxdb`'s script finds Go the way the Makefile does (a new user's bare PATH has no
/usr/local/go/bin): it uses the GO it is given, and a cached binary needs no Go at all."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "int-collector" / "scripts" / "build-influxd.sh"
BARE = {"PATH": "/usr/bin:/bin"}


def _fake_go(tmp: Path) -> Path:
    """A `go` whose `install` leaves an influxd that reports the version in GOBIN."""
    go = tmp / "somewhere" / "go"
    go.parent.mkdir()
    go.write_text(
        "#!/bin/sh\nprintf '#!/bin/sh\\necho \"InfluxDB v1.8.10 (git: 1.8.10 fake)\"\\n' "
        '> "$GOBIN/influxd"\nchmod +x "$GOBIN/influxd"\n'
    )
    go.chmod(go.stat().st_mode | stat.S_IEXEC)
    return go


def test_the_go_it_is_given_builds_it(tmp_path: Path) -> None:
    go = _fake_go(tmp_path)
    env = {**BARE, "HOME": str(tmp_path), "GO": str(go)}
    r = subprocess.run([str(SCRIPT), str(tmp_path / "cache")], env=env, capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(tmp_path / "cache" / "bin" / "influxd")


def test_without_go_it_says_so_and_a_cached_binary_needs_none(tmp_path: Path) -> None:
    env = {**BARE, "HOME": str(tmp_path), "GO": str(tmp_path / "no-go")}
    r = subprocess.run([str(SCRIPT), str(tmp_path / "cache")], env=env, capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert r.returncode == 1 and "Go is needed" in r.stderr and "no-go" in r.stderr
    # built once (by the given go), a later run with no Go anywhere finds the cache
    subprocess.run([str(SCRIPT), str(tmp_path / "cache")], check=True, capture_output=True,
                   env={**env, "GO": str(_fake_go(tmp_path))}, timeout=120)  # fmt: skip
    r = subprocess.run([str(SCRIPT), str(tmp_path / "cache")], env=env, capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert os.access(r.stdout.strip(), os.X_OK)
