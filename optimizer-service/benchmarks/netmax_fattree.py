"""NetMax at fat-tree scale, with background traffic and moving hotspots, from a
convergence model calibrated on real-process runs (issue 19, part b; docs/peers.md).

1. Calibration: time to target = a * J(P; kappa), fitted (non-negative least squares on
   relative error) to the runs in `--runs` (docs/peers/calibration-runs.json: the
   real-process runs of docs/peers.md; `--write-runs` regenerates that file from the
   numbers recorded there). Reports the fit per run, the fit with each policy (and each
   run) left out and predicted, a bootstrap over the runs' seeds, and the fit's error for
   fixed values of kappa.
2. Simulation (`peers_dynamics.simulate`): k=4 (16 workers, one per host) and k=8 (32
   workers, 4 per pod in 2 racks) fat-trees of 10 Gb/s links under 30% Poisson background
   (flow-level, heavy-tailed sizes) and hotspots that move every second onto links routing
   cannot avoid; 100 MB models; exchange times from `peers.pair_times` on each 125 ms of
   telemetry. Progress accrues at 1 / (a J) for every policy; NetMax re-plans every second,
   one telemetry interval after the hotspots move. Every seed draws other background and
   hotspots; speed-ups are paired by seed.

   Several worlds: the calibrated (a, kappa), and each kappa of `--alt-kappas` with a
   refitted (a consensus cost the calibration does not support, as a stress test: the
   report gives how much worse each fits the runs).

Writes fattree-results.md / .json and the plots into `--out`; progress on stderr.

    nice -n 19 .venv/bin/python optimizer-service/benchmarks/netmax_fattree.py --seeds 20

(14 min on 2 shared cores). Variants in docs/peers (`--tag` names the files):
`--load 0 --tag hotspots-only` (6 min), `--fabrics k4 --replan-every 0.125 --tag
replan-every-interval` (9 min), `--fabrics k4 --compute 0.2 --tag compute-0.2s` (5 min).
"""

from __future__ import annotations

import os

# One BLAS thread: the eigenvalue problems are 16x16 to 32x32, where OpenBLAS's threads
# cost 5-70x more than they save (and the machine's other work wants the second core).
for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import replace  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from scipy import stats  # noqa: E402

from agg_optimizer.peers import calibration as pcal  # noqa: E402
from agg_optimizer.peers import dynamics as pdyn  # noqa: E402
from agg_optimizer.peers import selection as peers  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "peers"

# The real-process runs of docs/peers.md ("Measured with real processes"): 8 workers, two
# racks of 4, 0.4 Mbit/s inside a rack and 0.04 across, 200 features of float64 (1.6 kB).
NETNS_MEASURED = {
    "adpsgd": ("adpsgd", None, [27.3, 28.6, 25.6]),
    "netmax (kappa 1)": ("netmax", 1.0, [14.5, 12.2, 12.1]),
    "netmax (kappa 0.1)": ("netmax", 0.1, [7.7, 6.3, 6.9]),
    "allreduce": ("allreduce", None, [86.0, 86.1, 79.4]),
}


def netns_runs(fast: float = 0.4, slow: float = 0.04, features: int = 200) -> list[pcal.Run]:
    """The runs, with the pair times and plans `netmax_netns.py` computes."""
    n = 8
    bits = 8.0 * 8 * features
    t = np.array(
        [
            [
                bits / ((fast if (i < n // 2) == (m < n // 2) else slow) * 1e6)
                if i != m
                else np.inf
                for m in range(n)
            ]
            for i in range(n)
        ]
    )
    names = [f"w{i}" for i in range(n)]
    out = []
    for label, (policy, kappa, measured) in NETNS_MEASURED.items():
        p = None
        if policy in pdyn.GOSSIP:
            p = peers.plan(policy, names, t, kappa=kappa or peers.DEFAULT_KAPPA).probabilities
        out.append(pcal.Run(f"netns two racks: {label}", policy, t, 0.0, p, measured))
    return out


FABRICS = {
    "k4": pdyn.FatTreeScenario(name="k4", k=4, hotspots=2),
    "k8": pdyn.FatTreeScenario(name="k8", k=8, hotspots=4),
}


def ci(x: np.ndarray) -> float:
    """Half-width of the 95% confidence interval of the mean (t distribution)."""
    if len(x) < 2:
        return math.nan
    return float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))


def summarise(per_seed: list[dict], world: str, policies: list[str]) -> list[dict]:
    rows = []
    for p in policies:
        t = np.array([s[world][p]["time_s"] for s in per_seed])
        fin = sum(s[world][p]["finished"] for s in per_seed)
        row = {
            "policy": p,
            "time_s": float(t.mean()),
            "time_ci": ci(t),
            "finished": fin,
            "seeds": len(t),
        }
        for ref in ("adpsgd", "allreduce"):
            base = np.array([s[world][ref]["time_s"] for s in per_seed])
            sp = base / t
            row[f"vs_{ref}"] = float(sp.mean())
            row[f"vs_{ref}_ci"] = ci(sp)
            row[f"vs_{ref}_min"] = float(sp.min())
            row[f"vs_{ref}_max"] = float(sp.max())
        rows.append(row)
    return rows


def pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def calibration_md(cal: pcal.Calibration, loo_p: list, loo_r: list, boot: dict, prof: list) -> str:
    out = [
        f"Fit: **a = {cal.a:.1f}, kappa = {cal.kappa:.3g}** (RMS relative error "
        f"{100 * cal.rms_rel_error:.1f}%).",
        "",
        "| run | policy | measured (s, mean) | fitted (s) | error |",
        "|---|---|---|---|---|",
    ]
    for r in cal.rows:
        out.append(
            f"| {r['label']} | {r['policy']} | {r['measured_s']:.1f} "
            f"| {r['predicted_s']:.1f} | {pct(r['rel_error'])} |"
        )
    out += [
        "",
        "Leave one out (fit without, predict it):",
        "",
        "| left out | fit a | fit kappa | run predicted | measured (s) | predicted (s) | error |",
        "|---|---|---|---|---|---|---|",
    ]
    for fold in [*loo_p, *loo_r]:
        if "error" in fold:
            out.append(f"| {fold['left_out']} | - | - | ({fold['error']}) | | | |")
            continue
        for r in fold["rows"]:
            out.append(
                f"| {fold['left_out']} | {fold['a']:.1f} | {fold['kappa']:.3g} "
                f"| {r['label']} | {r['measured_s']:.1f} | {r['predicted_s']:.1f} "
                f"| {pct(r['rel_error'])} |"
            )
    out += [
        "",
        f"Bootstrap over the seeds of every run ({boot['resamples']} resamples): "
        f"kappa {boot['kappa'][1]:.3g} (95%: {boot['kappa'][0]:.3g}-{boot['kappa'][2]:.3g}),"
        f" at its bound 0 in {100 * boot['kappa_zero_share']:.1f}% of the fits; "
        f"a {boot['a'][1]:.0f} ({boot['a'][0]:.0f}-{boot['a'][2]:.0f}).",
        "",
        "The fit with kappa fixed (a refitted):",
        "",
        "| kappa | a | RMS error | "
        + " | ".join(r["label"].split(": ")[-1] for r in cal.rows)
        + " |",
        "|---|---|---|" + "---|" * len(cal.rows),
    ]
    for p in prof:
        out.append(
            f"| {p['kappa']:g} | {p['a']:.1f} | {100 * p['rms_rel_error']:.1f}% | "
            + " | ".join(pct(v) for v in p["rows"].values())
            + " |"
        )
    return "\n".join(out)


def table_md(rows: list[dict]) -> str:
    out = [
        "| policy | time to target (s) | ±95% | speed-up vs adpsgd (95% CI) [min-max] "
        "| speed-up vs allreduce (95% CI) [min-max] |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        flag = (
            ""
            if r["finished"] == r["seeds"]
            else f" (extrapolated in {r['seeds'] - r['finished']}/{r['seeds']})"
        )
        cells = []
        for ref in ("adpsgd", "allreduce"):
            m, h = r[f"vs_{ref}"], r[f"vs_{ref}_ci"]
            cells.append(
                f"{m:.2f}x ({m - h:.2f}-{m + h:.2f}) [{r[f'vs_{ref}_min']:.2f}-"
                f"{r[f'vs_{ref}_max']:.2f}]"
            )
        out.append(
            f"| {r['policy']}{flag} | {r['time_s']:.1f} | {r['time_ci']:.1f} "
            f"| {cells[0]} | {cells[1]} |"
        )
    return "\n".join(out)


def finite(x: object) -> object:
    """JSON without Infinity/NaN: null instead."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [finite(v) for v in x]
    return x


def plots(
    out: Path, tag: str, summary: dict, traces: dict, cal: pcal.Calibration, loo: list
) -> None:
    """Speed-ups with CIs, one seed's timeline per fabric, and (untagged runs) the fit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure
    from PIL import Image  # matplotlib's own dependency

    def save(fig: Figure, name: str) -> None:
        path = out / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        # 64 colours: a third of the bytes, the same picture
        Image.open(path).convert("RGB").quantize(64).save(path, optimize=True)

    worlds = list(summary)
    fabrics = list(summary[worlds[0]])
    pols = [r["policy"] for r in summary[worlds[0]][fabrics[0]]]
    fig, axes = plt.subplots(len(worlds), 2, figsize=(13, 4.2 * len(worlds)), squeeze=False)
    width = 0.8 / len(fabrics)
    for wi, w in enumerate(worlds):
        for ci_, (ref, goal) in enumerate((("adpsgd", 1.9), ("allreduce", 3.4))):
            ax = axes[wi][ci_]
            for fi, f in enumerate(fabrics):
                rows = {r["policy"]: r for r in summary[w][f]}
                m = np.array([rows[p][f"vs_{ref}"] for p in pols])
                h = np.array([rows[p][f"vs_{ref}_ci"] for p in pols])
                x = np.arange(len(pols)) + (fi - (len(fabrics) - 1) / 2) * width
                ax.bar(x, m, width, yerr=h, capsize=3, label=f)
            ax.axhline(1.0, color="grey", lw=0.8)
            ax.axhline(goal, color="red", ls="--", lw=0.8, label=f"paper's {goal}x")
            ax.set_yscale("log")
            ax.set_xticks(np.arange(len(pols)))
            ax.set_xticklabels(pols, rotation=30, ha="right", fontsize=8)
            ax.set_ylabel(f"speed-up vs {ref} (x, 95% CI)")
            ax.set_title(f"{w}: time to target, {ref} / policy", fontsize=10)
            ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, f"fattree-speedups{tag}.png")

    for f, tr in traces.items():
        fig, (ax, bx) = plt.subplots(
            2, 1, figsize=(11, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1.3]}
        )
        w = worlds[0]
        ends = np.array([e for e, _ in tr["trace"]])
        # up to a little after AD-PSGD's target: the hotspot moves stay visible
        stop = min(ends[-1], 1.25 * tr["outcomes"][w]["adpsgd"]["time_s"])
        keep = ends <= stop
        for p in tr["outcomes"][w]:
            y = np.array([pr[w][p] for _, pr in tr["trace"]])
            ls = ":" if "static" in p else "-"
            ax.plot(ends[keep], np.minimum(y[keep], 1.0), ls, label=p)
        for tm, _ in tr["moves"]:
            if 0 <= tm <= stop:
                ax.axvline(tm, color="grey", lw=0.5, alpha=0.5)
                bx.axvline(tm, color="grey", lw=0.5, alpha=0.5)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_ylabel("progress to the target loss")
        ax.set_title(f"{f}, seed {tr['seed']} ({w} model); grey lines: hotspots move", fontsize=10)
        ax.legend(fontsize=8, ncol=2)
        sp = np.array(tr["spread"])
        k = sp[:, 0] <= stop
        bx.plot(sp[k, 0], sp[k, 3], label="fastest pair")
        bx.plot(sp[k, 0], sp[k, 1], label="median pair")
        bx.plot(sp[k, 0], sp[k, 2], label="slowest pair")
        bx.set_yscale("log")
        bx.set_ylabel("exchange time (s)")
        bx.set_xlabel("time (s)")
        bx.legend(fontsize=8, ncol=3)
        fig.tight_layout()
        save(fig, f"fattree-timeline-{f}{tag}.png")

    if tag:
        return  # the same calibration as the untagged run's
    fig, ax = plt.subplots(figsize=(8, 4))
    labels = [r["label"].split(": ")[-1] for r in cal.rows]
    x = np.arange(len(labels))
    ax.bar(x - 0.25, [r["measured_s"] for r in cal.rows], 0.25, label="measured (mean of seeds)")
    ax.bar(x, [r["predicted_s"] for r in cal.rows], 0.25, label="fit on all runs")
    pred = {r["label"]: r["predicted_s"] for fold in loo if "rows" in fold for r in fold["rows"]}
    ax.bar(
        x + 0.25,
        [pred.get(r["label"], np.nan) for r in cal.rows],
        0.25,
        label="fit without the policy (predicted)",
    )
    ax.set_xticks(x)
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("time to target (s)")
    ax.set_title(f"calibration: a = {cal.a:.0f}, kappa = {cal.kappa:.3g}", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, "calibration.png")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=Path, default=DOCS / "calibration-runs.json")
    ap.add_argument(
        "--write-runs",
        action="store_true",
        help="write --runs from the real-process results of docs/peers.md first",
    )
    ap.add_argument("--out", type=Path, default=DOCS)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--fabrics", default="k4,k8")
    ap.add_argument("--plan-kappas", default="0.1,1", help="NetMax's own kappa when planning")
    ap.add_argument(
        "--alt-kappas",
        default="0.1,1",
        help="more worlds: these kappas, a refitted ('' for none)",
    )
    ap.add_argument("--period", type=float, help="hotspot period (s), default 1")
    ap.add_argument("--compute", type=float, help="compute per iteration (s), default 0")
    ap.add_argument("--load", type=float, help="background load, default 0.3")
    ap.add_argument("--hotspots", type=int, help="default 2 (k4), 4 (k8)")
    ap.add_argument("--replan-every", type=float, help="NetMax re-plans (s), default the period")
    ap.add_argument("--netmax-iters", type=int, default=100)
    ap.add_argument("--trace-seed", type=int, default=0)
    ap.add_argument("--tag", default="", help="suffix of the output files")
    args = ap.parse_args()
    t_start = time.perf_counter()

    if args.write_runs:
        args.runs.parent.mkdir(parents=True, exist_ok=True)
        doc = pcal.runs_json(
            netns_runs(),
            source="docs/peers.md, 'Measured with real processes' (netmax_netns.py): 8 "
            "workers in network namespaces, two racks of 4, 0.4 Mbit/s inside a rack and "
            "0.04 across, 200-feature float64 models (1.6 kB); t = bits / rate; plans from "
            "peers.plan with compute_s 0; measured_s: time until every worker's model is "
            "95% of the way to the optimum, per seed (0, 1, 2)",
        )
        text = json.dumps(doc, indent=1)
        # one line per matrix row
        text = re.sub(
            r"\[\s+([^\[\]{}]*?)\s+\]", lambda m: "[" + re.sub(r",\s+", ", ", m[1]) + "]", text
        )
        args.runs.write_text(text + "\n")
        print(f"wrote {args.runs}", file=sys.stderr)
    runs = pcal.load_runs(args.runs)
    cal = pcal.calibrate(runs)
    loo_p = pcal.leave_one_out(runs, "policy")
    several = {r.policy for r in runs if sum(q.policy == r.policy for q in runs) > 1}
    # each run of a policy with several (a policy with one run is a fold of loo_p already)
    loo_r = [
        f
        for f in pcal.leave_one_out(runs, "label")
        if next(r.policy for r in runs if r.label == f["left_out"]) in several
    ]
    boot = pcal.bootstrap(runs)
    prof = pcal.kappa_profile(runs, [0.0, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0])
    cal_md = calibration_md(cal, loo_p, loo_r, boot, prof)
    print("## Calibration\n\n" + cal_md + "\n")

    worlds = {f"calibrated (a {cal.a:.0f}, kappa {cal.kappa:.3g})": (cal.a, cal.kappa)}
    for k in [float(x) for x in args.alt_kappas.split(",") if x]:
        alt = pcal.calibrate(runs, kappa=k)
        worlds[
            f"kappa {alt.kappa:g} (a {alt.a:.0f} refitted, RMS error "
            f"{100 * alt.rms_rel_error:.0f}%)"
        ] = (alt.a, alt.kappa)
    policies = pdyn.default_policies([float(k) for k in args.plan_kappas.split(",")])
    names = [p.name for p in policies]

    per_fabric: dict[str, list[dict]] = {}
    traces: dict[str, dict] = {}
    scenarios = {}
    for f in args.fabrics.split(","):
        change = {
            "period_s": args.period,
            "compute_s": args.compute,
            "background_load": args.load,
            "hotspots": args.hotspots,
            "replan_every_s": args.replan_every,
        }
        scn = replace(FABRICS[f], **{k: v for k, v in change.items() if v is not None})
        scenarios[f] = scn.as_json() | {"workers": len(scn.workers())}
        per_fabric[f] = []
        for seed in range(args.seeds):
            r = pdyn.simulate(
                scn,
                seed,
                worlds,
                policies,
                netmax_iters=args.netmax_iters,
                keep_trace=seed == args.trace_seed,
            )
            row = {
                w: {
                    p: {"time_s": o.time_s, "finished": o.finished, "replans": o.replans}
                    for p, o in r.outcomes[w].items()
                }
                for w in worlds
            }
            per_fabric[f].append(row)
            if seed == args.trace_seed:
                traces[f] = {
                    "seed": seed,
                    "trace": r.trace,
                    "spread": r.spread,
                    "moves": r.moves,
                    "outcomes": row,
                }
            w0 = next(iter(worlds))
            brief = ", ".join(
                f"{p} {row[w0][p]['time_s']:.1f} s"
                for p in names
                if "static" not in p and p not in ("ps", "prague")
            )
            print(
                f"{f} seed {seed}: {r.wall_s:.0f} s wall, {r.simulated_s:.0f} s simulated; {brief}",
                file=sys.stderr,
            )

    summary = {w: {f: summarise(per_fabric[f], w, names) for f in per_fabric} for w in worlds}
    wall = time.perf_counter() - t_start
    md = [
        "# NetMax on fat-trees with moving hotspots (generated by "
        "`optimizer-service/benchmarks/netmax_fattree.py`)",
        "",
        f"`{' '.join(['netmax_fattree.py', *sys.argv[1:]])}`: {wall / 60:.1f} min.",
        "",
        "## Calibration",
        "",
        cal_md,
        "",
    ]
    for w in worlds:
        for f in per_fabric:
            s = scenarios[f]
            md += [
                f"## {f}: {s['workers']} workers, {s['hotspots']} hotspots, world {w}",
                "",
                f"{args.seeds} seeds; period {s['period_s']:g} s, telemetry every "
                f"{s['interval_s']:g} s, compute {s['compute_s']:g} s, background load "
                f"{s['background_load']:g}, {s['model_bytes'] / 1e6:g} MB models.",
                "",
                table_md(summary[w][f]),
                "",
            ]
    print("\n".join(md[6:]))
    args.out.mkdir(parents=True, exist_ok=True)
    tag = f"-{args.tag}" if args.tag else ""
    (args.out / f"fattree-results{tag}.md").write_text("\n".join(md))
    doc = {
        "command": " ".join(["netmax_fattree.py", *sys.argv[1:]]),
        "wall_s": wall,
        "runs_file": str(
            args.runs.relative_to(ROOT) if args.runs.is_relative_to(ROOT) else args.runs
        ),
        "calibration": cal.as_json(),
        "leave_one_out": {"policy": loo_p, "run": loo_r},
        "bootstrap": boot,
        "kappa_profile": prof,
        "worlds": {w: {"a": a, "kappa": k} for w, (a, k) in worlds.items()},
        "scenarios": scenarios,
        "policies": [p.__dict__ for p in policies],
        "summary": summary,
        "per_seed": per_fabric,
        "hotspot_moves_trace_seed": {f: tr["moves"] for f, tr in traces.items()},
    }
    (args.out / f"fattree-results{tag}.json").write_text(json.dumps(finite(doc), indent=1) + "\n")
    plots(args.out, tag, summary, traces, cal, loo_p)
    print(
        f"wrote {args.out}/fattree-results{tag}.md, .json and plots; {wall / 60:.1f} min",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
