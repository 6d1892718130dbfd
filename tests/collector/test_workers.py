"""`serve` with several receiving processes: the real CLI in a subprocess, a real InfluxDB."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from int_collector.influxd import free_port
from int_collector.wire import Flow, Hop, int_md_v2, report_v2, udp_int_packet

from .conftest import Db
from .test_end_to_end import metrics, wait_for

SWITCHES = 16
PER_SWITCH = 50


class Serve:
    def __init__(self, workers: int, db: Db | None, **env: str) -> None:
        self.port, self.http = free_port(), free_port()
        e = {
            **os.environ,
            "INT_COLLECTOR_WORKERS": str(workers),
            "INT_COLLECTOR_HTTP_PORT": str(self.http),
            "INT_COLLECTOR_INFLUX_URL": db.server.url if db else "http://127.0.0.1:9",
            "INT_COLLECTOR_INFLUX_BUCKET": db.bucket if db else "x/autogen",
            **env,
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "int_collector", "serve", "--listen", f"127.0.0.1:{self.port}"],
            env=e, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        wait_for(lambda: self.metric("int_collector_workers") == workers, 60, "workers up")

    def metric(self, name: str) -> float:
        try:
            return metrics(self.http).get((name, ()), -1)
        except (urllib.error.URLError, ConnectionError):
            return -1

    def health(self) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/healthz", timeout=5) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as e:
            return e.code, json.load(e)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def serves() -> Iterator[list[Serve]]:
    started: list[Serve] = []
    yield started
    for s in started:
        for w in s.health()[1].get("workers", []) if s.proc.poll() is None else []:
            if w["pid"]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(w["pid"], signal.SIGKILL)
        s.kill()


def datagram(switch: int, seq: int) -> bytes:
    flow = Flow(bytes([10, 0, 0, switch]), bytes([10, 0, 1, 1]), 17, 1000 + seq % 7, 5000)
    hops = [Hop(node_id=switch, ingress_port=1, egress_port=2, hop_latency=100 * switch,
                queue_id=0, queue_occupancy=seq % 5)]  # fmt: skip
    return report_v2(switch, seq, udp_int_packet(flow, int_md_v2(0xF000, hops)))


def send_from_switches(port: int, start_seq: int = 0) -> None:
    """Each switch from its own socket (source port), as separate switches would."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(SWITCHES)]
    try:
        for seq in range(start_seq, start_seq + PER_SWITCH):
            for i, s in enumerate(socks):
                s.sendto(datagram(i + 1, seq), ("127.0.0.1", port))
    finally:
        for s in socks:
            s.close()


def test_two_workers_count_every_report_once_and_flush_on_sigterm(
    db: Db, serves: list[Serve]
) -> None:
    # Nothing is written before SIGTERM: what InfluxDB holds afterwards every worker flushed.
    svc = Serve(2, db, INT_COLLECTOR_TICK_S="60", INT_COLLECTOR_FLUSH_INTERVAL_S="60")
    serves.append(svc)
    send_from_switches(svc.port)
    total = SWITCHES * PER_SWITCH
    wait_for(lambda: svc.metric("int_collector_reports_decoded_total") == total, 20, "all counted")
    code, health = svc.health()
    assert code == 200 and health["status"] == "ok"
    per_worker = [w["datagrams"] for w in health["workers"]]
    assert sum(per_worker) == total and all(n > 0 for n in per_worker)  # the kernel spread them
    m = metrics(svc.http)
    assert all(v == 0 for (name, _), v in m.items() if name == "int_collector_reports_lost_total")
    assert db.flux("") == []
    svc.proc.send_signal(signal.SIGTERM)
    assert svc.proc.wait(40) == 0, svc.proc.stderr.read() if svc.proc.stderr else ""
    rows = db.flux(
        '|> filter(fn: (r) => r._measurement == "int_reports" and r._field == "received")|> last()'
    )
    # Each switch's reports all reached one worker: one tracker per switch saw all of them.
    assert sorted((int(r["switch"]), r["_value"]) for r in rows) == [
        (s, PER_SWITCH) for s in range(1, SWITCHES + 1)
    ]
    links = db.flux(
        '|> filter(fn: (r) => r._measurement == "int_link") |> keep(columns: ["switch"])'
    )
    assert {int(r["switch"]) for r in links} == set(range(1, SWITCHES + 1))


def test_a_killed_worker_is_restarted_and_counted(serves: list[Serve]) -> None:
    svc = Serve(2, None)
    serves.append(svc)
    send_from_switches(svc.port)
    total = SWITCHES * PER_SWITCH
    wait_for(lambda: svc.metric("int_collector_reports_decoded_total") == total, 20, "counted")
    victim = svc.health()[1]["workers"][0]["pid"]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: svc.metric("int_collector_worker_restarts_total") == 1, 20, "restart")
    wait_for(lambda: svc.health()[1]["receiving"], 30, "restarted worker receiving")
    pids = [w["pid"] for w in svc.health()[1]["workers"]]
    assert victim not in pids and svc.metric("int_collector_workers") == 2
    # The dead worker's counts stay in the totals; new reports are counted on top.
    assert svc.metric("int_collector_reports_decoded_total") == total
    send_from_switches(svc.port, start_seq=PER_SWITCH)
    wait_for(
        lambda: svc.metric("int_collector_reports_decoded_total") == 2 * total, 20, "counted again"
    )


def test_too_many_restarts_stop_the_service(serves: list[Serve]) -> None:
    svc = Serve(1, None, INT_COLLECTOR_WORKER_RESTART_LIMIT="0")
    serves.append(svc)
    os.kill(svc.health()[1]["workers"][0]["pid"], signal.SIGKILL)
    assert svc.proc.wait(30) == 1
    assert "more than 0 restarts" in (svc.proc.stderr.read() if svc.proc.stderr else "")


def test_a_hung_worker_makes_health_degraded(serves: list[Serve]) -> None:
    svc = Serve(1, None)
    serves.append(svc)
    wait_for(lambda: svc.health()[1]["receiving"], 20, "receiving")
    pid = svc.health()[1]["workers"][0]["pid"]
    os.kill(pid, signal.SIGSTOP)  # alive, but neither receiving nor reporting
    try:
        wait_for(lambda: svc.health()[0] == 503, 10, "degraded")
        assert svc.health()[1]["workers"][0]["receiving"] is False
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: svc.health()[1]["receiving"], 10, "receiving again")
