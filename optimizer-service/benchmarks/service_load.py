"""Latency of the optimizer service under concurrent clients, end to end over real HTTP.

`agg-optimizer serve` (its own process, uvicorn, control loop off) against a real InfluxDB
1.8.10 holding INT link state and the ONOS REST API served by `sim.onos_rest.OnosRest` for a
k=4 fat-tree (20 switches, 16 hosts) with 6 jobs placed. Each of N clients sends dry-run
placements of every job (`POST /api/v1/placements {"dry_run": true}`) back to back for
`--seconds`; printed per N: requests/s, p50/p95/p99 latency and errors, and written to
`--out`/service.md.

    make bench-service      # installs hey 0.1.4 from the Go module proxy once, then:
    uv run python optimizer-service/benchmarks/service_load.py --out docs/benchmarks
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

from agg_optimizer.examples import random_jobs
from agg_optimizer.sim.live import host_ips, onos_json
from agg_optimizer.sim.onos_rest import OnosRest
from agg_optimizer.topology import fat_tree
from int_collector.influxd import InfluxServer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


HEY = Path(
    os.environ.get("INNET_AGG_HEY")
    or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "innet-agg/hey-0.1.4/hey"
)


def load(url: str, clients: int, seconds: float) -> tuple[list[float], int, float, float]:
    """`hey` (Go; `make bench-service` installs it) as the load generator: a Python client
    spent more CPU than the service at 50 clients and became what was measured. Returns
    latencies (s), errors, wall time and the generator's CPU seconds."""
    t0 = time.perf_counter()
    r = subprocess.run(
        [str(HEY), "-z", f"{seconds}s", "-c", str(clients), "-m", "POST",
         "-T", "application/json", "-d", '{"dry_run": true}', "-o", "csv", url],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    span = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    lat, errors = [], 0
    for line in r.stdout.splitlines()[1:]:
        cols = line.split(",")
        if len(cols) < 7:
            continue
        lat.append(float(cols[0]))
        errors += cols[6] != "200"
    return lat, errors, span, usage.ru_utime + usage.ru_stime


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", default="1,10,50")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--jobs", type=int, default=6)
    ap.add_argument("--out", type=Path, default=None)
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
        for n in [int(x) for x in args.clients.split(",")]:
            c0, s0 = resource.getrusage(resource.RUSAGE_CHILDREN), cpu_s(proc.pid)
            lat, errors, span, c1 = load(f"{base}/api/v1/placements", n, args.seconds)
            client_cpu = (c1 - c0.ru_utime - c0.ru_stime) / span
            server_cpu = (cpu_s(proc.pid) - s0) / span
            ms = np.array(lat) * 1e3
            rows.append(
                (n, len(lat), len(lat) / span, *np.percentile(ms, [50, 95, 99]), errors,
                 server_cpu, client_cpu)
            )  # fmt: skip
            print(f"{n} clients done", file=sys.stderr)
    finally:
        proc.terminate()
        proc.wait(10)
        influx.stop(remove=True)
        onos.stop()
    head = [
        "| clients | requests | req/s | p50 ms | p95 ms | p99 ms | errors | service CPU | "
        "load generator CPU |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    body = [
        f"| {n} | {k} | {r:.0f} | {a:.1f} | {b:.1f} | {c:.1f} | {e} | {sc:.0%} | {cc:.0%} |"
        for n, k, r, a, b, c, e, sc, cc in rows
    ]
    table = "\n".join(head + body)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        load_avg = os.getloadavg()[0]
        (args.out / "service-load.md").write_text(
            f"{table}\n\n{args.jobs} jobs on a k=4 fat-tree, {args.seconds:.0f} s per row, "
            f"1-min load average at the end {load_avg:.2f} on {os.cpu_count()} cores.\n"
        )


if __name__ == "__main__":
    main()
