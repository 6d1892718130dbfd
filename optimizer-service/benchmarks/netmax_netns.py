"""NetMax against its baselines with real processes over real, rate-limited links, with the
peer plans served by the optimizer service from INT-style telemetry (docs/peers.md,
"Measured with real processes").

Eight `agg-agent gossip` workers, each in its own network namespace on one Linux bridge;
each worker's egress is shaped per destination by `tc` (htb, one class per peer), so pair
speeds differ. The fabric the service sees is a leaf-spine whose hosts are the workers
(`10.77.0.<i+1>`), served by the ONOS stand-in (`demo.onos_rest`), with link utilisation
written to a real InfluxDB as the INT collector writes it (`int_link`): a *hot* leaf's
uplinks run at `--hot-util` (0.9: a tenth of their capacity left), and every pair whose
path crosses a hot leaf's uplinks is shaped to `--slow` Mbit/s, the others to `--fast`.
So the tc rates and the telemetry say the same thing, and the service turns the telemetry
into plans (`GET /api/v1/jobs/{id}/peers`) as it would on a real fabric.

Scenarios:
- `racks`: two leaves of four, both uplinks hot for the whole run (the static two-rack
  fabric).
- `moving`: four leaves of two; two leaves are hot at a time and the pair changes every
  `--period` seconds (seeded), tc and telemetry together. `netmax-live` workers re-read
  their row from the service every `--refresh` seconds; `netmax-static` keeps the plan of
  the first hot pair.

Policies: adpsgd (uniform peers), netmax (static or live, per `--kappas`), and the
synchronous baselines as real processes: ring all-reduce, parameter server (on the worker
the service's `ps` plan picks) and Prague (random groups of 4, partial all-reduce). Time
to target: when every worker's latest logged loss is within 5% of the way from the initial
loss to the optimum.

Needs root, iproute2, tc and InfluxDB 1.8 (`make influxdb`).
`uv run python optimizer-service/benchmarks/netmax_netns.py --scenario moving --out DIR`
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

from agg_agent.gossip import Problem
from agg_optimizer.demo.live import onos_json
from agg_optimizer.demo.onos_rest import OnosRest
from agg_optimizer.model.documents import Link, Node, Topology
from int_collector.influxd import InfluxServer, free_port

N = 8
PORT = 47000
BR_IP = "10.77.0.254"
SPINES = 2
PS_HOST = "10.77.0.100"
MODEL_BYTES = 50_000_000  # what the service plans for: 10 Gbit/s links (see `tc_scale`)


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def tag() -> str:
    return str(os.getpid() % 1000)


def ns(i: int) -> str:
    return f"gsp{tag()}n{i}"


def ip(i: int) -> str:
    return f"10.77.0.{i + 1}"


@dataclass
class Fabric:
    """Leaves of `per_leaf` workers; the set of hot leaves over time."""

    leaves: int
    per_leaf: int
    fast: float  # Mbit/s
    slow: float
    hot_sequence: list[frozenset[int]]  # hot leaves in period 0, 1, ...
    period: float = math.inf
    hot: frozenset[int] = field(default_factory=frozenset)

    def leaf(self, i: int) -> int:
        return i // self.per_leaf

    def rate(self, i: int, m: int, hot: frozenset[int] | None = None) -> float:
        hot = self.hot if hot is None else hot
        a, b = self.leaf(i), self.leaf(m)
        return self.fast if a == b or (a not in hot and b not in hot) else self.slow

    def hot_at(self, k: int) -> frozenset[int]:
        return self.hot_sequence[k % len(self.hot_sequence)]

    def topology(self) -> Topology:
        nodes = [Node(id=f"s{s}", kind="switch") for s in range(SPINES)]
        links = []
        for leaf in range(self.leaves):
            nodes.append(Node(id=f"l{leaf}", kind="switch"))
            links += [Link(src=f"l{leaf}", dst=f"s{s}") for s in range(SPINES)]
        for i in range(N):
            nodes.append(Node(id=ip(i), kind="host"))
            links.append(Link(src=ip(i), dst=f"l{self.leaf(i)}"))
        # The job document names a parameter server (placement needs one); no process runs
        # there, the peer plans do not use it.
        nodes.append(Node(id=PS_HOST, kind="host"))
        links.append(Link(src=PS_HOST, dst="l0"))
        return Topology(nodes=nodes, links=links)


def fabric_for(scenario: str, args: argparse.Namespace, seed: int) -> Fabric:
    if scenario == "racks":
        both = frozenset({0, 1})
        return Fabric(2, 4, args.fast, args.slow, [both])
    rng = np.random.default_rng([seed, 19])
    pairs = [frozenset({a, b}) for a in range(4) for b in range(a + 1, 4)]
    seq = [pairs[int(rng.integers(len(pairs)))]]
    while len(seq) < 64:
        nxt = pairs[int(rng.integers(len(pairs)))]
        if nxt != seq[-1]:
            seq.append(nxt)
    return Fabric(4, 2, args.fast, args.slow, seq, args.period)


# --- the namespaces and their shaping ---------------------------------------------------


def setup() -> str:
    br = f"gsp{tag()}br"
    sh("ip", "link", "add", br, "type", "bridge")
    sh("ip", "addr", "add", f"{BR_IP}/24", "dev", br)
    sh("ip", "link", "set", br, "up")
    for i in range(N):
        n, h, b = ns(i), f"g{tag()}h{i}", f"g{tag()}b{i}"
        sh("ip", "netns", "add", n)
        sh("ip", "link", "add", h, "type", "veth", "peer", "name", b)
        sh("ip", "link", "set", h, "netns", n)
        sh("ip", "link", "set", b, "master", br)
        sh("ip", "link", "set", b, "up")
        sh("ip", "-n", n, "addr", "add", f"{ip(i)}/24", "dev", h)
        sh("ip", "-n", n, "link", "set", h, "up")
        sh("ip", "-n", n, "link", "set", "lo", "up")
        tc = ["ip", "netns", "exec", n, "tc"]
        sh(*tc, "qdisc", "add", "dev", h, "root", "handle", "1:", "htb", "default", "99")
        sh(*tc, "class", "add", "dev", h, "parent", "1:", "classid", "1:99", "htb",
           "rate", "1000mbit")  # fmt: skip
        for m in range(N):
            if m == i:
                continue
            sh(*tc, "class", "add", "dev", h, "parent", "1:", "classid", f"1:{m + 1}", "htb",
               "rate", "1mbit")  # fmt: skip
            sh(*tc, "filter", "add", "dev", h, "parent", "1:", "protocol", "ip", "prio", "1",
               "u32", "match", "ip", "dst", f"{ip(m)}/32", "flowid", f"1:{m + 1}")  # fmt: skip
    return br


def shape(fabric: Fabric, hot: frozenset[int]) -> None:
    """Every pair's rate for this hot set: one `tc -batch` per namespace."""
    for i in range(N):
        lines = []
        for m in range(N):
            if m != i:
                r = f"{fabric.rate(i, m, hot) * 1000:g}kbit"
                lines.append(
                    f"class change dev g{tag()}h{i} parent 1: classid 1:{m + 1} htb "
                    f"rate {r} ceil {r}"
                )
        subprocess.run(["ip", "netns", "exec", ns(i), "tc", "-batch", "-"],
                       input="\n".join(lines) + "\n", text=True, check=True,
                       capture_output=True)  # fmt: skip


def teardown(br: str) -> None:
    for i in range(N):
        subprocess.run(["ip", "netns", "del", ns(i)], capture_output=True)
    subprocess.run(["ip", "link", "del", br], capture_output=True)


# --- the service, its ONOS and its telemetry ---------------------------------------------


class Control:
    """ONOS stand-in + real InfluxDB + `agg-optimizer serve` on the bridge's address."""

    def __init__(self, fabric: Fabric, work: Path) -> None:
        self.topo = fabric.topology()
        devices, links, hosts = onos_json(self.topo)
        self.devices, self.links = devices, links
        self.onos = OnosRest(devices, links, hosts, aggregation=True)
        self.onos.start()
        self.influx = InfluxServer()
        self.influx.start()
        self.token = secrets.token_hex(16)
        self.port = free_port()
        env = {
            **os.environ,
            "AGG_OPTIMIZER_ONOS_URL": self.onos.url,
            "AGG_OPTIMIZER_INFLUX_URL": self.influx.url,
            "AGG_OPTIMIZER_INFLUX_BUCKET": self.influx.bucket,
            "AGG_OPTIMIZER_DB_PATH": str(work / "db.sqlite"),
            "AGG_OPTIMIZER_REOPTIMIZE_PERIOD_S": "0",
            "AGG_OPTIMIZER_VIEW_MAX_AGE_S": "0.5",
            "AGG_OPTIMIZER_API_TOKEN": self.token,
        }
        exe = str(Path(sys.executable).parent / "agg-optimizer")
        self.log = open(work / "service.log", "wb")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen([exe, "serve", "--host", BR_IP, "--port", str(self.port)],
                                     env=env, stdout=self.log, stderr=self.log)  # fmt: skip
        self.base = f"http://{BR_IP}:{self.port}"
        for _ in range(300):
            try:
                if httpx.get(self.base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            raise RuntimeError(f"the service did not start: see {work / 'service.log'}")
        self.int_id = {d["id"]: d["annotations"]["intSwitchId"] for d in devices["devices"]}

    def telemetry(self, fabric: Fabric, hot: frozenset[int], util: float) -> None:
        """Every switch port's utilisation, as the INT collector writes it: a hot leaf's
        uplinks (both directions) at `util`, everything else idle."""
        lines = []
        for ln in self.links["links"]:
            a, b = ln["src"]["device"], ln["dst"]["device"]
            leaf = a if "device:l" in a else b
            u = util if int(leaf.removeprefix("device:l")) in hot else 0.0
            lines.append(f"int_link,switch={self.int_id[a]},port={ln['src']['port']} "
                         f"utilization={u}")  # fmt: skip
        httpx.post(f"{self.influx.url}/write", params={"db": "telemetry"},
                   content="\n".join(lines), timeout=10).raise_for_status()  # fmt: skip

    def add_job(self, job: str) -> None:
        body = {"id": job, "workers": [ip(i) for i in range(N)], "ps": PS_HOST,
                "update_bytes": MODEL_BYTES}  # fmt: skip
        r = httpx.post(f"{self.base}/api/v1/jobs", json=body, timeout=30,
                       headers={"Authorization": f"Bearer {self.token}"})  # fmt: skip
        if r.status_code not in (200, 201):
            raise RuntimeError(f"POST /jobs: {r.status_code} {r.text}")

    def peers_url(self, job: str, policy: str, kappa: float) -> str:
        return f"{self.base}/api/v1/jobs/{job}/peers?policy={policy}&kappa={kappa:g}&compute_s=0"

    def plan(self, job: str, policy: str, kappa: float = 1.0) -> dict:
        r = httpx.get(self.peers_url(job, policy, kappa), timeout=30)
        r.raise_for_status()
        return r.json()

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self.log.close()
        self.influx.stop(remove=True)
        self.onos.stop()


# --- one run of one policy ----------------------------------------------------------------


class Mover(threading.Thread):
    """Moves the hotspot every `period` seconds, tc then telemetry, from when every worker
    has opened its log (the workers' clocks start then, once all peers listen)."""

    def __init__(self, fabric: Fabric, control: Control, util: float, out: Path) -> None:
        super().__init__(daemon=True)
        self.fabric, self.control, self.util, self.out = fabric, control, util, out
        self.stop = threading.Event()
        self.moves: list[tuple[float, list[int]]] = []
        self.start_at = math.inf

    def run(self) -> None:
        while not all((self.out / f"w{i}.log").exists() for i in range(N)):
            if self.stop.wait(0.01):
                return
        self.start_at = time.monotonic()
        k = 1  # the first hot set is in force already
        while not self.stop.is_set():
            while not self.stop.wait(0.05):
                if time.monotonic() - self.start_at >= k * self.fabric.period:
                    break
            if self.stop.is_set() or not math.isfinite(self.fabric.period):
                return
            hot = self.fabric.hot_at(k)
            shape(self.fabric, hot)
            self.control.telemetry(self.fabric, hot, self.util)
            self.moves.append((time.monotonic() - self.start_at, sorted(hot)))
            k += 1


def episode(how: list[str], args: argparse.Namespace, seed: int, out: Path) -> None:
    sync = "--mode" in how  # the synchronous baselines need longer to reach the target
    duration = args.sync_duration if sync else args.duration
    addrs = ",".join(f"{ip(i)}:{PORT}" for i in range(N))
    cmd = [sys.executable, "-c", "from agg_agent.cli import main; main()", "gossip"]
    procs = []
    for i in range(N):
        procs.append(subprocess.Popen(
            ["ip", "netns", "exec", ns(i), *cmd, "--me", str(i), "--peers", addrs,
             *how, "--duration-s", str(duration),
             "--features", str(args.features), "--data-seed", str(seed),
             "--log", str(out / f"w{i}.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        ))  # fmt: skip
    for p in procs:
        _, err = p.communicate(timeout=duration + 120)
        if p.returncode != 0:
            raise RuntimeError(f"a worker failed: {err[-800:]}")


def losses(out: Path) -> list[list[tuple[float, float]]]:
    logs = []
    for i in range(N):
        pts = [json.loads(ln) for ln in (out / f"w{i}.log").read_text().splitlines()]
        logs.append([(p["t"], p["loss"]) for p in pts if "loss" in p])
    return logs


def plan_changes(out: Path) -> int:
    n = 0
    for i in range(N):
        for ln in (out / f"w{i}.log").read_text().splitlines():
            n += "plan_changed" in json.loads(ln)
    return n


def time_to_target(logs: list[list[tuple[float, float]]], target: float) -> float:
    times = sorted({t for log in logs for t, _ in log})
    for t in times:
        latest = []
        for log in logs:
            before = [loss for tt, loss in log if tt <= t]
            latest.append(before[-1] if before else math.inf)
        if max(latest) <= target:
            return t
    return math.inf


def policies(args: argparse.Namespace, control: Control, job: str) -> dict[str, list[str]]:
    """Name -> the worker options that run it; plan files are written per seed."""
    out: dict[str, list[str]] = {"adpsgd": ["@adpsgd"]}
    for k in (float(x) for x in args.kappas.split(",")):
        out[f"netmax-static (kappa {k:g})"] = [f"@netmax:{k:g}"]
        if args.scenario == "moving":
            out[f"netmax-live (kappa {k:g})"] = [
                "--probabilities", control.peers_url(job, "netmax", k),
                "--refresh-s", str(args.refresh),
            ]  # fmt: skip
    ps_index = int(control.plan(job, "ps")["detail"]["ps_index"])
    out["allreduce"] = ["--mode", "allreduce"]
    out["ps"] = ["--mode", "ps", "--ps-index", str(ps_index)]
    out["prague"] = ["--mode", "prague", "--group", "4"]
    if args.policies:
        keep = args.policies.split(",")
        out = {k: v for k, v in out.items() if k.split()[0] in keep or k in keep}
    return out


def plot(doc: dict, path: Path, seed: int = 0) -> None:
    """One seed: the worst worker's loss over time per policy, the target, and (moving)
    when the hotspot moved."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in doc["runs"] if r["seed"] == seed]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for k, r in enumerate(runs):
        times = sorted({t for log in r["losses"] for t, _ in log})
        worst = []
        for t in times:
            latest = [([x for tt, x in log if tt <= t] or [math.inf])[-1] for log in r["losses"]]
            worst.append(max(latest))
        tt = r["time_to_target_s"]
        label = f"{r['policy']}: {tt:.1f} s" if math.isfinite(tt) else f"{r['policy']}: > run"
        ax.plot(times, worst, color=f"C{k}", lw=1.2, label=label)
    ax.axhline(runs[0]["target"], color="k", ls="--", lw=0.8, label="target")
    for t, _hot in runs[0]["moves"]:
        ax.axvline(t, color="grey", lw=0.6, alpha=0.6)
    ax.set_xlabel("seconds")
    ax.set_ylabel("worst worker's loss (all shards)")
    ax.set_ylim(runs[0]["target"] * 0.97, runs[0]["target"] * 1.25)
    done = [r["time_to_target_s"] for r in runs if math.isfinite(r["time_to_target_s"])]
    ax.set_xlim(0, 1.3 * max(done) if done else 60)
    ax.legend(fontsize=7, ncol=2)
    scen = doc["args"]["scenario"]
    ax.set_title(
        f"real processes, scenario {scen}, seed {seed}"
        + (" (grey: the hotspot moves)" if scen == "moving" else ""),
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", choices=("racks", "moving"), default="racks")
    ap.add_argument("--fast", type=float, default=0.4, help="Mbit/s on cool paths")
    ap.add_argument("--slow", type=float, default=0.04, help="Mbit/s across a hot uplink")
    ap.add_argument("--hot-util", type=float, default=0.9)
    ap.add_argument("--period", type=float, default=6.0, help="moving: seconds per hot pair")
    ap.add_argument("--refresh", type=float, default=1.0, help="netmax-live: plan re-read, s")
    ap.add_argument("--features", type=int, default=200)
    ap.add_argument("--duration", type=float, default=45.0)
    ap.add_argument(
        "--sync-duration", type=float, default=120.0, help="seconds for allreduce, ps and prague"
    )
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--kappas", default="1,0.1")
    ap.add_argument("--policies", default="", help="only these (comma-separated names)")
    ap.add_argument("--out", type=Path, default=None, help="write JSON results here")
    ap.add_argument("--plot", type=Path, default=None, help="only plot this results JSON")
    args = ap.parse_args()
    if args.plot:
        plot(json.loads(args.plot.read_text()), args.plot.with_suffix(".png"))
        return
    if os.geteuid() != 0 or not shutil.which("tc"):
        sys.exit("needs root and tc (network namespaces, per-destination rate limits)")
    if abs(args.slow / args.fast - (1 - args.hot_util)) > 1e-9:
        sys.exit("--slow / --fast must be 1 - --hot-util: tc and telemetry must agree")
    work = Path(tempfile.mkdtemp(prefix="netmax-netns-"))
    br = setup()
    results: dict[str, list[float]] = {}
    runs: list[dict] = []
    control = None
    try:
        for seed in range(args.seeds):
            fabric = fabric_for(args.scenario, args, seed)
            if control is None:
                control = Control(fabric, work)
            job = f"g{seed}"
            shape(fabric, fabric.hot_at(0))
            control.telemetry(fabric, fabric.hot_at(0), args.hot_util)
            time.sleep(1.0)  # past the service's view cache
            control.add_job(job)
            problem = Problem(N, args.features, seed=seed)
            opt = problem.optimum()
            start = problem.loss(np.zeros(args.features), *problem.eval_set())
            target = opt + 0.05 * (start - opt)
            for name, how in policies(args, control, job).items():
                out = work / f"{name.replace(' ', '_').replace('(', '').replace(')', '')}-{seed}"
                out.mkdir()
                shape(fabric, fabric.hot_at(0))  # every run starts on the first hot set
                control.telemetry(fabric, fabric.hot_at(0), args.hot_util)
                time.sleep(0.6)  # past the service's view cache (0.5 s)
                plan = None
                if how[0].startswith("@"):  # a plan fetched now, on the first hot set
                    policy, _, k = how[0][1:].partition(":")
                    plan = control.plan(job, policy, float(k or 1))
                    (out / "plan.json").write_text(json.dumps(plan))
                    how = ["--probabilities", str(out / "plan.json")]
                mover = Mover(fabric, control, args.hot_util, out)
                mover.start()
                try:
                    episode(how, args, seed, out)
                finally:
                    mover.stop.set()
                    mover.join()
                logs = losses(out)
                tt = time_to_target(logs, target)
                results.setdefault(name, []).append(tt)
                runs.append({"policy": name, "seed": seed, "time_to_target_s": tt,
                             "target": target, "moves": mover.moves,
                             "plan_changes": plan_changes(out), "plan": plan,
                             "losses": [[(round(t, 3), round(x, 6)) for t, x in log]
                                        for log in logs]})  # fmt: skip
                print(f"seed {seed} {name}: {tt:.1f} s", file=sys.stderr, flush=True)
    finally:
        if control is not None:
            control.close()
        teardown(br)
    base = np.array(results.get("adpsgd") or [math.nan] * args.seeds)
    ar = np.array(results.get("allreduce") or [math.nan] * args.seeds)
    print(f"scenario {args.scenario}: {args.fast:g} Mbit/s cool, {args.slow:g} across a hot "
          f"uplink; {args.features} features ({8 * args.features / 1e3:.1f} kB models); "
          f"{args.seeds} seeds; logs in {work}")  # fmt: skip
    print("| policy | time to target (s) per seed | mean | vs adpsgd | vs allreduce |")
    print("|---|---|---|---|---|")
    for name, v in results.items():
        a = np.array(v)
        s1, s2 = base / a, ar / a
        print(f"| {name} | {', '.join(f'{x:.1f}' for x in a)} | {a.mean():.1f} "
              f"| {s1.mean():.2f}x ({s1.min():.2f}-{s1.max():.2f}) "
              f"| {s2.mean():.2f}x ({s2.min():.2f}-{s2.max():.2f}) |")  # fmt: skip
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        doc = {"args": {k: str(v) for k, v in vars(args).items()}, "results": results,
               "runs": runs}  # fmt: skip
        (args.out / f"netns-{args.scenario}.json").write_text(json.dumps(doc))
        plot(doc, args.out / f"netns-{args.scenario}.png")


if __name__ == "__main__":
    main()
