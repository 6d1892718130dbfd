"""The engine at datacenter scale (issue 33): `engine.solve(instance, "agg")` on fat-trees
k = 32, 48, 64 with 1,000 to 10,000 jobs, each point in a fresh process.

Instances are `agg-optimizer example --fat-tree K --jobs N --seed 3` (written once as JSON).
Each run is a new Python process that loads the instance and solves it once; it reports the
engine's wall time split into its parts (validation, the network's arrays, routing, the
forest, the rest of the model and LP build, HiGHS, the placement document) and its peak RSS
(`getrusage(RUSAGE_SELF).ru_maxrss`, after loading and after the solve). `--src DIR` runs
the same points on another copy of the package as well, interleaved with this one (a
before/after in one run), e.g. the tree before the speed-ups:

    git archive 79b2d17 optimizer-service/src | tar -x -C /tmp/before
    uv run python optimizer-service/benchmarks/scale_bench.py \\
        --src /tmp/before/optimizer-service/src --out docs/benchmarks

Prints a markdown table (median and min-max of --reps runs) and the fitted growth, and
writes PREFIX.json and the plots PREFIX.png, PREFIX-memory.png to --out (--prefix: scale).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
PARTS = ("validate", "network", "routing", "forest", "build_other", "highs", "document", "rest")


def child(path: str) -> None:
    """One measured solve in this fresh process; prints one JSON line."""
    t = time.perf_counter()
    from agg_optimizer.model.documents import Instance
    from agg_optimizer.model.network import Network
    from agg_optimizer.placement import context, engine

    imported = time.perf_counter() - t
    t = time.perf_counter()
    inst = Instance.model_validate_json(Path(path).read_text())
    loaded = time.perf_counter() - t
    rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    spent: dict[str, float] = {}

    def timed(name, fn):  # the same functions in the code before and after the speed-ups
        def run(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0

        return run

    engine.check_instance = timed("validate", engine.check_instance)
    engine.build_placement = timed("document", engine.build_placement)
    context.build_forest = timed("forest", context.build_forest)
    Network.from_instance = classmethod(timed("network", Network.from_instance.__func__))
    if hasattr(Network, "next_hop_rows"):  # since round 7 next_hops is a view of it
        Network.next_hop_rows = timed("routing", Network.next_hop_rows)
    else:
        Network.next_hops = timed("routing", Network.next_hops)

    def once():  # type: ignore[no-untyped-def]
        spent.clear()
        t, c = time.perf_counter(), time.process_time()
        p = engine.solve(inst, "agg")
        total, cpu = time.perf_counter() - t, time.process_time() - c
        st = p.stats
        parts = {k: spent.get(k, 0.0) for k in ("validate", "network", "routing", "forest")}
        parts["build_other"] = st.build_s - parts["routing"] - parts["forest"]
        parts["highs"] = st.solve_s
        parts["document"] = spent.get("document", 0.0)
        parts["rest"] = total - sum(parts.values())
        return p, total, cpu, parts

    p, total, cpu, parts = once()
    st = p.stats
    # The same solve again in this process: what the service's loop pays on every pass once
    # its first solve has loaded what the engine loads once (numba's compiled routing).
    p2, warm_total, _, warm_parts = once()
    if p2.objective_s != p.objective_s:
        raise SystemExit(f"second solve: objective {p2.objective_s} != {p.objective_s}")
    out = {
        "engine_s": total,
        "warm_engine_s": warm_total,
        "warm_parts": warm_parts,
        # CPU time of the solve: since the compiled routing runs on every core (this
        # issue's third speed-up) it is above the wall time on an idle machine; before,
        # the engine ran on one thread and it moved far less than wall time when other
        # work shared the cores
        "engine_cpu_s": cpu,
        "build_s": st.build_s,
        "solve_s": st.solve_s,
        "parts": parts,
        "import_s": imported,
        "load_s": loaded,
        "rss_loaded_mb": rss_loaded,
        "rss_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "columns": st.columns,
        "rows": st.rows,
        "iterations": st.iterations,
        "objective_s": p.objective_s,
        "roots": len(_ps_switches(inst)),
    }
    print(json.dumps(out))


def _ps_switches(inst) -> set[str]:  # type: ignore[no-untyped-def]
    """The switches the jobs' parameter servers hang off (routing's roots)."""
    host = {n.id for n in inst.topology.nodes if n.kind == "host"}
    attach = {}
    for ln in inst.topology.links:
        if ln.src in host:
            attach[ln.src] = ln.dst
        elif ln.dst in host:
            attach[ln.dst] = ln.src
    return {attach[j.ps] for j in inst.jobs}


def write_instance(k: int, n: int, seed: int, folder: Path) -> Path:
    path = folder / f"k{k}-j{n}-s{seed}.json"
    if not path.exists():
        from agg_optimizer.model.examples import example_instance

        inst = example_instance(k, n, seed)
        path.write_text(inst.model_dump_json(exclude_defaults=False))
    return path


def measure(path: Path, src: str | None) -> dict:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    t = time.perf_counter()
    out = subprocess.run(
        [sys.executable, str(HERE), "--child", str(path)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    r = json.loads(out.stdout.strip().splitlines()[-1])
    r["process_s"] = time.perf_counter() - t
    return r


def summary(runs: list[dict], key) -> tuple[float, float, float]:
    v = [key(r) for r in runs]
    return float(np.median(v)), min(v), max(v)


def fmt(m: tuple[float, float, float], scale: float = 1.0, digits: int = 2) -> str:
    med, lo, hi = (x * scale for x in m)
    return f"{med:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"


def fit(xs, ys) -> float:
    """Exponent b of y = a x^b (least squares in log-log)."""
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def report(rows: list[dict]) -> str:
    versions = sorted({r["version"] for r in rows}, key=lambda v: v != "this")
    out = []
    head = (
        "| k | jobs | code | engine s | engine s, 2nd solve | engine CPU s | validate | network "
        "| routing | forest | build rest | HiGHS | document | rest | peak RSS MB | process s "
        "| LP cols x rows |\n|" + "---|" * 17
    )
    out.append(head)
    for r in rows:
        runs = r["runs"]
        med = {p: summary(runs, lambda x, p=p: x["parts"][p])[0] for p in PARTS}
        out.append(
            f"| {r['k']} | {r['jobs']} | {r['version']} | "
            f"{fmt(summary(runs, lambda x: x['engine_s']))} | "
            f"{fmt(summary(runs, lambda x: x['warm_engine_s']))} | "
            f"{fmt(summary(runs, lambda x: x['engine_cpu_s']))} | "
            + " | ".join(f"{med[p]:.2f}" for p in PARTS)
            + f" | {fmt(summary(runs, lambda x: x['rss_peak_mb']), digits=0)} | "
            f"{fmt(summary(runs, lambda x: x['process_s']), digits=1)} | "
            f"{runs[0]['columns']} x {runs[0]['rows']} |"
        )
    out.append("")
    if len(versions) == 2:
        out.append(
            "| k | jobs | engine s, before / after | 2nd solve, before / after "
            "| engine CPU s, before / after | peak RSS MB, before / after "
            "| objective, after vs before |"
        )
        out.append("|---|---|---|---|---|---|---|")
        by = {(r["k"], r["jobs"], r["version"]): r["runs"] for r in rows}
        for k, n in sorted({(r["k"], r["jobs"]) for r in rows}):
            a = summary(by[(k, n, "this")], lambda x: x["engine_s"])[0]
            b = summary(by[(k, n, versions[1])], lambda x: x["engine_s"])[0]
            ma = summary(by[(k, n, "this")], lambda x: x["rss_peak_mb"])[0]
            mb = summary(by[(k, n, versions[1])], lambda x: x["rss_peak_mb"])[0]
            ca = summary(by[(k, n, "this")], lambda x: x["engine_cpu_s"])[0]
            cb = summary(by[(k, n, versions[1])], lambda x: x["engine_cpu_s"])[0]
            wa = summary(by[(k, n, "this")], lambda x: x["warm_engine_s"])[0]
            wb = summary(by[(k, n, versions[1])], lambda x: x["warm_engine_s"])[0]
            oa = {x["objective_s"] for x in by[(k, n, "this")]}
            ob = {x["objective_s"] for x in by[(k, n, versions[1])]}
            if len(oa) > 1 or len(ob) > 1:
                same = "runs differ"
            else:
                rel = (next(iter(oa)) - next(iter(ob))) / abs(next(iter(ob)))
                same = "same" if abs(rel) <= 1e-9 else f"{rel:+.1e}"
            out.append(
                f"| {k} | {n} | {b:.2f} / {a:.2f} = {b / a:.1f}x "
                f"| {wb:.2f} / {wa:.2f} = {wb / wa:.1f}x "
                f"| {cb:.2f} / {ca:.2f} = {cb / ca:.1f}x | {mb:.0f} / {ma:.0f} "
                f"| {same} |"
            )
        out.append("")
    out.append("Growth (y = a x^b, fitted on the medians of engine wall time and peak RSS):")
    for v in versions:
        sel = [r for r in rows if r["version"] == v]
        for k in sorted({r["k"] for r in sel}):
            pts = [r for r in sel if r["k"] == k]
            if len(pts) < 2:
                continue
            xs = [r["jobs"] for r in pts]
            t = [summary(r["runs"], lambda x: x["engine_s"])[0] for r in pts]
            m = [summary(r["runs"], lambda x: x["rss_peak_mb"])[0] for r in pts]
            out.append(
                f"- {v}, k={k}: engine time ~ jobs^{fit(xs, t):.2f}, "
                f"peak RSS ~ jobs^{fit(xs, m):.2f}"
            )
        for n in sorted({r["jobs"] for r in sel}):
            pts = [r for r in sel if r["jobs"] == n]
            if len(pts) < 2:
                continue
            ks = [r["k"] for r in pts]
            t = [summary(r["runs"], lambda x: x["engine_s"])[0] for r in pts]
            m = [summary(r["runs"], lambda x: x["rss_peak_mb"])[0] for r in pts]
            out.append(
                f"- {v}, {n} jobs: engine time ~ k^{fit(ks, t):.2f}, peak RSS ~ k^{fit(ks, m):.2f}"
            )
    return "\n".join(out)


def plot(rows: list[dict], out: Path, prefix: str = "scale") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    versions = sorted({r["version"] for r in rows}, key=lambda v: v != "this")
    style = {v: s for v, s in zip(versions, ("-o", "--s"), strict=False)}
    for what, key, ylabel, name in (
        ("time", lambda x: x["engine_s"], "engine.solve wall time (s)", f"{prefix}.png"),
        (
            "memory",
            lambda x: x["rss_peak_mb"],
            "peak RSS of the process (MB)",
            f"{prefix}-memory.png",
        ),
    ):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for v in versions:
            for k, color in zip((32, 48, 64), ("C0", "C1", "C2"), strict=True):
                pts = sorted((r for r in rows if r["version"] == v and r["k"] == k),
                             key=lambda r: r["jobs"])  # fmt: skip
                if not pts:
                    continue
                s = [summary(r["runs"], key) for r in pts]
                xs = [r["jobs"] for r in pts]
                ax.errorbar(
                    xs,
                    [m for m, _, _ in s],
                    yerr=[[m - lo for m, lo, _ in s], [hi - m for m, _, hi in s]],
                    fmt=style[v],
                    color=color,
                    capsize=3,
                    label=f"k={k}, {v}",
                )
        if what == "time":
            ax.axhline(2.0, color="grey", lw=0.8, ls=":", label="target at k=64, 10k jobs")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("jobs")
        ax.set_ylabel(ylabel)
        ax.set_title(f"AGG on fat-trees, fresh process per run ({what}; median, min-max)")
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--k", type=int, nargs="+", default=[32, 48, 64])
    ap.add_argument("--jobs", type=int, nargs="+", default=[1000, 3000, 10000])
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--src", help="another copy of the package's src/ to run beside this one")
    ap.add_argument("--label", default="before", help="what --src is called in the table")
    ap.add_argument("--instances", type=Path, help="folder for the instance files (kept)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--prefix", default="scale", help="file names in --out: PREFIX.json, ...")
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    folder = args.instances or Path(tempfile.mkdtemp(prefix="scale-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    versions = [("this", None)] + ([(args.label, args.src)] if args.src else [])
    rows = []
    load = [os.getloadavg()]
    for k in args.k:
        for n in args.jobs:
            path = write_instance(k, n, args.seed, folder)
            runs: dict[str, list[dict]] = {v: [] for v, _ in versions}
            for _ in range(args.reps):
                for v, src in versions:  # interleaved: the same load on both
                    runs[v].append(measure(path, src))
                    load.append(os.getloadavg())
            for v, _ in versions:
                rows.append({"k": k, "jobs": n, "version": v, "runs": runs[v]})
                med = summary(runs[v], lambda x: x["engine_s"])
                print(f"k={k} jobs={n} {v}: engine {fmt(med)} s", file=sys.stderr, flush=True)
    text = report(rows)
    loads = np.array(load)
    text += (
        f"\n\nLoad average (1 min) while it ran: {loads[:, 0].min():.2f}-{loads[:, 0].max():.2f}"
        f" (median {np.median(loads[:, 0]):.2f})"
    )
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.prefix}.json").write_text(
            json.dumps({"rows": rows, "load": load}, indent=1) + "\n"
        )
        plot(rows, args.out, args.prefix)


if __name__ == "__main__":
    main()
