"""How long `int-collector serve` takes to be ready (`/readyz` 200: every worker reads its
socket), and the CPU its process tree spent until then, side by side with an older
checkout's collector.

    uv run python int-collector/benchmarks/startup_bench.py [--runs 5] [--workers 1 2] \
        [--busy 2] [--baseline OLD/int-collector/src]

Each run starts `serve` as its own process group (supervisor, fork server or spawned
workers) and polls `/readyz` every 20 ms; the CPU is user + system time of every process of
the group at that moment (from /proc). No InfluxDB is needed to be ready. `--busy N` runs N
busy loops beside it (the 2-core machine under other builds). `--baseline` runs the
`int_collector` package in that directory (e.g. `git worktree add /tmp/old <commit>`) with
this interpreter, with the same settings. Both use the numba cache beside their sources,
filled first by one untimed start, as `make sync` leaves it (`--cold` empties a private
cache before every run instead). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from int_collector import children
from int_collector.influxd import free_port

TICKS = os.sysconf("SC_CLK_TCK")


def _spin() -> None:
    while True:
        pass


def _cpu(pgid: int) -> float:
    total = 0
    for pid in children.group_members(pgid):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        f = stat[stat.rindex(")") + 2 :].split()
        total += int(f[11]) + int(f[12])  # utime, stime
    return total / TICKS


def one(src: str | None, workers: int, cache: str | None) -> tuple[float, float]:
    port, http = free_port(), free_port()
    env = {**os.environ, "INT_COLLECTOR_WORKERS": str(workers),
           "INT_COLLECTOR_HTTP_PORT": str(http),
           "INT_COLLECTOR_INFLUX_URL": "http://127.0.0.1:9"}  # fmt: skip
    if src:
        env["PYTHONPATH"] = src
    if cache:
        env["NUMBA_CACHE_DIR"] = cache
    t0 = time.monotonic()
    proc = children.spawn(
        [sys.executable, "-m", "int_collector", "serve", "--listen", f"127.0.0.1:{port}"],
        env=env, stdout=open(os.devnull, "w"), stderr=open(os.devnull, "w"),  # noqa: SIM115
    )  # fmt: skip

    def ready() -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/readyz", timeout=2) as r:
            return r.status == 200

    try:
        children.wait_ready(ready, "int-collector serve", timeout_s=900, proc=proc, poll_s=0.02)
        took = time.monotonic() - t0
        return took, _cpu(proc.pid)
    finally:
        children.stop(proc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--busy", type=int, default=0)
    ap.add_argument("--baseline", type=Path)
    ap.add_argument("--cold", action="store_true")
    a = ap.parse_args()
    engines: list[tuple[str, str | None]] = [("this tree", None)]
    if a.baseline:
        engines.append(("baseline", str(a.baseline.resolve())))
    spinners = [mp.Process(target=_spin, daemon=True) for _ in range(a.busy)]
    for s in spinners:
        s.start()
    rows = []
    try:
        for name, src in engines:
            if not a.cold:
                one(src, 1, None)  # fill the cache, untimed
            for w in a.workers:
                times, cpus = [], []
                for _ in range(a.runs):
                    with tempfile.TemporaryDirectory() as cache:
                        t, c = one(src, w, cache if a.cold else None)
                    times.append(t)
                    cpus.append(c)
                    print(f"{name}, {w} worker(s): ready after {t:.2f} s, {c:.1f} CPU-s",
                          file=sys.stderr, flush=True)  # fmt: skip
                rows.append((name, w, statistics.median(times), max(times),
                             statistics.median(cpus)))  # fmt: skip
    finally:
        for s in spinners:
            s.kill()
    load = os.getloadavg()[0]
    print(f"\n{a.runs} runs each, {a.busy} busy loop(s) beside, "
          f"{'cold' if a.cold else 'warm'} numba cache, load average {load:.1f}\n")  # fmt: skip
    print("| collector | workers | ready, median (s) | ready, max (s) | CPU until ready (s) |")
    print("|---|---|---|---|---|")
    for name, w, med, mx, cpu in rows:
        print(f"| {name} | {w} | {med:.2f} | {mx:.2f} | {cpu:.1f} |")
    if a.baseline:
        base = {w: (m, c) for n, w, m, _x, c in rows if n == "baseline"}
        for name, w, med, _mx, cpu in rows:
            if name != "baseline" and w in base:
                print(f"\n{w} worker(s): this tree / baseline = {med / base[w][0]:.2f} (time), "
                      f"{cpu / base[w][1]:.2f} (CPU)")  # fmt: skip


if __name__ == "__main__":
    main()
