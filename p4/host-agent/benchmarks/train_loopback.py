"""DDP through the aggregation hook against DDP's own gloo all-reduce, on loopback with no
switch (the PS sums raw chunks), side by side in one run, and the machine's own limit:
a bare C pair moving packets of our size, with sendmmsg/recvmmsg and with segmented sends
and coalesced reads (UDP_SEGMENT/UDP_GRO, which the C data path uses on loopback).

    uv run python p4/host-agent/benchmarks/train_loopback.py [--params 5000,1000000,10000000]
        [--ranks 2,4] [--steps 5] [--out docs/benchmarks]   (make bench-training)

Per model (an MLP on synthetic data, sized to about the given parameters) and ranks: the
seconds a step takes with gloo; with the hook on the C data path and packets of 32 values
(what switches sum), overlapping backward; with packets of `--wide` values (a job whose PS
makes every sum), overlapping and not; with the Python data path (small models only: it is
the reference, not a contender); the ratios to gloo; the PS's packet rate against the bare
C pairs' at the same packet size (measured before and after the runs, averaged); the share
of the all-reduce hidden behind backward. Writes
`training.json`, `training.png` and prints the table of docs/benchmarks/training.md.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from int_collector import children

ROOT = Path(__file__).resolve().parents[3]
AGENT = [sys.executable, "-c", "from agg_agent.cli import main; main()"]
BATCH, FEATURES, CLASSES = 64, 256, 10
WINDOW = 128  # the service's default pool (pool_slots): chunks in flight
PAIR_C = r"""
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#define B 64
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif
static double now(void) {
  struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec;
}
int main(int c, char **v) {
  long n = atol(v[1]); int size = atoi(v[2]), seg = atoi(v[3]);  /* seg > 1: segmented */
  int r = socket(AF_INET, SOCK_DGRAM, 0), s = socket(AF_INET, SOCK_DGRAM, 0);
  int big = 1 << 24; setsockopt(r, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
  int one = 1; if (seg > 1) setsockopt(r, IPPROTO_UDP, UDP_GRO, &one, sizeof one);
  struct sockaddr_in a = {0}; a.sin_family = AF_INET; a.sin_addr.s_addr = htonl(0x7f000001);
  bind(r, (void*)&a, sizeof a); socklen_t l = sizeof a; getsockname(r, (void*)&a, &l);
  static char buf[B][65536]; struct mmsghdr m[B]; struct iovec io[B];
  memset(m, 0, sizeof m);
  for (int i = 0; i < B; i++) { io[i].iov_base = buf[i]; io[i].iov_len = size;
    m[i].msg_hdr.msg_iov = &io[i]; m[i].msg_hdr.msg_iovlen = 1;
    m[i].msg_hdr.msg_name = &a; m[i].msg_hdr.msg_namelen = sizeof a; }
  long got = 0; double t0 = 0, last = 0;
  if (fork() == 0) {  /* the sender: as fast as the kernel takes them */
    if (seg > 1) {  /* `seg` datagrams a send, cut by the kernel */
      char cb[CMSG_SPACE(sizeof(uint16_t))]; struct iovec io = {buf[0], (size_t)size * seg};
      struct msghdr h = {0}; h.msg_name = &a; h.msg_namelen = sizeof a; h.msg_iov = &io;
      h.msg_iovlen = 1; h.msg_control = cb; h.msg_controllen = sizeof cb;
      struct cmsghdr *c = CMSG_FIRSTHDR(&h); c->cmsg_level = IPPROTO_UDP;
      c->cmsg_type = UDP_SEGMENT; c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
      uint16_t g = size; memcpy(CMSG_DATA(c), &g, sizeof g);
      for (long k = 0; k < n + 4096; k += seg) sendmsg(s, &h, 0);
    } else
      for (long k = 0; k < n + 4096; k += B) sendmmsg(s, m, B, 0);
    _exit(0);
  }
  struct mmsghdr q[B]; struct iovec qi[B]; memset(q, 0, sizeof q);
  for (int i = 0; i < B; i++) { qi[i].iov_base = buf[i]; qi[i].iov_len = 65536;
    q[i].msg_hdr.msg_iov = &qi[i]; q[i].msg_hdr.msg_iovlen = 1; }
  struct timeval tv = {1, 0}; setsockopt(r, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  /* from the first datagram received to the last: the 1 s idle wait at the end of a run
     whose sender outran the receiver (the kernel dropped some) is not counted */
  while (got < n) {
    int k = recvmmsg(r, q, B, 0, NULL); if (k <= 0) break;
    last = now(); if (!got) t0 = last;
    for (int i = 0; i < k; i++) got += (q[i].msg_len + size - 1) / size;  /* datagrams */
  }
  printf("%ld %f\n", got, last - t0);
  return 0;
}
"""


def free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hidden_for(params: int) -> int:
    """An MLP FEATURES-h-h-CLASSES with about `params` parameters."""
    h = 8
    while (FEATURES * h + h * h + h * CLASSES + 2 * h + CLASSES) < params:
        h += max(1, h // 16)
    return h


def rank_main(rank: int, world: int, master: int, mode: str, params: int, steps: int,
              out: str, ps: str, bind: str, lanes: int) -> None:  # fmt: skip
    """One rank: warm up two steps, then time `steps` steps."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{master}", rank=rank,
                            world_size=world)  # fmt: skip
    torch.manual_seed(0)
    h = hidden_for(params)
    net = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, h), torch.nn.ReLU(), torch.nn.Linear(h, h), torch.nn.ReLU(),
        torch.nn.Linear(h, CLASSES),
    )  # fmt: skip
    ddp = DDP(net)
    hook = None
    if mode != "gloo":
        from agg_agent.torch_hook import AggregationHook

        os.environ["AGG_DATAPATH"] = "python" if mode == "python" else "native"
        host, port = ps.rsplit(":", 1)
        bhost, bport = bind.rsplit(":", 1)
        hook = AggregationHook.create(rank, world, 3, (host, int(port)), window=WINDOW,
                                      bind=(bhost, int(bport)), deadline_s=600,
                                      lanes=lanes)  # fmt: skip
        hook.overlap = mode != "sync"
        ddp.register_comm_hook(None, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(BATCH, FEATURES, generator=torch.Generator().manual_seed(rank))
    y = torch.randint(0, CLASSES, (BATCH,), generator=torch.Generator().manual_seed(rank))
    lossf = torch.nn.CrossEntropyLoss()
    times, backward = [], []
    for k in range(steps + 2):
        t0 = time.perf_counter()
        opt.zero_grad()
        lossf(ddp(x), y).backward()
        t1 = time.perf_counter()
        opt.step()
        if k >= 2:
            times.append(time.perf_counter() - t0)
            backward.append(t1 - t0)
    compute = 0.0
    if rank == 0:  # the same step with no all-reduce at all: what overlap can hide behind
        with ddp.no_sync():
            t0 = time.perf_counter()
            for _ in range(steps):
                opt.zero_grad()
                lossf(ddp(x), y).backward()
            compute = (time.perf_counter() - t0) / steps
    dist.barrier()
    if hook is not None:
        hook.close()
    dist.destroy_process_group()
    if rank == 0:
        n = sum(p.numel() for p in net.parameters())
        Path(out).write_text(json.dumps({"step_s": sorted(times)[len(times) // 2],
                                         "compute_s": compute, "params": n}))  # fmt: skip


def run(mode: str, world: int, params: int, steps: int, tmp: Path, lanes: int = 32) -> dict:
    master = free_port(socket.SOCK_STREAM)
    ports = [free_port(socket.SOCK_DGRAM) for _ in range(world + 1)]
    out = tmp / f"{mode}-{world}-{params}-{lanes}.json"
    ps_proc = None
    rows: list[dict] = []
    if mode != "gloo":
        env = {**os.environ, "AGG_DATAPATH": "python" if mode == "python" else "native"}
        ps_proc = children.spawn(
            [*AGENT, "ps", "--size", "0", "--job", "3", "--bind", f"127.0.0.1:{ports[0]}",
             "--lanes", str(lanes)]
            + [a for w in range(world) for a in ("--worker-addr", f"127.0.0.1:{ports[w + 1]}")],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
        )  # fmt: skip

        def follow() -> None:
            assert ps_proc is not None and ps_proc.stdout is not None
            for line in ps_proc.stdout:
                if line.startswith("{"):
                    rows.append({"t": time.monotonic(), **json.loads(line)})

        threading.Thread(target=follow, daemon=True).start()
    argv = [
        [sys.executable, __file__, "--rank", str(r), "--world", str(world), "--master",
         str(master), "--mode", mode, "--one", str(params), "--steps", str(steps),
         "--result", str(out), "--ps", f"127.0.0.1:{ports[0]}",
         "--bind", f"127.0.0.1:{ports[r + 1]}", "--lanes", str(lanes)]
        for r in range(world)
    ]  # fmt: skip
    procs = [children.spawn(a) for a in argv]  # each ends with this process
    try:
        for p in procs:
            if p.wait(timeout=7200) != 0:
                raise SystemExit(f"{mode} {world} ranks {params}: a rank exited {p.returncode}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        if ps_proc is not None:
            ps_proc.terminate()
            ps_proc.wait(60)
    res = json.loads(out.read_text())
    if rows:  # the PS's packet rate over the timed steps (the last `steps` reports)
        last = rows[-steps:]
        pkts = sum(r["aggregated_packets"] + r["raw_packets"] for r in last)
        res["ps_packets_per_s"] = pkts / max(1e-9, sum(r["seconds"] for r in last))
    return res


def bare_pair(tmp: Path, size: int, n: int = 2_000_000, segments: int = 1) -> float:
    """Packets a second a bare C pair moves over loopback, `size` bytes: sendmmsg/recvmmsg,
    or (`segments` > 1) sends of that many datagrams and coalesced reads."""
    src, exe = tmp / "pair.c", tmp / "pair"
    if not exe.exists():
        src.write_text(PAIR_C)
        cc = os.environ.get("CC", "cc")
        subprocess.run([cc, "-O2", "-o", str(exe), str(src)], check=True)
    argv = [str(exe), str(n), str(size), str(segments)]
    got, secs = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()
    return int(got) / float(secs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", default="5000,1000000,10000000,25000000")
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--wide", type=int, default=4096,
                    help="values a packet for the runs where the PS makes every sum")  # fmt: skip
    ap.add_argument("--python-up-to", type=int, default=1_000_000,
                    help="the Python data path only for models up to this size")  # fmt: skip
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks")
    # one rank (internal)
    for a in ("--rank", "--world", "--master", "--one", "--lanes"):
        ap.add_argument(a, type=int)
    for a in ("--mode", "--result", "--ps", "--bind"):
        ap.add_argument(a)
    args = ap.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.world, args.master, args.mode, args.one, args.steps,
                  args.result, args.ps, args.bind, args.lanes)  # fmt: skip
        return
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {load}", flush=True)
    results: dict = {"started": time.time(), "load_at_start": os.getloadavg(), "runs": []}
    from agg_agent.protocol import LANES, check_lanes, packet_bytes

    wide = check_lanes(args.wide, "--wide")
    results["lanes"], results["wide_lanes"] = LANES, wide

    def bare_pairs(when: str) -> None:  # plain and segmented, 32 values and wide
        for lanes in (LANES, wide):
            size = packet_bytes(lanes)
            for kind, segments in (("c", 1), ("gso", min(64, 65000 // size))):
                n = (2_000_000 if lanes == LANES else 200_000) * (4 if segments > 1 else 1)
                rate = bare_pair(tmp, size, n, segments)
                results.setdefault(f"bare_{kind}_packets_per_s_{lanes}", []).append(rate)
                print(f"{when}: bare C pair, {'segmented' if segments > 1 else 'sendmmsg'}, "
                      f"{size} B: {rate:,.0f} pkt/s", flush=True)  # fmt: skip

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        bare_pairs("before")
        for params in (int(p) for p in args.params.split(",")):
            for world in (int(w) for w in args.ranks.split(",")):
                # (mode, values a packet): gloo; the C path at the switch's size and wide,
                # overlapping (`native`) and not (`sync`); the Python reference
                modes = [("gloo", LANES), ("native", LANES), ("native", wide), ("sync", wide)]
                if params <= args.python_up_to:
                    modes.append(("python", LANES))
                row: dict = {"params_wanted": params, "ranks": world}
                for mode, lanes in modes:
                    # steps of milliseconds: more of them for a steady median (not for the
                    # 32-value and Python paths of larger models, whose steps take seconds)
                    fast = mode in ("gloo", "sync") or lanes != LANES
                    steps = max(args.steps, 40) if params <= 100_000 else args.steps
                    if fast and params <= 2_000_000:
                        steps = max(steps, 20)
                    key = mode if mode == "gloo" else f"{mode}{lanes}"
                    r = run(mode, world, params, steps, tmp, lanes)
                    row["params"] = r["params"]
                    row[f"{key}_step_s"] = r["step_s"]
                    row["compute_s"] = r["compute_s"] if mode == "gloo" else row.get("compute_s")
                    if "ps_packets_per_s" in r:
                        row[f"{key}_ps_pkt_s"] = r["ps_packets_per_s"]
                    print(f"{row['params']:>10,} params, {world} ranks, {key:>10}: "
                          f"{r['step_s']:.4f} s/step", flush=True)  # fmt: skip
                results["runs"].append(row)
        bare_pairs("after")
    results["load_at_end"] = os.getloadavg()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "training.json").write_text(json.dumps(results, indent=1))
    table(results)
    plot(results, args.out / "training.png")


def table(results: dict) -> None:
    lanes, wide = results["lanes"], results["wide_lanes"]

    def mean(key: str) -> float:  # before and after the runs
        v = results[key]
        return sum(v) / len(v) if isinstance(v, list) else float(v)

    bare, bare_w = (mean(f"bare_c_packets_per_s_{k}") for k in (lanes, wide))
    seg, seg_w = (mean(f"bare_gso_packets_per_s_{k}") for k in (lanes, wide))
    print(f"\n| parameters | ranks | gloo s/step | hook, {lanes} values / gloo | hook, {wide} "
          f"values s/step | / gloo | no overlap / gloo | Python, {lanes} / gloo | PS pkt/s, "
          f"{lanes} (of bare C: sendmmsg, segmented) | PS pkt/s, {wide} (same) | "
          "all-reduce hidden |\n|---|---|---|---|---|---|---|---|---|---|---|")  # fmt: skip
    for r in results["runs"]:
        g, n32 = r["gloo_step_s"], r[f"native{lanes}_step_s"]
        n, s = r[f"native{wide}_step_s"], r[f"sync{wide}_step_s"]
        py = f"{r[f'python{lanes}_step_s'] / g:.1f}x" if f"python{lanes}_step_s" in r else "—"
        comm = max(1e-12, s - r["compute_s"])  # the all-reduce's own time, not overlapped
        hidden = min(1.0, max(0.0, (s - n) / comm))
        rate, rate_w = r.get(f"native{lanes}_ps_pkt_s", 0.0), r.get(f"native{wide}_ps_pkt_s", 0.0)
        print(f"| {r['params']:,} | {r['ranks']} | {g:.4f} | {n32 / g:.1f}x | {n:.4f} | "
              f"{n / g:.1f}x | {s / g:.1f}x | {py} | {rate:,.0f} ({rate / bare:.2f}, "
              f"{rate / seg:.2f}) | {rate_w:,.0f} ({rate_w / bare_w:.2f}, {rate_w / seg_w:.2f}) "
              f"| {hidden:.0%} |")  # fmt: skip


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for world, marker in ((2, "o"), (4, "s")):
        rows = [r for r in results["runs"] if r["ranks"] == world]
        if not rows:
            continue
        xs = [r["params"] for r in rows]
        lanes, wide = results["lanes"], results["wide_lanes"]
        lines = (
            ("gloo_step_s", "gloo", ":"),
            (f"native{lanes}_step_s", f"hook, {lanes} values", "-."),
            (f"native{wide}_step_s", f"hook, {wide} values", "-"),
            (f"sync{wide}_step_s", f"hook, {wide}, no overlap", "--"),
        )
        for key, label, ls in lines:
            ax.plot(xs, [r[key] for r in rows], ls, marker=marker, label=f"{label}, {world} ranks")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("model parameters")
    ax.set_ylabel("seconds per step (median)")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
