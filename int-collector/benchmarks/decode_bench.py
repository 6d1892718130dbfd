"""Collector throughput: the Python reference path against the compiled path (fast.py),
decode + fold in one process, then end to end over UDP loopback.

    uv run python int-collector/benchmarks/decode_bench.py [--seconds 5] \
        [--rates 100000 200000 300000 400000] [--workers 1 2] [--engines python compiled] \
        [--baseline OLD/int-collector/src]

Decode + fold rows run in this process on a pool of generator datagrams: the Python path
is `Decoder.decode` + `Fabric.observe_datagram` per datagram, the compiled one
`FastFabric.ingest` on batches of 256 (no system calls in either).

End to end: `int-collector serve` runs as its own process tree (supervisor and `workers`
receiving processes, SO_REUSEPORT) with `INT_COLLECTOR_FAST_PATH` false or true, writing
to a real InfluxDB 1.8.10 started here. The sender is another process, `int-collector
generate --fast` (sendmmsg, one socket per switch, 48 reporting switches, one report per
datagram), at each offered rate for `--seconds`; the same sender for both engines.
`--baseline` adds the engine "baseline": the `int_collector` package found in that
directory (an older checkout, e.g. `git worktree add /tmp/old <commit>`), run by this
interpreter with the same settings and sender. Counts come from the collector's /metrics
once its counters stop moving: received = datagrams read, decoded = reports decoded,
written = points written to InfluxDB, lost = sent - decoded. Kernel drops are the growth
of `Udp: RcvbufErrors` in /proc/net/snmp (datagrams, whole machine). CPU is user + system
time in % of one core over the sending window plus the drain: the collector's process
tree, the sender, and the rest of the machine's busy time meanwhile ("everything else":
other jobs, InfluxDB, kernel work charged to no process). Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

from int_collector import fast
from int_collector.generator import SyntheticFabric, _ring
from int_collector.influxd import InfluxServer, default_binary, free_port
from int_collector.settings import load_settings
from int_collector.state import Fabric
from int_collector.wire import Decoder

SWITCHES = 64  # 16 spines, 48 leaves: 48 reporting switches, 48 source ports
TICKS = os.sysconf("SC_CLK_TCK")


def pool(family: str, per_datagram: int, switches: int = 64, n: int = 4096) -> list[bytes]:
    f = SyntheticFabric(switches, seed=1, family=family)
    return [bytes(d) for _s, d in _ring(f, n, per_datagram, f.leaves)]


def python_rate(data: list[bytes], seconds: float) -> float:
    """Reports per second through Decoder + Fabric."""
    dec = Decoder()
    fab = Fabric(load_settings(None))
    decode, observe = dec.decode, fab.observe_datagram
    n = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for d in data:
            reports = decode(d)
            observe(reports, 1)
            n += len(reports)
    return n / (time.perf_counter() - start)


def compiled_rate(data: list[bytes], seconds: float) -> tuple[float, float]:
    """Reports per second through FastFabric.ingest, and the share of datagrams it left
    to the Python decoder."""
    fast.warm()
    ff = fast.FastFabric(load_settings(None))
    dec = Decoder()
    batches = []
    for i in range(0, len(data), 256):
        chunk = data[i : i + 256]
        bufs = np.zeros((len(chunk), 2048), np.uint8)
        lens = np.zeros(len(chunk), np.int64)
        for k, d in enumerate(chunk):
            bufs[k, : len(d)] = np.frombuffer(d, np.uint8)
            lens[k] = len(d)
        batches.append((bufs, lens))
    counted = {"reports": 0, "slow": 0}

    def slow(d: bytes, now: int) -> None:
        reports = dec.decode(d)
        ff.observe_datagram(reports, now)
        counted["reports"] += len(reports)
        counted["slow"] += 1

    n = datagrams = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for bufs, lens in batches:
            _done, decoded, _rej = ff.ingest(bufs, lens, len(lens), 1, slow)
            n += decoded
            datagrams += len(lens)
    n += counted["reports"]
    return n / (time.perf_counter() - start), counted["slow"] / max(1, datagrams)


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


def metrics(http: int) -> dict[str, float]:
    out = {}
    with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=5) as r:
        for ln in r.read().decode().splitlines():
            if ln and not ln.startswith("#") and "{" not in ln:
                name, value = ln.split()[:2]
                out[name] = float(value)
    return out


class Service:
    """`int-collector serve` as a subprocess: engine "python", "compiled", or "baseline"
    (the package in `baseline`, an older checkout's src directory)."""

    def __init__(
        self, workers: int, server: InfluxServer | None, engine: str, baseline: str = ""
    ) -> None:
        self.port, self.http = free_port(), free_port()
        env = {
            **os.environ,
            "INT_COLLECTOR_WORKERS": str(workers),
            "INT_COLLECTOR_HTTP_PORT": str(self.http),
            "INT_COLLECTOR_INFLUX_URL": server.url if server else "http://127.0.0.1:9",
            "INT_COLLECTOR_INFLUX_BUCKET": server.bucket if server else "x/autogen",
        }
        if engine == "baseline":
            env["PYTHONPATH"] = baseline
        else:
            env["INT_COLLECTOR_FAST_PATH"] = "true" if engine == "compiled" else "false"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "int_collector", "serve", "--listen", f"127.0.0.1:{self.port}"],
            env=env, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while True:  # every worker up (/readyz, where the collector has it)
            try:
                if metrics(self.http).get("int_collector_workers") == workers:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("collector did not start")
            time.sleep(0.2)
        if engine != "baseline":
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/readyz", timeout=2):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError("collector not ready") from None
                    time.sleep(0.2)

    def settle(self) -> dict[str, float]:
        """Wait until the counters stop moving (socket queues drained, points written)."""
        last: dict[str, float] = {}
        while True:
            time.sleep(0.7)  # > the workers' 0.25 s snapshot period
            now = metrics(self.http)
            keys = ("int_collector_reports_decoded_total", "int_collector_points_written_total")
            if last and all(now[k] == last[k] for k in keys):
                return now
            last = now

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def send(port: int, rate: float, seconds: float, *extra: str) -> tuple[int, float]:
    """The sender, another process: reports sent and its CPU seconds while sending (its
    start-up, interpreter and numba, not counted)."""
    p = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", "int_collector", "generate", "--fast",
         "--target", f"127.0.0.1:{port}", "--rate", str(rate), "--duration", str(seconds),
         "--switches", str(SWITCHES), "--seed", "2", *extra],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    # "sent N reports in T s (R/s), C s of CPU while sending"
    words = p.stderr.split("sent ")[1].split()
    return int(words[0]), float(p.stderr.split("), ")[1].split()[0])


def end_to_end(svc: Service, rate: float, seconds: float) -> dict:
    before = svc.settle()
    drops0 = udp_rcvbuf_errors()
    cpu0 = tree_cpu_s(svc.proc.pid)
    busy0 = machine_busy_s()
    t0 = time.monotonic()
    sent, gen_cpu = send(svc.port, rate, seconds)
    after = svc.settle()
    wall = time.monotonic() - t0
    cpu = tree_cpu_s(svc.proc.pid) - cpu0

    def d(name: str) -> int:
        return int(after[f"int_collector_{name}_total"] - before[f"int_collector_{name}_total"])

    decoded = d("reports_decoded")
    # The sender's start-up (interpreter, numba) falls in "everything else".
    other = machine_busy_s() - busy0 - cpu - gen_cpu
    return {
        "sent": sent,
        "received": d("datagrams_received"),
        "decoded": decoded,
        "written": d("points_written"),
        "lost": sent - decoded,
        "loss": 1 - decoded / sent if sent else 0.0,
        "kernel_drops": udp_rcvbuf_errors() - drops0,
        "cpu": cpu / wall,
        "gen_cpu": gen_cpu / seconds,
        "other": max(0.0, other) / wall,
        "delivered": decoded / seconds,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rates", type=float, nargs="*", default=[100e3, 200e3, 300e3, 400e3])
    ap.add_argument("--workers", type=int, nargs="*", default=[1, 2])
    ap.add_argument("--engines", nargs="*", default=["python", "compiled"])
    ap.add_argument("--parse-seconds", type=float, default=3.0)
    ap.add_argument("--baseline", default="", help="an older checkout's int-collector/src")
    args = ap.parse_args()
    if args.baseline:
        args.engines = ["baseline", *args.engines]
    rmem = Path("/proc/sys/net/core/rmem_max").read_text().strip()
    print(
        f"CPU cores: {os.cpu_count()}, load average at start: "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} (1, 5, 15 min), "
        f"net.core.rmem_max {rmem}, {time.strftime('%H:%M UTC', time.gmtime())}\n"
    )
    print("Decode + fold, one process, reports/s (64 switches, flows of 1 or 3 hops)\n")
    print(
        "| report | reports per datagram | Python (reference) | compiled | ratio | left to Python |"
    )
    print("|---|---|---|---|---|---|")
    for family, k, label in (
        ("v2", 1, "TR v2.0 + INT-MD v2.1, 7 fields"),
        ("v2", 8, "TR v2.0 + INT-MD v2.1, 7 fields"),
        ("v1", 1, "ONOS v1.0, 4 fields"),
    ):
        data = pool(family, k)
        py = python_rate(data, args.parse_seconds)
        co, left = compiled_rate(data, args.parse_seconds)
        print(f"| {label} | {k} | {py:,.0f} | {co:,.0f} | {co / py:.1f}x | {100 * left:.0f}% |",
              flush=True)  # fmt: skip
    server = None
    if default_binary().is_file():
        server = InfluxServer()
        server.start()
    where = "1.8.10 (local)" if server else "none (writes fail, backlog grows)"
    print(
        f"\nEnd to end over UDP loopback, {args.seconds:.0f} s per row, InfluxDB {where}, "
        f"{SWITCHES - SWITCHES // 4} reporting switches, 1 report per datagram, sender "
        "`int-collector generate --fast` in its own process\n"
    )
    print(
        "| engine | workers | offered (reports/s) | sent | received | decoded | written "
        "| lost | loss | kernel drops | collector CPU | sender CPU | everything else |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    delivered: dict[tuple[str, int, float], float] = {}
    try:
        for engine in args.engines:
            for workers in args.workers:
                svc = Service(workers, server, engine, args.baseline)
                try:
                    for rate in args.rates:
                        r = end_to_end(svc, rate, args.seconds)
                        delivered[(engine, workers, rate)] = r["delivered"]
                        print(
                            f"| {engine} | {workers} | {rate:,.0f} | {r['sent']:,} "
                            f"| {r['received']:,} | {r['decoded']:,} | {r['written']:,} "
                            f"| {r['lost']:,} | {100 * r['loss']:.3f}% | {r['kernel_drops']:,} "
                            f"| {100 * r['cpu']:.0f}% | {100 * r['gen_cpu']:.0f}% "
                            f"| {100 * r['other']:.0f}% |",
                            flush=True,
                        )
                finally:
                    svc.stop()
    finally:
        if server is not None:
            server.stop(remove=True)
    if "compiled" in args.engines and len(args.engines) > 1:
        others = [e for e in args.engines if e != "compiled"]
        print("\nSide by side: reports decoded per second of sending, and compiled / each\n")
        print(f"| workers | offered | {' | '.join(others)} | compiled | "
              + " | ".join(f"compiled / {e}" for e in others) + " |")  # fmt: skip
        print("|---" * (3 + 2 * len(others)) + "|")
        for workers in args.workers:
            for rate in args.rates:
                co = delivered[("compiled", workers, rate)]
                base = [delivered[(e, workers, rate)] for e in others]
                print(f"| {workers} | {rate:,.0f} | "
                      + " | ".join(f"{b:,.0f}" for b in base) + f" | {co:,.0f} | "
                      + " | ".join(f"{co / b:.2f}x" for b in base) + " |")  # fmt: skip
    print(f"\nload average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
