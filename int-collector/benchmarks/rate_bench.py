"""The collector's rate beside a bare receiver, in one run: how much of what the kernel can
deliver here the collector takes.

    uv run python int-collector/benchmarks/rate_bench.py [--runs 10] [--rate 300000] \
        [--seconds 5] [--ramp 300000 350000 400000 450000] [--flows 100 100000] \
        [--per-datagram 65 200]

Both receivers read the same kind of sockets: `workers` (2) sockets of one SO_REUSEPORT
group with the collector's BPF balancer (`listen.bind_udp`), one process per socket. The
*bare* receiver's processes only call `recvmmsg` (256 datagrams per call, non-blocking,
`poll` when empty) and count; the *collector* is `int-collector serve` writing to a real
InfluxDB 1.8.10. The sender is `int-collector generate --fast` (sendmmsg, 48 reporting
switches, one report per datagram unless said), another process on the same two cores.

- *runs*: `--runs` rounds at `--rate`, each round the bare receiver then the collector;
  loss = 1 - counted / sent (bare: datagrams read; collector: reports decoded).
- *ramp*: each rate of `--ramp` once for each; the highest rate with under 0.1% loss is
  each one's loss-free rate, and their ratio is the collector's share of the kernel path.
- *flows*: the collector at `--flow-rate` with the datagrams carrying that many distinct
  flows (`generate --flows`): CPU per report of the collector's processes.
- *per datagram*: the collector at `--rate` reports/s packed that many to a datagram.
- *restart*: `--kills` times, SIGKILL of one worker until /healthz shows it replaced and
  every worker receiving.

Prints Markdown tables; the table in docs/benchmarks/collector.md comes from here.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import select
import signal
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from decode_bench import (
    Service,
    machine_busy_s,
    metrics,
    tree_cpu_s,
    udp_rcvbuf_errors,
)
from decode_bench import send as send_reports

from int_collector.influxd import InfluxServer, default_binary
from int_collector.listen import bind_udp
from int_collector.settings import load_settings

LOSS_FREE = 0.001


def _bare_reader(fd: int, counts: mp.Array, k: int) -> None:  # type: ignore[type-arg]
    """recvmmsg and count, nothing else (the kernel path's own cost)."""
    import ctypes

    from int_collector.fast import MSG_DONTWAIT, _Iovec, _Mmsghdr, _recvmmsg

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    batch, slot = 256, 2048
    buf = ctypes.create_string_buffer(batch * slot)
    iov = (_Iovec * batch)()
    msgs = (_Mmsghdr * batch)()
    base = ctypes.addressof(buf)
    for j in range(batch):
        iov[j].iov_base = base + j * slot
        iov[j].iov_len = slot
        msgs[j].msg_hdr.msg_iov = ctypes.pointer(iov[j])
        msgs[j].msg_hdr.msg_iovlen = 1
    ptr = ctypes.addressof(msgs)
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    n = 0
    while True:
        got = _recvmmsg(fd, ptr, batch, MSG_DONTWAIT, None)
        if got > 0:
            n += got
            counts[k] = n
        else:
            poller.poll(100)


class Bare:
    def __init__(self, workers: int) -> None:
        s = load_settings(None).model_copy(update={"listen_host": "127.0.0.1", "listen_port": 0})
        self.socks = bind_udp(s, workers)
        self.port = self.socks[0].getsockname()[1]
        ctx = mp.get_context("fork")
        self.counts = ctx.Array("q", workers, lock=False)
        self.procs = [
            ctx.Process(target=_bare_reader, args=(sk.fileno(), self.counts, k), daemon=True)
            for k, sk in enumerate(self.socks)
        ]
        for p in self.procs:
            p.start()

    def count(self) -> int:
        return sum(self.counts)

    def cpu_s(self) -> float:
        return sum(tree_cpu_s(p.pid) for p in self.procs)

    def settle(self) -> int:
        last = -1
        while True:
            time.sleep(0.5)
            now = self.count()
            if now == last:
                return now
            last = now

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
            p.join(5)
        for sk in self.socks:
            sk.close()


def send(port: int, rate: float, seconds: float, *extra: str) -> tuple[int, int, float]:
    """Reports and datagrams sent, and the sender's CPU seconds while sending."""
    per = int(extra[extra.index("--per-datagram") + 1]) if "--per-datagram" in extra else 1
    reports, cpu = send_reports(port, rate, seconds, *extra)
    return reports, reports // per, cpu


def bare_round(rate: float, seconds: float, workers: int) -> dict:
    b = Bare(workers)
    try:
        drops0, busy0 = udp_rcvbuf_errors(), machine_busy_s()
        t0 = time.monotonic()
        _sent, datagrams, gen_cpu = send(b.port, rate, seconds)
        got = b.settle()
        wall = time.monotonic() - t0
        cpu = b.cpu_s()
        return {
            "sent": datagrams, "counted": got, "loss": 1 - got / datagrams,
            "drops": udp_rcvbuf_errors() - drops0, "cpu": cpu / wall,
            "cpu_per_report_us": 1e6 * cpu / max(1, got), "gen_cpu": gen_cpu / seconds,
            "busy": (machine_busy_s() - busy0) / wall,
        }  # fmt: skip
    finally:
        b.stop()


def collector_round(svc: Service, rate: float, seconds: float, *extra: str) -> dict:
    before = svc.settle()
    drops0, busy0 = udp_rcvbuf_errors(), machine_busy_s()
    cpu0 = tree_cpu_s(svc.proc.pid)
    t0 = time.monotonic()
    sent, _datagrams, gen_cpu = send(svc.port, rate, seconds, *extra)
    after = svc.settle()
    wall = time.monotonic() - t0
    cpu = tree_cpu_s(svc.proc.pid) - cpu0

    def d(name: str) -> int:
        k = f"int_collector_{name}_total"
        return int(after.get(k, 0) - before.get(k, 0))  # absent from older collectors

    got = d("reports_decoded")
    return {
        "sent": sent, "counted": got, "loss": 1 - got / sent, "drops": udp_rcvbuf_errors() - drops0,
        "cpu": cpu / wall, "cpu_per_report_us": 1e6 * cpu / max(1, got),
        "gen_cpu": gen_cpu / seconds, "busy": (machine_busy_s() - busy0) / wall,
        "written": d("points_written"), "evicted": d("flows_evicted"),
    }  # fmt: skip


def restart_times(svc: Service, kills: int) -> list[float]:
    """SIGKILL one worker, then the time until /healthz shows every worker receiving
    again, the restart counted (reports flowing meanwhile from a slow sender)."""
    import json
    import threading
    import urllib.error
    import urllib.request

    def health() -> dict:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{svc.http}/healthz", timeout=5) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            return json.load(e)

    out = []
    for _ in range(kills):
        sender = threading.Thread(target=send, args=(svc.port, 2000, 8.0), daemon=True)
        sender.start()
        time.sleep(1)
        h = health()
        restarts = h["worker_restarts"]
        os.kill(h["workers"][0]["pid"], signal.SIGKILL)
        t0 = time.monotonic()
        while True:
            h = health()
            if h["worker_restarts"] == restarts + 1 and h["receiving"]:
                break
            time.sleep(0.01)
        out.append(time.monotonic() - t0)
        sender.join()
    return out


def row(name: str, rate: float, r: dict) -> str:
    return (
        f"| {name} | {rate:,.0f} | {r['sent']:,} | {r['counted']:,} | {100 * r['loss']:.3f}% "
        f"| {r['drops']:,} | {100 * r['cpu']:.0f}% | {r['cpu_per_report_us']:.2f} "
        f"| {100 * r['gen_cpu']:.0f}% | {100 * r['busy']:.0f}% |"
    )


HEAD = (
    "| receiver | offered (/s) | sent | counted | loss | kernel drops | receiver CPU "
    "| receiver CPU per report (µs) | sender CPU | machine busy (of 200%) |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--rate", type=float, default=300e3)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ramp", type=float, nargs="*", default=[300e3, 350e3, 400e3, 450e3])
    ap.add_argument("--flows", type=int, nargs="*", default=[100, 100_000])
    ap.add_argument("--flow-rate", type=float, default=200e3)
    ap.add_argument("--per-datagram", type=int, nargs="*", default=[64, 65, 200])
    ap.add_argument("--kills", type=int, default=5)
    args = ap.parse_args()
    print(
        f"CPU cores: {os.cpu_count()}, load average at start: "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {args.workers} receiving "
        f"processes, {args.seconds:.0f} s per row\n",
        flush=True,
    )
    server = InfluxServer() if default_binary().is_file() else None
    if server:
        server.start()
    svc = Service(args.workers, server, "compiled")
    results: dict[str, list[dict]] = {"bare": [], "collector": []}
    try:
        if args.runs:
            print(f"## {args.runs} rounds at {args.rate:,.0f} reports/s\n\n{HEAD}", flush=True)
        for _ in range(args.runs):
            r = bare_round(args.rate, args.seconds, args.workers)
            results["bare"].append(r)
            print(row("bare", args.rate, r), flush=True)
            r = collector_round(svc, args.rate, args.seconds)
            results["collector"].append(r)
            print(row("collector", args.rate, r), flush=True)
        if args.runs:
            ok = sum(r["loss"] < LOSS_FREE for r in results["collector"])
            okb = sum(r["loss"] < LOSS_FREE for r in results["bare"])
            cpu_ratio = sum(r["cpu_per_report_us"] for r in results["collector"]) / sum(
                r["cpu_per_report_us"] for r in results["bare"]
            )
            got = sum(r["counted"] for r in results["collector"]) / sum(
                r["counted"] for r in results["bare"]
            )
            print(
                f"\nunder 0.1% loss: collector {ok} of {args.runs}, bare {okb} of {args.runs}; "
                f"counted, collector / bare: {got:.3f}; CPU per report, collector / bare: "
                f"{cpu_ratio:.2f}\n",
                flush=True,
            )
        if args.ramp:
            print(f"## Ramp\n\n{HEAD}", flush=True)
            best = {"bare": 0.0, "collector": 0.0}
            for rate in args.ramp:
                rb = bare_round(rate, args.seconds, args.workers)
                print(row("bare", rate, rb), flush=True)
                rc = collector_round(svc, rate, args.seconds)
                print(row("collector", rate, rc), flush=True)
                for name, r in (("bare", rb), ("collector", rc)):
                    if r["loss"] < LOSS_FREE:
                        best[name] = max(best[name], rate)
            ratio = best["collector"] / best["bare"] if best["bare"] else float("nan")
            print(
                f"\nhighest rate under 0.1% loss: bare {best['bare']:,.0f}, collector "
                f"{best['collector']:,.0f}; collector / bare {ratio:.2f}\n",
                flush=True,
            )
        if args.flows:
            print(
                f"## Distinct flows at {args.flow_rate:,.0f} reports/s (max_flows 10,000)\n\n"
                f"{HEAD.splitlines()[0]} points written | flows evicted |\n"
                f"{HEAD.splitlines()[1]}---|---|",
                flush=True,
            )
            for n in args.flows:
                r = collector_round(svc, args.flow_rate, args.seconds, "--flows", str(n))
                print(row(f"collector, {n:,} flows", args.flow_rate, r)
                      + f" {r['written']:,} | {r['evicted']:,} |", flush=True)  # fmt: skip
        if args.per_datagram:
            print(f"\n## Reports per datagram at {args.rate:,.0f} reports/s\n\n{HEAD}", flush=True)
            for k in args.per_datagram:
                r = collector_round(svc, args.rate, args.seconds, "--per-datagram", str(k))
                print(row(f"collector, {k} a datagram", args.rate, r), flush=True)
        if args.kills:
            t = restart_times(svc, args.kills)
            print(
                f"\n## A killed worker replaced\n\nSIGKILL of one worker to /healthz showing "
                f"every worker receiving again, {args.kills} times: "
                + ", ".join(f"{x:.2f}" for x in t)
                + f" s (max {max(t):.2f} s)",
                flush=True,
            )
        m = metrics(svc.http)
        print(f"\nworker restarts: {m.get('int_collector_worker_restarts_total', 0):.0f}")
    finally:
        svc.stop()
        if server:
            server.stop(remove=True)
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    socket.setdefaulttimeout(30)
    main()
