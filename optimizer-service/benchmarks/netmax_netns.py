"""NetMax against uniform peers (AD-PSGD) with real processes over real, rate-limited links
(docs/peers.md, "Measured with real processes").

Eight `agg-agent gossip` workers, each in its own network namespace on one Linux bridge
(or, for the synchronous baseline, ring all-reduce between the same processes);
each worker's egress is shaped per destination by `tc` (htb, one class per peer), so the
pair speeds are heterogeneous: two racks of four, `--fast` Mbit/s inside a rack and
`--slow` across. The peer plans come from `agg_agent`'s optimizer (`peers.plan`) on the
exchange times those rates give; every worker logs the loss of its model on all the data.
Time to target: when every worker's latest logged loss is within 5% of the way from the
initial loss to the optimum.

Needs root, iproute2 and tc. `uv run python optimizer-service/benchmarks/netmax_netns.py`
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from agg_agent.gossip import Problem
from agg_optimizer import peers

N = 8
PORT = 47000


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def ns(i: int) -> str:
    return f"gsp{os.getpid() % 1000}n{i}"


def ip(i: int) -> str:
    return f"10.77.0.{i + 1}"


def rate(i: int, m: int, fast: float, slow: float) -> float:
    return fast if (i < N // 2) == (m < N // 2) else slow


def setup(fast: float, slow: float) -> str:
    br = f"gsp{os.getpid() % 1000}br"
    sh("ip", "link", "add", br, "type", "bridge")
    sh("ip", "link", "set", br, "up")
    for i in range(N):
        n, h, b = ns(i), f"g{os.getpid() % 1000}h{i}", f"g{os.getpid() % 1000}b{i}"
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
            r = f"{rate(i, m, fast, slow) * 1000:g}kbit"
            sh(*tc, "class", "add", "dev", h, "parent", "1:", "classid", f"1:{m + 1}", "htb",
               "rate", r, "ceil", r)  # fmt: skip
            sh(*tc, "filter", "add", "dev", h, "parent", "1:", "protocol", "ip", "prio", "1",
               "u32", "match", "ip", "dst", f"{ip(m)}/32", "flowid", f"1:{m + 1}")  # fmt: skip
    return br


def teardown(br: str) -> None:
    for i in range(N):
        subprocess.run(["ip", "netns", "del", ns(i)], capture_output=True)
    subprocess.run(["ip", "link", "del", br], capture_output=True)


def episode(plan_file: Path | None, features: int, duration: float, seed: int, out: Path) -> None:
    addrs = ",".join(f"{ip(i)}:{PORT}" for i in range(N))
    cmd = [sys.executable, "-c", "from agg_agent.cli import main; main()", "gossip"]
    how = ["--mode", "allreduce"] if plan_file is None else ["--probabilities", str(plan_file)]
    procs = []
    for i in range(N):
        procs.append(subprocess.Popen(
            ["ip", "netns", "exec", ns(i), *cmd, "--me", str(i), "--peers", addrs,
             *how, "--duration-s", str(duration),
             "--features", str(features), "--data-seed", str(seed),
             "--log", str(out / f"w{i}.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        ))  # fmt: skip
    for p in procs:
        _, err = p.communicate(timeout=duration + 120)
        if p.returncode != 0:
            raise RuntimeError(f"a worker failed: {err[-500:]}")


def time_to_target(out: Path, target: float) -> float:
    logs = []
    for i in range(N):
        pts = [json.loads(ln) for ln in (out / f"w{i}.log").read_text().splitlines()]
        logs.append([(p["t"], p["loss"]) for p in pts])
    times = sorted({t for log in logs for t, _ in log})
    for t in times:
        latest = []
        for log in logs:
            before = [loss for tt, loss in log if tt <= t]
            latest.append(before[-1] if before else math.inf)
        if max(latest) <= target:
            return t
    return math.inf


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fast", type=float, default=0.4, help="Mbit/s inside a rack")
    ap.add_argument("--slow", type=float, default=0.04, help="Mbit/s across racks")
    ap.add_argument("--features", type=int, default=200)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--kappas", default="1,0.1")
    ap.add_argument("--policies", default="", help="only these (comma-separated names)")
    args = ap.parse_args()
    if os.geteuid() != 0 or not shutil.which("tc"):
        sys.exit("needs root and tc (network namespaces, per-destination rate limits)")
    bits = 8.0 * 8 * args.features
    t = np.array([[bits / (rate(i, m, args.fast, args.slow) * 1e6) if i != m else np.inf
                   for m in range(N)] for i in range(N)])  # fmt: skip
    names = [f"w{i}" for i in range(N)]
    policies = {"adpsgd": peers.plan("adpsgd", names, t), "allreduce": None}
    for k in (float(x) for x in args.kappas.split(",")):
        policies[f"netmax (kappa {k:g})"] = peers.plan("netmax", names, t, kappa=k)
    if args.policies:
        keep = args.policies.split(",")
        policies = {k: v for k, v in policies.items() if k.split()[0] in keep or k in keep}
    work = Path(tempfile.mkdtemp(prefix="netmax-netns-"))
    br = setup(args.fast, args.slow)
    results: dict[str, list[float]] = {k: [] for k in policies}
    try:
        for seed in range(args.seeds):
            problem = Problem(N, args.features, seed=seed)
            opt = problem.optimum()
            start = problem.loss(np.zeros(args.features), *problem.eval_set())
            target = opt + 0.05 * (start - opt)
            for name, plan in policies.items():
                out = work / f"{name.split()[0]}-{name[-4:]}-{seed}"
                out.mkdir()
                plan_file = None
                if plan is not None:
                    plan_file = out / "plan.json"
                    plan_file.write_text(json.dumps(plan.as_json()))
                episode(plan_file, args.features, args.duration, seed, out)
                tt = time_to_target(out, target)
                results[name].append(tt)
                print(f"seed {seed} {name}: {tt:.1f} s", file=sys.stderr)
    finally:
        teardown(br)
    base = np.array(results.get("adpsgd") or [math.nan] * args.seeds)
    print(f"{args.fast:g} Mbit/s in a rack, {args.slow:g} across; {args.features} features "
          f"({8 * args.features / 1e3:.1f} kB models); {args.seeds} seeds; "
          f"logs in {work}")  # fmt: skip
    print("| policy | time to target (s) per seed | mean | speed-up vs adpsgd |")
    print("|---|---|---|---|")
    for name, v in results.items():
        a = np.array(v)
        sp = base / a
        print(f"| {name} | {', '.join(f'{x:.1f}' for x in a)} | {a.mean():.1f} "
              f"| {sp.mean():.2f}x ({sp.min():.2f}-{sp.max():.2f}) |")  # fmt: skip


if __name__ == "__main__":
    main()
