"""Latency of the optimizer service under concurrent clients, end to end over real HTTP.

`agg-optimizer serve` (its own process, uvicorn, control loop off) against a real InfluxDB
1.8.10 holding INT link state and the ONOS REST API served by `demo.onos_rest.OnosRest` for a
k=4 fat-tree (20 switches, 16 hosts) with 6 jobs placed. Each of N clients sends dry-run
placements of every job (`POST /api/v1/placements {"dry_run": true}`) back to back for
`--seconds`; printed per N: requests/s, p50/p95/p99 latency and errors, as the table of
`docs/benchmarks/service-load.md`.

`--path per-job`: the N clients spread over the jobs' own dry runs
(`POST /api/v1/jobs/{id}/placement?dry_run=true`, one URL per job, each answer computed
for its job alone); beside them, in the same run, 2 clients on `/healthz`, whose latency
is printed in the same row. `--no-cache` computes every dry run (`DRY_RUN_CACHE=false`:
no answer reused, only concurrent identical requests share a solve): the uncached path.

    make bench-service      # installs hey 0.1.4 from the Go module proxy once, then:
    uv run python optimizer-service/benchmarks/service_load.py [--path per-job]
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from agg_optimizer.demo.live import host_ips, onos_json
from agg_optimizer.demo.onos_rest import OnosRest
from agg_optimizer.model.examples import random_jobs
from agg_optimizer.model.topology import fat_tree
from int_collector.influxd import InfluxServer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


HEY = Path(
    os.environ.get("INNET_AGG_HEY")
    or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "innet-agg/hey-0.1.4/hey"
)


def hey(
    url: str, clients: int, seconds: float, body: str | None, qps: float = 0, timeout: int = 20
) -> subprocess.Popen:
    """`hey` (Go; `make bench-service` installs it) as the load generator: a Python client
    spent more CPU than the service at 50 clients and became what was measured. A request
    unanswered after `timeout` seconds counts as an error (hey's own default, 20 s)."""
    how = ["-m", "GET"] if body is None else ["-m", "POST", "-T", "application/json", "-d", body]
    return subprocess.Popen(
        [str(HEY), "-z", f"{seconds}s", "-c", str(clients), "-q", str(qps), "-t", str(timeout),
         *how, "-o", "csv", url],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip


def results(p: subprocess.Popen) -> tuple[list[float], int]:
    out, _ = p.communicate()
    if p.returncode:
        raise RuntimeError(f"hey exited with {p.returncode}")
    lat, errors = [], 0
    for line in out.splitlines()[1:]:
        cols = line.split(",")
        if len(cols) < 7:
            continue
        lat.append(float(cols[0]))
        errors += cols[6] != "200"
    return lat, errors


def load(
    urls: list[str], clients: int, seconds: float, body: str, health: str | None = None
) -> tuple[list[float], int, float, float, list[float]]:
    """`clients` spread over `urls` (and 2 more on `health` if given), all at once.
    Returns latencies (s), errors, wall time, the generators' CPU seconds and the health
    check's latencies."""
    t0 = time.perf_counter()
    share = [clients // len(urls) + (i < clients % len(urls)) for i in range(len(urls))]
    procs = [hey(u, c, seconds, body) for u, c in zip(urls, share, strict=True) if c]
    # The health checks probe as a monitor would (2 x 10 per second), not back to back: a
    # flood of them was itself a load that took the service's one interpreter from the
    # dry runs (a lone client's uncached dry run measured 104 ms beside it, 9 ms alone).
    side = hey(health, 2, seconds, None, qps=10) if health else None
    lat, errors = [], 0
    for p in procs:
        a, e = results(p)
        lat += a
        errors += e
    side_lat = results(side)[0] if side else []
    span = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return lat, errors, span, usage.ru_utime + usage.ru_stime, side_lat


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", default="1,10,50")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--jobs", type=int, default=6)
    ap.add_argument("--path", choices=("all", "per-job"), default="all")
    ap.add_argument("--no-cache", action="store_true", help="AGG_OPTIMIZER_DRY_RUN_CACHE=false")
    ap.add_argument("--view-max-age", type=float, default=1.0, help="AGG_OPTIMIZER_VIEW_MAX_AGE_S")
    args = ap.parse_args()

    topo = fat_tree(4)
    devices, links, hosts = onos_json(topo)
    onos = OnosRest(devices, links, hosts, aggregation=True)
    onos.start()
    influx = InfluxServer()
    influx.start()
    work = Path(tempfile.mkdtemp(prefix="svc-load-"))
    port = free_port()
    env = {
        **os.environ,
        "AGG_OPTIMIZER_ONOS_URL": onos.url,
        "AGG_OPTIMIZER_INFLUX_URL": influx.url,
        "AGG_OPTIMIZER_INFLUX_BUCKET": influx.bucket,
        "AGG_OPTIMIZER_DB_PATH": str(work / "db.sqlite"),
        "AGG_OPTIMIZER_REOPTIMIZE_PERIOD_S": "0",
        "AGG_OPTIMIZER_VIEW_MAX_AGE_S": str(args.view_max_age),
        "AGG_OPTIMIZER_DRY_RUN_CACHE": "false" if args.no_cache else "true",
    }
    exe = str(Path(sys.executable).parent / "agg-optimizer")
    log = open(work / "service.log", "wb")  # noqa: SIM115 - owned by the process
    proc = subprocess.Popen([exe, "serve", "--port", str(port)], env=env, stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        # INT state for every switch port (the service's Flux query has rows to map).
        lines = []
        for d in devices["devices"]:
            sid = d["annotations"]["intSwitchId"]
            for p in range(1, 5):
                lines.append(f"int_link,switch={sid},port={p} utilization={0.1 * (p % 4)}")
        httpx.post(
            f"{influx.url}/write", params={"db": "telemetry"}, content="\n".join(lines)
        ).raise_for_status()
        ips = host_ips(topo)
        rng = np.random.default_rng(1)
        for i, j in enumerate(random_jobs(topo, args.jobs, rng, workers=(3, 8))):
            body = {
                "id": f"j{i}",
                "workers": [ips[w] for w in j.workers],
                "ps": ips[j.ps],
                "update_bytes": j.update_bytes,
            }
            r = httpx.post(f"{base}/api/v1/jobs", json=body, timeout=30)
            r.raise_for_status()
        httpx.post(f"{base}/api/v1/placements", json={}, timeout=60).raise_for_status()

        rows = []
        if args.path == "all":
            urls, body, health = [f"{base}/api/v1/placements"], '{"dry_run": true}', None
        else:
            urls = [f"{base}/api/v1/jobs/j{i}/placement?dry_run=true" for i in range(args.jobs)]
            body, health = "", f"{base}/healthz"
        for n in [int(x) for x in args.clients.split(",")]:
            c0, s0 = resource.getrusage(resource.RUSAGE_CHILDREN), cpu_s(proc.pid)
            lat, errors, span, c1, side = load(urls, n, args.seconds, body, health)
            client_cpu = (c1 - c0.ru_utime - c0.ru_stime) / span
            server_cpu = (cpu_s(proc.pid) - s0) / span
            ms = np.array(lat) * 1e3
            hp99 = float(np.percentile(np.array(side) * 1e3, 99)) if side else None
            rows.append(
                (n, len(lat), len(lat) / span, *np.percentile(ms, [50, 95, 99]), errors,
                 server_cpu, client_cpu, hp99)
            )  # fmt: skip
            print(f"{n} clients done", file=sys.stderr)
    finally:
        proc.terminate()
        proc.wait(10)
        influx.stop(remove=True)
        onos.stop()
    head = [
        "| path | cache | clients | requests | req/s | p50 ms | p95 ms | p99 ms | errors | "
        "/healthz p99 ms (2 clients beside) | service CPU | load generator CPU |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    cache = "off" if args.no_cache else "on"
    lines = [
        f"| {args.path} | {cache} | {n} | {k} | {r:.0f} | {a:.1f} | {b:.1f} | {c:.1f} | {e} | "
        f"{'-' if h is None else f'{h:.1f}'} | {sc:.0%} | {cc:.0%} |"
        for n, k, r, a, b, c, e, sc, cc, h in rows
    ]
    table = "\n".join(head + lines)
    print(table)
    load_avg = os.getloadavg()[0]
    print(
        f"{args.jobs} jobs on a k=4 fat-tree, {args.seconds:.0f} s per row, view max age "
        f"{args.view_max_age:g} s, 1-min load average at the end {load_avg:.2f} on "
        f"{os.cpu_count()} cores"
    )


if __name__ == "__main__":
    main()
