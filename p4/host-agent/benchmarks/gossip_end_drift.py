"""How far from the optimum the copies of a gossip run end: four `agg-agent gossip`
processes on loopback (the ring-biased plan of tests/agent/test_gossip.py), `--runs` times,
optionally beside `--busy` busy loops as a CI run's other work would be. Per run and worker:
the median of its last three logged losses, as a fraction of the way from the start loss to
the optimum (0: at the optimum). The copies' clocks start tens of milliseconds apart; this is
what measured the drift of copies that went on after their peers had stopped
(`GossipWorker.run`).

    uv run python p4/host-agent/benchmarks/gossip_end_drift.py --runs 10 --busy 2
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from agg_agent.gossip import Problem


def _spin() -> None:
    while True:
        pass


def _ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def one_run(
    d: Path, n: int, features: int, duration_s: float
) -> tuple[list[float], list[float], list[dict]]:
    names = [f"w{i}" for i in range(n)]
    probs = {
        names[i]: {names[m]: 0.7 if m == (i + 1) % n else 0.15 for m in range(n) if m != i}
        for i in range(n)
    }
    (d / "plan.json").write_text(json.dumps({"workers": names, "probabilities": probs}))
    peers = ",".join(f"127.0.0.1:{p}" for p in _ports(n))
    cmd = [sys.executable, "-c", "from agg_agent.cli import main; main()", "gossip"]
    args = [["--me", str(i), "--peers", peers, "--probabilities", str(d / "plan.json"),
             "--duration-s", str(duration_s), "--features", str(features),
             "--log", str(d / f"{i}.log")] for i in range(n)]  # fmt: skip
    pipe = subprocess.PIPE
    procs = [subprocess.Popen([*cmd, *a], stdout=pipe, stderr=pipe, text=True) for a in args]
    counts = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        if p.returncode != 0:
            raise SystemExit(err)
        counts.append(json.loads(out.strip().splitlines()[-1]))
    problem = Problem(n, features)
    opt = problem.optimum()
    start = problem.loss(np.zeros(features), *problem.eval_set())
    drift, rise = [], []
    for i in range(n):
        lines = (d / f"{i}.log").read_text().splitlines()
        pts = [json.loads(ln) for ln in lines if '"loss"' in ln]
        end = float(np.median([p["loss"] for p in pts[-3:]]))
        # the same copy between 1 s and 0.2 s before its end: what the end itself added
        t_end = pts[-1]["t"]
        before = [p["loss"] for p in pts if t_end - 1.0 <= p["t"] <= t_end - 0.2]
        drift.append((end - opt) / (start - opt))
        rise.append((end - float(np.median(before))) / (start - opt))
    return drift, rise, counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--busy", type=int, default=0, help="busy loops running meanwhile")
    ap.add_argument("--duration-s", type=float, default=6.0)
    a = ap.parse_args()
    spinners = [mp.Process(target=_spin, daemon=True) for _ in range(a.busy)]
    for p in spinners:
        p.start()
    worst, worst_rise = [], []
    try:
        print("| run | drift per worker (fraction of the way back) | its rise in the last 0.2 s "
              "| ended by a peer |")  # fmt: skip
        print("|---|---|---|---|")
        for r in range(a.runs):
            with tempfile.TemporaryDirectory() as d:
                drift, rise, counts = one_run(Path(d), 4, 200, a.duration_s)
            worst.append(max(drift))
            worst_rise.append(max(rise))
            ended = sum(c.get("ended_by") is not None for c in counts)
            cells = (" ".join(f"{x:+.4f}" for x in v) for v in (drift, rise))
            print(f"| {r} | {' | '.join(cells)} | {ended} of 4 |", flush=True)
    finally:
        for p in spinners:
            p.kill()
    w, wr = np.array(worst), np.array(worst_rise)
    print(f"\nworst copy per run: mean {w.mean():.4f}, max {w.max():.4f}; runs over 2%: "
          f"{int((w >= 0.02).sum())} of {len(w)}; largest rise at the end per run: mean "
          f"{wr.mean():.4f}, max {wr.max():.4f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
