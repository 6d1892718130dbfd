"""The optimizer service with 10,000 registered jobs (issue 33): dry-run latency at 50
clients and the time of one control-loop pass, on a fat-tree that holds the jobs on
distinct hosts.

As `service_load.py`: `agg-optimizer serve` in its own process (uvicorn, control loop off)
against a real InfluxDB 1.8.10 and the ONOS REST stand-in `demo.onos_rest.OnosRest` (in this
process) presenting a k-ary fat-tree (k=64: 5,120 switches, 65,536 hosts), INT link state
for every switch port in InfluxDB. Steps, each timed:

1. register --jobs jobs (a PS and 1-5 workers each, no host in two jobs: 10,000 jobs take
   about 40,000 of k=64's 65,536 hosts): the first --http-jobs over HTTP
   (`POST /api/v1/jobs`, one client, each timed), the rest written into the service's
   database as `Service.create_job` writes them (every registration fetches ONOS's whole
   topology and scans its hosts: 0.7 s each at k=32, so 10,000 over HTTP would take hours),
   the service stopped meanwhile and started again after (timed);
2. place --apply of them (`POST /api/v1/placements {"jobs": [...]}`: the joint solve of
   every registered job, then the asked jobs' intents and aggregation entries to the
   stand-in; the ONOS app numbers 256 jobs at most, `JobNumberRegistry`, the size of the
   pipeline's agg_job table, so no more than 256 jobs aggregate on a fabric at once);
3. `hey` with --clients clients for --seconds on the dry run of every job
   (`POST /api/v1/placements {"dry_run": true}`), then spread over --clients jobs' own dry
   runs (`POST /api/v1/jobs/{id}/placement?dry_run=true`);
4. --http-jobs more jobs registered over HTTP with every job in the database and the
   service's views warm (each timed: registration at scale);
5. the service stopped, the control loop's pass (`Service.step`: view, reconcile, the
   joint solve of every registered job for the applied ones, hysteresis, moves) run
   --passes times in this process on the same database and stand-in, then the hysteresis
   check (`worth_moving`) of --judge placed jobs on one view, as a pass in which that
   many jobs came out with a new placement runs it.

    uv run python optimizer-service/benchmarks/service_scale.py [--k 64 --jobs 10000]

`--src DIR` runs another copy of the package's src/ (the service and the loop passes):
the script starts again with DIR first on PYTHONPATH, so runs of two versions can be
interleaved on the shared machine (docs/benchmarks/scale.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from agg_optimizer.demo.live import host_ips, onos_json
from agg_optimizer.demo.onos_rest import OnosRest
from agg_optimizer.model.topology import fat_tree
from int_collector.influxd import InfluxServer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from service_load import HEY, free_port, hey, results


def rss_peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def jobs_on_distinct_hosts(topo, n_jobs: int, workers: tuple[int, int], seed: int) -> list[dict]:  # type: ignore[no-untyped-def]
    ips = host_ips(topo)
    hosts = list(ips)
    rng = np.random.default_rng(seed)
    rng.shuffle(hosts)
    sizes = rng.integers(workers[0], workers[1] + 1, n_jobs)
    if int(sizes.sum()) + n_jobs > len(hosts):
        raise SystemExit(f"{n_jobs} jobs need {int(sizes.sum()) + n_jobs} hosts: {len(hosts)}")
    out, at = [], 0
    for i, n in enumerate(sizes.tolist()):
        members = hosts[at : at + n + 1]
        at += n + 1
        out.append(
            {
                "id": f"j{i}",
                "workers": [ips[h] for h in members[1:]],
                "ps": ips[members[0]],
                "update_bytes": int(rng.choice([100_000_000, 530_000_000, 1_300_000_000])),
            }
        )
    return out


def more_jobs(topo, taken: list[dict], n_jobs: int) -> list[dict]:  # type: ignore[no-untyped-def]
    """`n_jobs` jobs of 3 workers on hosts no job in `taken` uses."""
    ips = host_ips(topo)
    used = {ip for sp in taken for ip in (*sp["workers"], sp["ps"])}
    free = [ip for ip in ips.values() if ip not in used]
    return [
        {"id": f"late{i}", "workers": free[4 * i : 4 * i + 3], "ps": free[4 * i + 3],
         "update_bytes": 100_000_000}
        for i in range(n_jobs)
    ]  # fmt: skip


def wait_healthy(base: str) -> None:
    for _ in range(6000):
        try:
            if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError("the service did not start")


def direct(env: dict[str, str], hosts: dict, specs: list[dict]) -> None:
    """Jobs into the service's database as `Service.create_job` writes them (host refs
    resolved to ONOS host ids, the request kept)."""
    from agg_optimizer.service.app import JobIn
    from agg_optimizer.service.settings import Settings
    from agg_optimizer.service.store import Store

    by_ip = {ip: h["id"] for h in hosts["hosts"] for ip in h["ipAddresses"]}
    for k, v in env.items():
        if k.startswith("AGG_OPTIMIZER_"):
            os.environ[k] = v
    store = Store(Settings().store_target())
    for body in specs:
        job = JobIn(**body)
        spec = job.model_dump(exclude={"strategy"})
        doc = {
            **spec,
            "workers": [by_ip[w] for w in spec["workers"]],
            "ps": by_ip[spec["ps"]],
            "requested": {"workers": spec["workers"], "ps": spec["ps"]},
        }
        store.add_job(spec["id"], doc, job.strategy)
    store.close()


def dry_run_load(urls: list[str], clients: int, seconds: float, body: str) -> dict:
    share = [clients // len(urls) + (i < clients % len(urls)) for i in range(len(urls))]
    t0 = time.perf_counter()
    procs = [hey(u, c, seconds, body, timeout=600) for u, c in zip(urls, share, strict=True) if c]
    lat, errors = [], 0
    for p in procs:
        a, e = results(p)
        lat += a
        errors += e
    span = time.perf_counter() - t0
    ms = np.array(lat) * 1e3 if lat else np.array([np.nan])
    p50, p95, p99 = np.percentile(ms, [50, 95, 99])
    return {
        "clients": clients,
        "requests": len(lat),
        "per_s": len(lat) / span,
        "p50_ms": float(p50),
        "p95_ms": float(p95),
        "p99_ms": float(p99),
        "max_ms": float(ms.max()),
        "errors": errors,
    }


def plot(runs: list[dict], path: Path) -> None:
    """Per run (k, jobs): the loop pass by part, and the dry runs' p50 and p99."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4.2))
    labels = [f"k={r['k']}\n{r['jobs']} jobs" for r in runs]
    parts = ("view", "reconcile", "engine_solve", "compute_other", "other")
    bottom = np.zeros(len(runs))
    for part in parts:
        vals = []
        for r in runs:
            p = r["loop_passes"][-1]
            got = p["parts"]
            v = {
                "view": got.get("view", 0.0),
                "reconcile": got.get("reconcile", 0.0),
                "engine_solve": got.get("engine_solve", 0.0),
                "compute_other": got.get("compute", 0.0) - got.get("engine_solve", 0.0),
            }
            v["other"] = p["s"] - sum(v.values())
            vals.append(v[part])
        ax1.bar(labels, vals, bottom=bottom, label=part.replace("_", " "))
        bottom += np.array(vals)
    ax1.set_ylabel("seconds")
    ax1.set_title("one control-loop pass (the last one run)")
    ax1.legend(fontsize=8)
    x = np.arange(len(runs))
    for i, (path_name, key) in enumerate((("all jobs", "dry_all"), ("per job", "dry_per_job"))):
        p50 = [r[key]["p50_ms"] / 1e3 for r in runs]
        p99 = [r[key]["p99_ms"] / 1e3 for r in runs]
        ax2.bar(x + (i - 0.5) * 0.38, p99, 0.36, label=f"{path_name}: p99", alpha=0.85)
        ax2.scatter(x + (i - 0.5) * 0.38, p50, color="k", marker="_", s=200, zorder=3)
    ax2.set_xticks(x, labels)
    ax2.set_yscale("log")
    ax2.set_ylabel("seconds (bar: p99, dash: p50)")
    ax2.set_title(f"dry runs at {runs[0]['dry_all']['clients']} clients")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=64)
    ap.add_argument("--jobs", type=int, default=10000)
    ap.add_argument("--workers", default="1,5", help="workers per job, min,max")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--http-jobs", type=int, default=20, help="jobs registered over HTTP")
    ap.add_argument(
        "--apply",
        type=int,
        default=200,
        help="jobs placed on the fabric (ONOS's app holds 256 jobs' numbers at most)",
    )
    ap.add_argument("--judge", type=int, default=20, help="placed jobs worth_moving judges")
    ap.add_argument("--no-cache", action="store_true", help="AGG_OPTIMIZER_DRY_RUN_CACHE=false")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    ap.add_argument(
        "--plot", type=Path, nargs="+", metavar="JSON", help="only plot these results (--png)"
    )
    ap.add_argument("--png", type=Path, default=Path("service-scale.png"))
    ap.add_argument("--src", type=Path, help="run this copy of the package's src/ instead")
    args = ap.parse_args()
    if args.src:
        env = {**os.environ, "PYTHONPATH": f"{args.src.resolve()}{os.pathsep}"
               + os.environ.get("PYTHONPATH", ""), "SERVICE_SCALE_SRC": str(args.src)}  # fmt: skip
        argv = [a for i, a in enumerate(sys.argv) if a != "--src" and sys.argv[i - 1] != "--src"]
        os.execve(sys.executable, [sys.executable, *argv], env)
    if args.plot:
        plot([json.loads(p.read_text()) for p in args.plot], args.png)
        return
    if not HEY.exists():
        raise SystemExit(f"{HEY}: missing (make bench-service installs it)")
    lo, hi = (int(x) for x in args.workers.split(","))
    import agg_optimizer

    res: dict = {"k": args.k, "jobs": args.jobs, "workers": [lo, hi], "load": [os.getloadavg()]}
    res["code"] = str(Path(agg_optimizer.__file__).parent)

    t = time.perf_counter()
    topo = fat_tree(args.k)
    devices, links, hosts = onos_json(topo)
    onos = OnosRest(devices, links, hosts, aggregation=True)
    onos.start()
    influx = InfluxServer()
    influx.start()
    specs = jobs_on_distinct_hosts(topo, args.jobs, (lo, hi), seed=1)
    late = more_jobs(topo, specs, args.http_jobs)
    res["setup_s"] = time.perf_counter() - t
    work = Path(tempfile.mkdtemp(prefix="svc-scale-"))
    env = {
        **os.environ,
        "AGG_OPTIMIZER_ONOS_URL": onos.url,
        "AGG_OPTIMIZER_INFLUX_URL": influx.url,
        "AGG_OPTIMIZER_INFLUX_BUCKET": influx.bucket,
        "AGG_OPTIMIZER_DB_PATH": str(work / "db.sqlite"),
        "AGG_OPTIMIZER_REOPTIMIZE_PERIOD_S": "0",
        "AGG_OPTIMIZER_MAX_JOBS": str(args.jobs + len(late)),
        # The stand-in answers /links of a k=64 fabric (262,144 entries) in seconds.
        "AGG_OPTIMIZER_ONOS_TIMEOUT_S": "120",
        "AGG_OPTIMIZER_DRY_RUN_CACHE": "false" if args.no_cache else "true",
    }
    port = free_port()
    exe = str(Path(sys.executable).parent / "agg-optimizer")
    log = open(work / "service.log", "wb")  # noqa: SIM115 - owned by the process
    proc = subprocess.Popen([exe, "serve", "--port", str(port)], env=env, stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base)
        # INT state for every switch port, as the collector writes it
        rng = np.random.default_rng(2)
        lines = [
            f"int_link,switch={d['annotations']['intSwitchId']},port={p} "
            f"utilization={rng.uniform(0.0, 0.5):.3f}"
            for d in devices["devices"]
            for p in range(1, args.k + 1)
        ]
        for i in range(0, len(lines), 50_000):
            httpx.post(
                f"{influx.url}/write",
                params={"db": "telemetry"},
                content="\n".join(lines[i : i + 50_000]),
                timeout=120,
            ).raise_for_status()

        http_lat = []
        with httpx.Client(base_url=base, timeout=600) as client:
            for body in specs[: args.http_jobs]:
                t = time.perf_counter()
                client.post("/api/v1/jobs", json=body).raise_for_status()
                http_lat.append(time.perf_counter() - t)
        res["register_http_s"] = http_lat
        print(f"HTTP registrations: {np.median(http_lat):.2f} s each", file=sys.stderr)
        proc.terminate()
        proc.wait(30)
        t = time.perf_counter()
        direct(env, hosts, specs[args.http_jobs :])
        res["register_direct_s"] = time.perf_counter() - t
        t = time.perf_counter()
        proc = subprocess.Popen(
            [exe, "serve", "--port", str(port)], env=env, stdout=log, stderr=log
        )
        wait_healthy(base)
        res["restart_s"] = time.perf_counter() - t
        print(f"restarted with {args.jobs} jobs in {res['restart_s']:.1f} s", file=sys.stderr)
        with httpx.Client(base_url=base, timeout=600) as client:
            t = time.perf_counter()
            ids = [sp["id"] for sp in specs[: args.apply]]
            r = client.post("/api/v1/placements", json={"jobs": ids}, timeout=7200)
            if r.status_code != 200:
                raise RuntimeError(f"placing every job: {r.status_code} {r.text[:2000]}")
            res["place_all_s"] = time.perf_counter() - t
            placed = r.json()
            res["place_all_status"] = r.status_code
            res["placed"] = len(placed) if isinstance(placed, list) else placed
            print(f"{args.apply} placed in {res['place_all_s']:.1f} s", file=sys.stderr)
            # one dry run alone, then under load
            t = time.perf_counter()
            client.post("/api/v1/placements", json={"dry_run": True}).raise_for_status()
            res["dry_run_first_s"] = time.perf_counter() - t
        res["load"].append(os.getloadavg())
        res["dry_all"] = dry_run_load(
            [f"{base}/api/v1/placements"], args.clients, args.seconds, '{"dry_run": true}'
        )
        print(f"all: {res['dry_all']}", file=sys.stderr)
        res["load"].append(os.getloadavg())
        urls = [f"{base}/api/v1/jobs/j{i}/placement?dry_run=true" for i in range(args.clients)]
        res["dry_per_job"] = dry_run_load(urls, args.clients, args.seconds, "")
        print(f"per job: {res['dry_per_job']}", file=sys.stderr)
        res["load"].append(os.getloadavg())
        late_lat = []
        with httpx.Client(base_url=base, timeout=600) as client:
            for body in late:
                t = time.perf_counter()
                client.post("/api/v1/jobs", json=body).raise_for_status()
                late_lat.append(time.perf_counter() - t)
        res["register_http_late_s"] = late_lat
        print(f"late registrations: {np.median(late_lat):.3f} s each", file=sys.stderr)
        res["service_rss_peak_mb"] = rss_peak_mb(proc.pid)
    except BaseException:
        influx.stop(remove=True)
        onos.stop()
        raise
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()

    try:
        for k, v in env.items():
            if k.startswith("AGG_OPTIMIZER_"):
                os.environ[k] = v
        from agg_optimizer.service import loop, planner
        from agg_optimizer.service.core import Service
        from agg_optimizer.service.planner import Planner
        from agg_optimizer.service.settings import Settings

        spent: dict[str, float] = {}

        def timed(name, fn):  # type: ignore[no-untyped-def]
            def run(*a, **kw):  # type: ignore[no-untyped-def]
                t0 = time.perf_counter()
                try:
                    return fn(*a, **kw)
                finally:
                    spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0

            return run

        # where a pass goes: the view (ONOS topology, InfluxDB), reconcile, the joint
        # solve(s) (engine.solve, inside compute), the hysteresis check, the moves
        Service.view = timed("view", Service.view)
        Service.reconcile = timed("reconcile", Service.reconcile)
        Planner.compute = timed("compute", Planner.compute)
        planner.solve = timed("engine_solve", planner.solve)
        loop.ControlLoop.worth_moving = timed("worth_moving", loop.ControlLoop.worth_moving)
        Service._apply = timed("apply", Service._apply)
        svc = Service(Settings())
        svc.ownership.check()  # the owner claim the app's start-up takes (ownership.py)
        passes = []
        for _ in range(args.passes):
            svc.views.forget()  # a fresh view, as a pass after the view's age would fetch
            spent.clear()
            t = time.perf_counter()
            out = svc.step()
            passes.append(
                {
                    "s": time.perf_counter() - t,
                    "parts": dict(spent),
                    "jobs": len(out["jobs"]),
                    "changed": len(out["changed"]),
                    "kept": len(out["kept"]),
                    "errors": len(out["errors"]),
                    "unplaceable": len(out["unplaceable"]),
                }
            )
            print(f"loop pass: {passes[-1]}", file=sys.stderr)
            res["load"].append(os.getloadavg())
        res["loop_passes"] = passes
        # The hysteresis check (`worth_moving`) of --judge placed jobs on one view, as a
        # pass in which that many jobs came out with a new placement runs it.
        view = svc.view()
        judged = [
            (svc.store.job(sp["id"]), svc.store.current(sp["id"])["placement"])
            for sp in specs[: min(args.judge, args.apply)]
        ]
        t = time.perf_counter()
        for job, cur in judged:
            svc._worth_moving(view, job, cur, cur)
        res["judge"] = {"jobs": len(judged), "s": time.perf_counter() - t}
        print(f"judged: {res['judge']}", file=sys.stderr)
        svc.close()
    finally:
        influx.stop(remove=True)
        onos.stop()
    text = json.dumps(res, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
