"""What one InfluxDB 1.8.10 node took here from several collectors, and its write ceiling
(issue 33; docs/collector.md, "Several collectors").

    uv run python int-collector/benchmarks/influx_write_bench.py [--collectors 3] \
        [--switches 64] [--rate 20000] [--seconds 15] [--ceiling-seconds 10] [--threads 2]

- *collectors*: `--collectors` `int-collector serve` processes (collector ids c0, c1, ...),
  each fed by its own `int-collector generate --fast` (a synthetic leaf-spine of
  `--switches`, its own seed) at `--rate` reports/s, all writing one database. InfluxDB's
  own counters (`SHOW STATS FOR 'httpd'`: pointsWrittenOK, writeReq) from the senders'
  start to their end give the points per second the node took; the collectors' /metrics
  say what they wrote, dropped and still held.
- *ceiling*: `--threads` writers post batches of 5,000 `int_link` points in the collector's
  line protocol (`storage.line`, one series per switch, port and collector as a large
  fabric has) as fast as the node answers, for `--ceiling-seconds`.

Prints Markdown; the numbers in docs/collector.md come from here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from decode_bench import machine_busy_s, metrics, tree_cpu_s

from int_collector.influxd import InfluxServer, free_port
from int_collector.state import Point
from int_collector.storage import line


def httpd_stats(srv: InfluxServer) -> dict[str, int]:
    doc = json.loads(srv.query_v1("SHOW STATS FOR 'httpd'"))
    s = doc["results"][0]["series"][0]
    return dict(zip(s["columns"], s["values"][0], strict=True))


class Collector:
    def __init__(self, cid: str, srv: InfluxServer, db: str) -> None:
        self.port, self.http = free_port(), free_port()
        env = {
            **os.environ,
            "INT_COLLECTOR_COLLECTOR_ID": cid,
            "INT_COLLECTOR_HTTP_PORT": str(self.http),
            "INT_COLLECTOR_INFLUX_URL": srv.url,
            "INT_COLLECTOR_INFLUX_BUCKET": f"{db}/autogen",
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "int_collector", "serve", "--listen", f"127.0.0.1:{self.port}"],
            env=env, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 300
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/readyz", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"collector {cid} not ready") from None
                time.sleep(0.2)

    def stop(self) -> None:
        os.killpg(self.proc.pid, 15)
        self.proc.wait(30)


def collectors_run(srv: InfluxServer, n: int, switches: int, rate: float, seconds: float) -> str:
    db = f"bench{n}"
    srv.query_v1(f'CREATE DATABASE "{db}"')
    cs = [Collector(f"c{k}", srv, db) for k in range(n)]
    try:
        senders = []
        for k, c in enumerate(cs):
            argv = [
                sys.executable, "-W", "ignore", "-m", "int_collector", "generate", "--fast",
                "--target", f"127.0.0.1:{c.port}", "--rate", str(rate), "--duration",
                str(seconds), "--switches", str(switches), "--seed", str(k + 1),
            ]  # fmt: skip
            senders.append(subprocess.Popen(argv, stderr=subprocess.DEVNULL))

        # From the first report received (the senders' start-up, numba included, is not
        # sending) to half a second after the last sender ended (the collectors' last tick).
        def received() -> float:
            return sum(metrics(c.http).get("int_collector_datagrams_received_total", 0) for c in cs)

        while received() == 0:
            time.sleep(0.05)
        before = httpd_stats(srv)
        cpu0, busy0, t0 = tree_cpu_s(srv.proc.pid), machine_busy_s(), time.monotonic()
        for p in senders:
            p.wait()
        time.sleep(0.5)
        took = time.monotonic() - t0
        after = httpd_stats(srv)
        cpu = tree_cpu_s(srv.proc.pid) - cpu0
        busy = machine_busy_s() - busy0
        m = [metrics(c.http) for c in cs]
    finally:
        for c in cs:
            c.stop()
    points = after["pointsWrittenOK"] - before["pointsWrittenOK"]
    reqs = after["writeReq"] - before["writeReq"]

    def total(name: str) -> int:
        return int(sum(x.get(name, 0) for x in m))

    return (
        f"| {n} | {switches} | {rate * n:,.0f} | {took:.1f} | {points:,} | {points / took:,.0f} "
        f"| {reqs / took:.1f} | {total('int_collector_reports_decoded_total'):,} "
        f"| {total('int_collector_points_written_total'):,} "
        f"| {total('int_collector_points_dropped_total'):,} "
        f"| {total('int_collector_points_buffered'):,} | {cpu / took:.0%} | {busy / took:.0%} |"
    )


def ceiling_run(srv: InfluxServer, seconds: float, threads: int) -> str:
    db = "ceiling"
    srv.query_v1(f'CREATE DATABASE "{db}"')
    url = f"{srv.url}/write?" + urllib.parse.urlencode({"db": db, "precision": "ns"})
    stop = time.monotonic() + seconds
    counts = [0] * threads

    def writer(k: int) -> None:
        t = time.time_ns() + k
        # The collector's line protocol; each batch only gets new timestamps (building
        # every line anew held two Python writers to the client's speed, not the node's).
        prefix = []
        for i in range(5000):
            tags = {"switch": str(i % 1000), "port": str(i // 1000), "collector": f"c{k}"}
            fields: dict[str, float | int | str] = {
                "latency_ns": 1000.0 + i, "queue_occupancy": float(i % 50),
                "utilization": (i % 100) / 100, "samples": 10,
            }  # fmt: skip
            prefix.append(line(Point("int_link", tags, fields, 0)).rsplit(" ", 1)[0])
        while time.monotonic() < stop:
            body = "\n".join(f"{p} {t + i * threads}" for i, p in enumerate(prefix)).encode()
            t += 5000 * threads
            req = urllib.request.Request(url, data=body, method="POST")
            with urllib.request.urlopen(req, timeout=30) as r:
                assert r.status == 204
            counts[k] += 5000

    before = httpd_stats(srv)
    cpu0, busy0, t0 = tree_cpu_s(srv.proc.pid), machine_busy_s(), time.monotonic()
    ts = [threading.Thread(target=writer, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    took = time.monotonic() - t0
    points = httpd_stats(srv)["pointsWrittenOK"] - before["pointsWrittenOK"]
    cpu = tree_cpu_s(srv.proc.pid) - cpu0
    busy = machine_busy_s() - busy0
    return (
        f"| {threads} | {took:.1f} | {points:,} | {points / took:,.0f} | {cpu / took:.0%} "
        f"| {busy / took:.0%} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--collectors", type=int, default=3)
    ap.add_argument("--switches", type=int, default=64)
    ap.add_argument("--rate", type=float, default=20_000, help="reports/s per collector")
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--ceiling-seconds", type=float, default=10)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(f"CPU cores: {os.cpu_count()}, load average at start: {load}, "
          f"{time.strftime('%H:%M UTC', time.gmtime())}\n")  # fmt: skip
    srv = InfluxServer()
    srv.start()
    try:
        print(
            "| collectors | switches each | offered (reports/s) | s | points InfluxDB took "
            "| points/s | write requests/s | reports decoded | points written (collectors) "
            "| points dropped | points still held | influxd CPU | machine busy (of 200%) |"
        )
        print("|" + "---|" * 13)
        print(collectors_run(srv, a.collectors, a.switches, a.rate, a.seconds))
        if a.ceiling_seconds > 0:
            print("\n| writers | s | points | points/s | influxd CPU | machine busy (of 200%) |")
            print("|" + "---|" * 6)
            print(ceiling_run(srv, a.ceiling_seconds, a.threads))
    finally:
        srv.stop(remove=True)


if __name__ == "__main__":
    main()
