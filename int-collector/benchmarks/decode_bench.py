"""Collector throughput: parse only, parse + state, and end to end over UDP loopback.

    uv run python int-collector/benchmarks/decode_bench.py [--seconds 5] \
        [--rates 25000 50000 100000 150000] [--workers 1 2] [--per-datagram 1 8]

Parse rows run `Decoder.decode` (and `Fabric.observe_datagram`) in this process on a pool of
generator datagrams. End to end: `int-collector serve` runs as its own process tree (the
supervisor and `workers` receiving processes, SO_REUSEPORT) writing to a real InfluxDB
1.8.10 started here; this process sends with the generator (one socket per switch, 48
reporting switches) at each offered rate for `--seconds`. Everything counts individual
reports, not datagrams. Loss = 1 - decoded / sent, with decoded from the collector's
/metrics; kernel drops are the growth of `Udp: RcvbufErrors` in /proc/net/snmp (datagrams,
whole machine). CPU is the collector's process tree (user + system) and the generator,
in % of one core over the sending window plus the drain; "everything else" is the rest of
the machine's busy time meanwhile (other jobs, InfluxDB, uncharged kernel work): a row
with much of it was not measured on a quiet machine. Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from int_collector.generator import SyntheticFabric, _ring, generate
from int_collector.influxd import InfluxServer, default_binary, free_port
from int_collector.settings import load_settings
from int_collector.state import Fabric
from int_collector.wire import Decoder

SWITCHES = 64  # 16 spines, 48 leaves: 48 reporting switches, 48 source ports
TICKS = os.sysconf("SC_CLK_TCK")


def pool(family: str, per_datagram: int, switches: int = 16, n: int = 1000) -> list[bytes]:
    f = SyntheticFabric(switches, seed=1, family=family)
    return [bytes(d) for _s, d in _ring(f, n, per_datagram, f.leaves)]


def decode_rate(data: list[bytes], seconds: float, with_state: bool) -> float:
    """Reports per second (not datagrams)."""
    dec = Decoder()
    fab = Fabric(load_settings(None))
    decode, observe = dec.decode, fab.observe_datagram
    n = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for d in data:
            reports = decode(d)
            if with_state:
                observe(reports, 1)
            n += len(reports)
    return n / (time.perf_counter() - start)


def udp_rcvbuf_errors() -> int:
    lines = [x.split() for x in Path("/proc/net/snmp").read_text().splitlines() if x[:4] == "Udp:"]
    return int(lines[1][lines[0].index("RcvbufErrors")])


def machine_busy_s() -> float:
    """CPU seconds all cores spent busy (not idle or iowait), from /proc/stat."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(f) - f[3] - f[4]) / TICKS


def tree_cpu_s(pid: int) -> float:
    """User + system seconds of a process and its live descendants."""
    total = 0.0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / TICKS
            for task in Path(f"/proc/{p}/task").iterdir():
                kids = (task / "children").read_text().split()
                todo.extend(int(k) for k in kids)
        except (OSError, IndexError, ValueError):
            continue
    return total


def metric(http: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=5) as r:
        for ln in r.read().decode().splitlines():
            if ln.startswith(name + " "):
                return float(ln.split()[1])
    return 0.0


class Service:
    """`int-collector serve` as a subprocess."""

    def __init__(self, workers: int, server: InfluxServer | None) -> None:
        self.port, self.http = free_port(), free_port()
        env = {
            **os.environ,
            "INT_COLLECTOR_WORKERS": str(workers),
            "INT_COLLECTOR_HTTP_PORT": str(self.http),
            "INT_COLLECTOR_INFLUX_URL": server.url if server else "http://127.0.0.1:9",
            "INT_COLLECTOR_INFLUX_BUCKET": server.bucket if server else "x/autogen",
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "int_collector", "serve", "--listen", f"127.0.0.1:{self.port}"],
            env=env, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while metric_or_none(self.http, "int_collector_workers") != workers:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("collector did not start")
            time.sleep(0.2)

    def decoded(self) -> float:
        return metric(self.http, "int_collector_reports_decoded_total")

    def settle(self) -> float:
        """Wait until the decoded count stops moving (socket queues drained)."""
        last = -1.0
        while True:
            time.sleep(0.6)  # > the workers' 0.25 s snapshot period
            now = self.decoded()
            if now == last:
                return now
            last = now

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def metric_or_none(http: int, name: str) -> float | None:
    try:
        return metric(http, name)
    except OSError:
        return None


def end_to_end(svc: Service, rate: float, per_datagram: int, seconds: float) -> dict:
    before = svc.settle()
    drops0 = udp_rcvbuf_errors()
    cpu0 = tree_cpu_s(svc.proc.pid)
    busy0 = machine_busy_s()
    gen0 = time.process_time()
    t0 = time.monotonic()
    sent = generate(
        ("127.0.0.1", svc.port), rate, SWITCHES, duration_s=seconds, seed=2,
        per_datagram=per_datagram,
    )  # fmt: skip
    gen_cpu = time.process_time() - gen0
    after = svc.settle()
    wall = time.monotonic() - t0
    decoded = after - before
    cpu = tree_cpu_s(svc.proc.pid) - cpu0
    # Whatever else ran meanwhile (other jobs, InfluxDB, the kernel's softirq work not
    # charged to our processes): the honesty check of a row.
    other = machine_busy_s() - busy0 - cpu - gen_cpu
    return {
        "sent": sent,
        "send_rate": sent / seconds,
        "decoded": int(decoded),
        "loss": 1 - decoded / sent if sent else 0.0,
        "kernel_drops": udp_rcvbuf_errors() - drops0,
        "cpu": cpu / wall,
        "gen_cpu": gen_cpu / seconds,
        "other": max(0.0, other) / wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rates", type=float, nargs="*", default=[25e3, 50e3, 100e3, 150e3])
    ap.add_argument("--workers", type=int, nargs="*", default=[1, 2])
    ap.add_argument("--per-datagram", type=int, nargs="*", default=[1, 8])
    ap.add_argument("--parse-seconds", type=float, default=3.0)
    args = ap.parse_args()
    print(f"CPU cores: {os.cpu_count()}, load average at start: {os.getloadavg()[0]:.2f}\n")
    print("Parse (one process, reports/s; 16 switches, flows of 1 or 3 hops)\n")
    print("| report | reports per datagram | parse only | parse + state |")
    print("|---|---|---|---|")
    for family, k, label in (
        ("v2", 1, "TR v2.0 + INT-MD v2.1, 7 fields"),
        ("v2", 8, "TR v2.0 + INT-MD v2.1, 7 fields"),
        ("v1", 1, "ONOS v1.0, 4 fields"),
    ):
        data = pool(family, k)
        d = decode_rate(data, args.parse_seconds, False)
        s = decode_rate(data, args.parse_seconds, True)
        print(f"| {label} | {k} | {d:,.0f} | {s:,.0f} |")
    server = None
    if default_binary().is_file():
        server = InfluxServer()
        server.start()
    where = "1.8.10 (local)" if server else "none (writes fail, backlog grows)"
    print(
        f"\nEnd to end over UDP loopback, {args.seconds:.0f} s per row, InfluxDB {where}, "
        f"{SWITCHES - SWITCHES // 4} reporting switches\n"
    )
    print(
        "| workers | reports/datagram | offered (reports/s) | sent | decoded | loss "
        "| kernel drops (datagrams) | collector CPU | generator CPU | everything else |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    splits: list[str] = []
    try:
        for workers in args.workers:
            for k in args.per_datagram:
                svc = Service(workers, server)
                try:
                    for rate in args.rates:
                        r = end_to_end(svc, rate, k, args.seconds)
                        print(
                            f"| {workers} | {k} | {rate:,.0f} | {r['sent']:,} "
                            f"| {r['decoded']:,} | {100 * r['loss']:.3f}% "
                            f"| {r['kernel_drops']:,} | {100 * r['cpu']:.0f}% "
                            f"| {100 * r['gen_cpu']:.0f}% | {100 * r['other']:.0f}% |",
                            flush=True,
                        )
                    with urllib.request.urlopen(
                        f"http://127.0.0.1:{svc.http}/healthz", timeout=5
                    ) as resp:
                        split = [w["datagrams"] for w in json.load(resp)["workers"]]
                    splits.append(f"workers={workers}, {k}/datagram: {split}")
                finally:
                    svc.stop()
    finally:
        if server is not None:
            server.stop(remove=True)
    print("\nDatagrams per worker over all rows of a configuration: " + "; ".join(splits))
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
