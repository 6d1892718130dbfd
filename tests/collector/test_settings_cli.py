"""Settings errors name the field; the CLI answers bad input with one line and status 2."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from int_collector.settings import SettingsError, load_settings
from int_collector.wire import Decoder

from .test_vectors import SPEC_TR_TCP


def test_defaults_and_env_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = load_settings()
    assert (s.listen_port, s.influx_org, s.influx_bucket) == (32766, "-", "telemetry/autogen")
    f = tmp_path / "c.toml"
    f.write_text(
        '[int_collector]\nlisten_port = 4000\ninflux_bucket = "b"\nint_udp_ports = [5000]\n'
    )
    monkeypatch.setenv("INT_COLLECTOR_INFLUX_BUCKET", "from-env")
    s = load_settings(f)
    assert (s.listen_port, s.influx_bucket, s.int_udp_ports) == (4000, "from-env", [5000])
    assert load_settings(f, listen_port=1).listen_port == 1


@pytest.mark.parametrize(
    ("env", "file", "message"),
    [
        (
            {"INT_COLLECTOR_LISTEN_PORT": "70000"},
            None,
            "INT_COLLECTOR_LISTEN_PORT: Input should be less",
        ),
        (
            {"INT_COLLECTOR_EWMA_ALPHA": "x"},
            None,
            "INT_COLLECTOR_EWMA_ALPHA: Input should be a valid number",
        ),
        ({}, "influx_url = 'localhost:8086'\n", "influx_url: Value error, must start with http://"),
        ({}, "bufer_points = 5\n", "bufer_points: unknown setting"),
        ({}, "int_udp_ports = [0]\n", "int_udp_ports: Value error, UDP port 0"),
        ({}, "retry_max_s = 0.1\n", "retry_max_s must be >= retry_initial_s"),
        ({}, "listen_port = \n", "not valid TOML"),
    ],
)
def test_bad_settings_name_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict, file: str | None, message: str
) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    path = None
    if file is not None:
        path = tmp_path / "c.toml"
        path.write_text(file)
    with pytest.raises(SettingsError, match=message):
        load_settings(path)


def run_cli(
    *args: str, env: dict | None = None, input: str | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "int_collector", *args],
        capture_output=True, text=True, timeout=60, input=input,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_cli_serve_with_bad_setting_is_one_line() -> None:
    p = run_cli("serve", env={"INT_COLLECTOR_BUFFER_POINTS": "0"})
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "int-collector: error: INT_COLLECTOR_BUFFER_POINTS: "
        "Input should be greater than or equal to 1"
    ]


def test_cli_serve_missing_config_file() -> None:
    p = run_cli("serve", "--config", "/nonexistent/c.toml")
    assert p.returncode == 2 and "c.toml: cannot read" in p.stderr and "Traceback" not in p.stderr


def test_cli_decode_prints_json_and_rejects_garbage() -> None:
    p = run_cli("decode", "--int-udp-port", "5000", SPEC_TR_TCP.hex())
    assert p.returncode == 0, p.stderr
    (doc,) = json.loads(p.stdout)
    assert doc["node_id"] == 3 and [x["node_id"] for x in doc["hops"]] == [2, 1]
    assert doc["flow"]["src"] == "10.0.0.1"
    bad = run_cli("decode", "3000")
    assert bad.returncode == 2 and bad.stderr.startswith("int-collector: error: report: truncated")
    assert run_cli("decode", "zz").stderr.startswith("int-collector: error: hex:")


def test_cli_generate_sends_decodable_reports() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        s.settimeout(10)
        port = s.getsockname()[1]
        p = run_cli("generate", "--target", f"127.0.0.1:{port}", "--rate", "2000", "--count", "50",
                    "--switches", "6")  # fmt: skip
        assert p.returncode == 0, p.stderr
        got = [s.recv(65535) for _ in range(50)]
    reports = [r for d in got for r in Decoder().decode(d)]
    assert len(reports) == 50 and all(r.hop_count in (1, 3) for r in reports)
    assert run_cli("generate", "--target", "nowhere").returncode == 2
    assert "--switches: need at least 2" in run_cli("generate", "--switches", "1").stderr


def test_cli_generate_batches_reports_from_two_processes() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        s.settimeout(10)
        port = s.getsockname()[1]
        p = run_cli("generate", "--target", f"127.0.0.1:{port}", "--rate", "4000", "--count",
                    "64", "--switches", "8", "--per-datagram", "8", "--processes", "2")  # fmt: skip
        assert p.returncode == 0, p.stderr
        got = [s.recvfrom(65535) for _ in range(8)]
    decoded = [Decoder().decode(d) for d, _addr in got]
    assert [len(x) for x in decoded] == [8] * 8
    assert all(len({r.node_id for r in x}) == 1 for x in decoded)  # one switch per datagram
    assert len({addr for _d, addr in got}) > 1  # each switch from its own source port
    bad = run_cli("generate", "--format", "v1", "--per-datagram", "4")
    assert bad.returncode == 2 and "--per-datagram" in bad.stderr and "Traceback" not in bad.stderr
    assert "--processes: 1-64" in run_cli("generate", "--processes", "0").stderr


def test_cli_serve_cannot_bind_is_one_line() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))  # held without SO_REUSEPORT: nobody else may join
        port = s.getsockname()[1]
        p = run_cli("serve", "--listen", f"127.0.0.1:{port}", env={"INT_COLLECTOR_WORKERS": "2"})
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip() == (
        f"int-collector: error: listen: cannot bind udp 127.0.0.1:{port} (Address already in use)"
    )


def test_source_only_metadata_from_toml_and_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = tmp_path / "c.toml"
    f.write_text("[int_collector.source_only_metadata]\n21587 = { 0 = 2 }\n")
    assert load_settings(f).source_only_metadata == {21587: {0: 2}}
    monkeypatch.setenv("INT_COLLECTOR_SOURCE_ONLY_METADATA", '{"7": {"15": 1}}')
    assert load_settings(f).source_only_metadata == {7: {15: 1}}
    monkeypatch.setenv("INT_COLLECTOR_SOURCE_ONLY_METADATA", '{"7": {"16": 1}}')
    with pytest.raises(SettingsError, match="DS Instruction bit 16"):
        load_settings()


def test_cli_generate_fast_sends_decodable_reports_from_each_switch() -> None:
    """The compiled sender (sendmmsg) the benchmark offers high rates with: every report it
    sends is a valid one, each switch from its own socket with its own sequence numbers."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 1024 * 1024)
        s.bind(("127.0.0.1", 0))
        s.settimeout(5)
        port = s.getsockname()[1]
        p = run_cli("generate", "--fast", "--target", f"127.0.0.1:{port}", "--rate", "4000",
                    "--duration", "0.5", "--switches", "8")  # fmt: skip
        assert p.returncode == 0, p.stderr
        sent = int(p.stderr.split("sent ")[1].split()[0])
        got = []
        s.settimeout(0.5)
        with contextlib.suppress(TimeoutError):
            while True:
                got.append(s.recvfrom(65535))
    assert 1500 <= sent <= 2100 and len(got) == sent
    seqs: dict[tuple, list[int]] = {}
    for d, addr in got:
        (r,) = Decoder().decode(d)
        seqs.setdefault((addr, r.node_id), []).append(r.seq)
    assert len({a for a, _n in seqs}) == len(seqs) == 6  # one source port per reporting switch
    assert all(v == list(range(len(v))) for v in seqs.values())
    bad = run_cli("generate", "--fast", "--count", "5")
    assert bad.returncode == 2 and "--fast" in bad.stderr


def test_cli_generate_fast_loads_its_sender_from_numbas_cache() -> None:
    """`generate --fast` starts without compiling its sender: it calls sendmmsg by symbol
    name, which numba can cache (through a ctypes pointer it could not: every start compiled
    it again, with "Cannot cache compiled function"). The second run of two loads it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        args = ("generate", "--fast", "--target", f"127.0.0.1:{port}", "--rate", "1000",
                "--duration", "0.1", "--switches", "2")  # fmt: skip
        runs = [run_cli(*args, env={"NUMBA_DEBUG_CACHE": "1"}) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
        assert "Cannot cache" not in r.stderr, r.stderr[-2000:]
    loaded = [ln for ln in runs[1].stdout.splitlines() if "data loaded from" in ln]
    assert any("blast._send_round" in ln for ln in loaded), runs[1].stdout[-2000:]


def test_cli_generate_fast_keeps_the_duration_when_asked_more_than_it_can_send() -> None:
    """Asked a rate far above what one process sends, the compiled sender skips what is
    overdue instead of sending it late: a 1 s run took 3-4x as long before."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))  # bound, never read: the kernel drops what overflows
        port = s.getsockname()[1]
        p = run_cli("generate", "--fast", "--target", f"127.0.0.1:{port}", "--rate",
                    "50000000", "--duration", "1", "--switches", "8")  # fmt: skip
    assert p.returncode == 0, p.stderr
    elapsed = float(p.stderr.split(" in ")[1].split(" s ")[0])
    cpu = float(p.stderr.split(", ")[-1].split(" s of CPU")[0])
    sent = int(p.stderr.split("sent ")[1].split()[0])
    assert elapsed >= 1.0 and sent > 0, p.stderr
    # One round past the end at most (16,384 datagrams). Its CPU time, not its wall time,
    # which a loaded machine stretches (2.05 s at load 15, one round preempted): sending the
    # backlog kept the sender busy 3-4 times the duration.
    assert cpu < 2.0, p.stderr


def test_cli_generate_fast_flows_gives_that_many_distinct_flows() -> None:
    """`--flows N` (the benchmark's many-flows rows): the datagrams decode, and their first
    reports carry exactly N distinct flows."""
    from int_collector.wire import Decoder

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 1024 * 1024)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        p = run_cli("generate", "--fast", "--target", f"127.0.0.1:{port}", "--rate", "6000",
                    "--duration", "0.5", "--switches", "8", "--flows", "500")  # fmt: skip
        assert p.returncode == 0, p.stderr
        s.settimeout(0.5)
        got = []
        with contextlib.suppress(TimeoutError):
            while True:
                got.append(s.recv(65535))
    dec = Decoder()
    flows = {dec.decode(d)[0].flow for d in got}
    assert len(got) > 1000 and len(flows) == 500
    assert run_cli("generate", "--flows", "5").returncode != 0  # needs --fast
