"""Train the digits MLP through bmv2 running our pipeline: workers and the parameter server
in network namespaces, one `simple_switch` between them, three ways side by side:

- *agg*: DDP with `AggregationHook`, job 7 configured at the switch (fan-in = workers):
  every chunk is summed in the switch, the PS completes it and returns the sum;
- *agg, aggregation off*: the same, job 9 with no `agg_job` entry: the chunks reach the
  PS raw (the fallback), the same sums come back;
- *gloo*: DDP's own all-reduce (gloo over TCP through the same switch).

    sudo .venv/bin/python p4/host-agent/benchmarks/train_bmv2.py [--workers 2] \
        [--epochs 40] [--target 0.95] [--out docs/training]

Writes `results.json` and `time_to_accuracy.png` to `--out` and prints the table of
docs/training.md: test accuracy per epoch, training time to `--target`, and the largest
parameter difference against gloo.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))

from agg_agent import p4names as n  # noqa: E402
from agg_agent import train_digits as td  # noqa: E402
from agg_agent.blockfloat import error_bound  # noqa: E402
from agg_agent.protocol import UDP_PORT  # noqa: E402
from p4 import bmv2  # noqa: E402

AGENT = [sys.executable, "-c", "from agg_agent.cli import main; main()"]
ANY = "0&&&0"
MASTER_PORT = 29500
DEADLINE_S = 1800


def fabric(workers: int, prefix: str) -> tuple[bmv2.Bmv2, int]:
    """A switch with hosts 1..workers+1 (the last is the PS), IPv4 forwarding, job 7
    aggregated (fan-in = workers, up to the PS's port), job 9 not."""
    ports = list(range(1, workers + 2))
    ps = ports[-1]
    sw = bmv2.Bmv2(ports, prefix=prefix)
    sw.__enter__()
    for i in ports:
        key = [ANY] * 5 + [f"0x0a0000{i:02x}&&&0xffffffff"] + [ANY] * 3
        sw.cli(f"table_add {n.FWD_TABLE} {n.FWD_SET_EGRESS_PORT} {' '.join(key)} => {i} 10")
    sw.cli(f"table_add {n.AGG_JOB_TABLE} {n.AGG_SET_JOB} 7 => 0 16 {workers} {ps}")
    return sw, ps


def run(
    hosts: bmv2.Hosts,
    workers: int,
    ps_host: int,
    mode: str,
    out: Path,
    epochs: int,
    max_steps: int = 0,
    lr: float = 0.1,
) -> tuple[td.Result, list[dict]]:
    """One training run; its result and the PS's rows (empty for gloo)."""
    job = {"agg": 7, "agg-off": 9}.get(mode)
    ps = None
    if job is not None:
        # The PS prints a line a step: into a file, not a pipe read only at the end (a 64 KiB
        # pipe filled at step 241 of 880 and the PS stopped acknowledging).
        ps_log = out.with_suffix(".ps.log")
        ps = hosts.run(
            ps_host,
            [*AGENT, "ps", "--size", "0", "--job", str(job),
             "--bind", f"10.0.0.{ps_host}:{UDP_PORT}"]
            + [a for w in range(workers) for a in ("--worker-addr", f"10.0.0.{w + 1}:{UDP_PORT}")],
            log=ps_log,
        )  # fmt: skip
        hosts.wait_udp_listening(ps_host, UDP_PORT, ps)
    procs = []
    for r in range(workers):
        argv = [*AGENT, "train", "--rank", str(r), "--world", str(workers), "--master",
                f"10.0.0.1:{MASTER_PORT}", "--epochs", str(epochs), "--lr", str(lr),
                "--max-steps", str(max_steps), "--out", str(out)]  # fmt: skip
        if job is None:
            argv += ["--allreduce", "gloo"]
        else:
            argv += ["--allreduce", "agg", "--job", str(job), "--ps",
                     f"10.0.0.{ps_host}:{UDP_PORT}", "--bind", f"10.0.0.{r + 1}:{UDP_PORT}",
                     "--window", "16", "--timeout-ms", "300"]  # fmt: skip
        procs.append(hosts.run(r + 1, argv))
    rows: list[dict] = []
    try:
        deadline = time.monotonic() + DEADLINE_S
        while any(p.poll() is None for p in procs):  # one failure ends the run at once
            bad = [p for p in procs if p.poll() not in (None, 0)]
            if bad or time.monotonic() > deadline:
                err = bad[0].communicate()[1][-3000:] if bad else "deadline"
                raise RuntimeError(f"{mode}: a worker failed: {err}")
            time.sleep(0.5)
        for p in procs:
            _o, err = p.communicate()
            if p.returncode != 0:
                raise RuntimeError(f"{mode}: a worker failed: {err[-3000:]}")
        if ps is not None:
            ps.terminate()
            ps.wait(timeout=120)
            pout = ps_log.read_text()
            if ps.returncode != 0:
                raise RuntimeError(f"{mode}: the PS failed: {pout[-2000:]}")
            rows = [json.loads(ln) for ln in pout.splitlines() if ln.startswith("{")]
    finally:
        for p in [*procs, *([ps] if ps else [])]:
            if p.poll() is None:
                p.kill()
                p.wait()
    return td.load(out), rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--target", type=float, default=0.95)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "training")
    args = ap.parse_args()
    reason = bmv2.skip_reason()
    if reason:
        raise SystemExit(f"train_bmv2: {reason}")
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"{args.workers} workers, {args.epochs} epochs, {time.strftime('%Y-%m-%d %H:%M UTC')}"
          f", load {' '.join(f'{x:.2f}' for x in __import__('os').getloadavg())}",
          flush=True)  # fmt: skip
    sw, ps_host = fabric(args.workers, f"tb{__import__('os').getpid() % 10000}")
    results: dict[str, dict] = {}
    runs: dict[str, td.Result] = {}
    try:
        with (
            bmv2.Hosts(sw, list(range(1, args.workers + 2))) as hosts,
            tempfile.TemporaryDirectory() as tmp,
        ):
            for mode in ("agg", "agg-off", "gloo"):
                t0 = time.monotonic()
                res, rows = run(hosts, args.workers, ps_host, mode, Path(tmp) / f"{mode}.json",
                                args.epochs)  # fmt: skip
                agg = sum(r["aggregated_packets"] for r in rows)
                raw = sum(r["raw_packets"] for r in rows)
                runs[mode] = res
                results[mode] = {**asdict(res), "wall_s": time.monotonic() - t0,
                                 "aggregated_packets": agg, "raw_packets": raw}  # fmt: skip
                print(f"{mode}: accuracy {res.accuracy[-1][2]:.4f} after {res.steps} steps, "
                      f"{res.seconds:.1f} s training, to {args.target:.0%}: "
                      f"{res.time_to(args.target)}; PS: {agg} aggregated, {raw} raw packets",
                      flush=True)  # fmt: skip
    finally:
        sw.__exit__(None, None, None)
    for mode in ("agg", "agg-off"):
        res = runs[mode]
        results[mode]["max_parameter_difference_vs_gloo"] = td.compare(res, runs["gloo"])
        # what the difference must stay within: the blocks' rounding (lr * bound / W a
        # bucket) and each run's float32 rounding of its update (half an ulp a step)
        top = max(abs(x) for x in res.parameters)
        rounding = sum(error_bound(t, args.workers) for t in res.tops) / args.workers
        results[mode]["rounding_bound_vs_gloo"] = 0.1 * rounding + res.steps * 2.0**-23 * top
    for r in results.values():
        del r["parameters"]  # 4,810 floats a run: compared above, not kept
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print("\n| all-reduce | test accuracy (last epoch) | steps | training time (s) | "
          f"time to {args.target:.0%} (s) | PS: aggregated / raw packets | max parameter "
          "difference vs gloo |\n|---|---|---|---|---|---|---|")  # fmt: skip
    names = {"agg": "ours, aggregation in the switch", "agg-off": "ours, aggregation off (PS only)",
             "gloo": "gloo (PyTorch)"}  # fmt: skip
    for mode in ("agg", "agg-off", "gloo"):
        r = results[mode]
        tt = next((t for _e, t, a in r["accuracy"] if a >= args.target), None)
        diff = r.get("max_parameter_difference_vs_gloo")
        print(f"| {names[mode]} | {r['accuracy'][-1][2]:.4f} | {r['steps']} | {r['seconds']:.1f} "
              f"| {'not reached' if tt is None else f'{tt:.1f}'} "
              f"| {r['aggregated_packets']} / {r['raw_packets']} "
              f"| {'—' if diff is None else f'{diff:.2e}'} |")  # fmt: skip
    plot(results, args.target, args.out / "time_to_accuracy.png")


def plot(results: dict, target: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    styles = {
        "agg": ("ours, aggregation in the switch", "-", "o"),
        "agg-off": ("ours, aggregation off", "--", "s"),
        "gloo": ("gloo", ":", "^"),
    }
    for mode, (label, ls, mk) in styles.items():
        acc = results[mode]["accuracy"]
        ax.plot([t for _e, t, _a in acc], [a for _e, _t, a in acc], ls, marker=mk,
                markersize=3, label=label)  # fmt: skip
    ax.axhline(target, color="grey", linewidth=0.8)
    ax.set_xlabel("training time (s), evaluation excluded")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0, 1)
    ax.set_title("Digits MLP, DDP through bmv2")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
