"""Experiments: every strategy of a scenario on every seed, summarised with confidence
intervals over seeds, and plotted.

Statistics. A run (one strategy, one seed) yields one CCT per job iteration. Its mean, p95
and p99 are the run's statistics; a strategy's figure is their mean over seeds with a 95%
Student-t interval over seeds. Reductions are paired: for each seed, AGG against the other
strategy on the same jobs and background, then averaged over seeds with their own interval.
"milp" is the exact optimum of AGG's own surrogate, an oracle rather than a published
strategy, so it is reported but never counted among the baselines. "floor" is the network
bound of streaming aggregation (every job as if the fabric between its workers' uplinks and
its PS's downlink were infinite): no placement beats it, so 1 - floor/best baseline is the
largest reduction against the best baseline that any strategy could reach in the scenario.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from scipy import stats

from agg_optimizer.evaluation.scenario import COMPUTE_S, RunResult, Scenario, run
from agg_optimizer.model.documents import Instance, Placement
from agg_optimizer.sim.training import IterationRecord, time_to_accuracy

OURS = "agg"
FLOOR = "floor"
NOT_BASELINES = frozenset({"agg", "milp", FLOOR, "greedy-rr", "agg-mm", "agg-own"})
LABELS = {
    "milp": "oracle of AGG's surrogate, not a baseline",
    "greedy-rr": "ablation: INT-greedy with AGG's re-routing, not a baseline",
    "agg-mm": "AGG with the bottleneck objective first, not a baseline",
    "agg-own": "ablation: AGG re-routing around its own funnels only, not a baseline",
    FLOOR: "network bound: no placement does better",
}


def _run(args: tuple[Scenario, str, int, Path | None]) -> RunResult:
    scenario, strategy, seed, keep = args
    if keep is None:
        return run(scenario, strategy, seed)
    where = keep / scenario.name / strategy / f"seed{seed}"
    where.mkdir(parents=True, exist_ok=True)
    index: list[dict] = []

    def save(t: float, inst: Instance, p: Placement) -> None:
        n = len(index)
        (where / f"{n:03d}-instance.json").write_text(inst.model_dump_json(indent=1))
        (where / f"{n:03d}-placement.json").write_text(p.model_dump_json(indent=1))
        index.append({"n": n, "t_s": t, "jobs": [j.id for j in inst.jobs]})

    result = run(scenario, strategy, seed, on_placement=save)
    (where / "index.json").write_text(json.dumps(index, indent=1))
    return result


def run_all(
    scenario: Scenario,
    seeds: int,
    *,
    processes: int = 1,
    on_done: Callable[[RunResult], None] | None = None,
    keep: Path | None = None,
) -> list[RunResult]:
    """Every (strategy, seed) of the scenario; `processes` > 1 runs them side by side.
    `keep`: a directory where every placement's instance and placement document are written
    (KEEP/scenario/strategy/seedN/NNN-{instance,placement}.json, and index.json with the
    simulated time of each), so results can be re-checked outside the simulator."""
    tasks = [(scenario, s, seed, keep) for seed in range(seeds) for s in scenario.strategies]
    results: list[RunResult] = []
    if processes <= 1:
        for t in tasks:
            results.append(_run(t))
            if on_done:
                on_done(results[-1])
    else:
        with ProcessPoolExecutor(max_workers=processes) as pool:
            for fut in as_completed([pool.submit(_run, t) for t in tasks]):
                results.append(fut.result())
                if on_done:
                    on_done(results[-1])
    order = {s: i for i, s in enumerate(scenario.strategies)}
    results.sort(key=lambda r: (r.seed, order[r.strategy]))
    return results


@dataclass
class Interval:
    mean: float
    lo: float
    hi: float

    @classmethod
    def of(cls, values: list[float] | np.ndarray) -> Interval:
        v = np.asarray(values, dtype=float)
        m = float(v.mean())
        if v.size < 2 or float(v.std()) == 0.0:
            return cls(m, m, m)
        half = float(stats.t.ppf(0.975, v.size - 1) * v.std(ddof=1) / np.sqrt(v.size))
        return cls(m, m - half, m + half)

    def fmt(self, scale: float = 1.0, unit: str = "") -> str:
        return f"{self.mean * scale:.3g}{unit} [{self.lo * scale:.3g}, {self.hi * scale:.3g}]"


@dataclass
class StrategySummary:
    strategy: str
    mean: Interval
    p95: Interval
    p99: Interval
    iterations: int
    wall_s: float
    # Mean completion time of the background flows finished in the run (what priorities
    # for training traffic cost everything else)
    bg_fct: Interval | None = None
    # Mean stage completion time of hyper-parameter search cojobs (scenarios with cojobs)
    sct: Interval | None = None
    # Mean time from arrival to 90% / 95% of converged accuracy (`training.time_to_accuracy`)
    tta90: Interval | None = None
    tta95: Interval | None = None


@dataclass
class Summary:
    scenario: str
    seeds: int
    strategies: list[StrategySummary]
    best_baseline: str | None
    vs_ps: Interval | None
    vs_average: Interval | None
    vs_best: Interval | None
    separated_from_best: bool | None  # AGG's interval entirely below the best baseline's
    vs_each: dict[str, Interval] | None = None  # paired reduction against every strategy
    # 1 - floor / best baseline: the most any strategy could gain on the best baseline
    headroom_vs_best: Interval | None = None
    above_floor: Interval | None = None  # AGG / floor - 1

    def to_dict(self) -> dict:
        return asdict(self)


def _per_seed(results: list[RunResult]) -> dict[str, dict[int, np.ndarray]]:
    out: dict[str, dict[int, np.ndarray]] = {}
    for r in results:
        out.setdefault(r.strategy, {})[r.seed] = r.ccts()
    return out


def _tta(results: list[RunResult], fraction: float) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in results:
        # the scenario's iterations: what the jobs that ran to the end did
        iterations = max((x.iteration for x in r.records), default=0) + 1
        times = time_to_accuracy(r.records, iterations, fraction, COMPUTE_S)
        if times:
            out.setdefault(r.strategy, []).append(float(np.mean(times)))
    return out


def summarise(scenario: str, results: list[RunResult]) -> Summary:
    by = _per_seed(results)
    tta90, tta95 = _tta(results, 0.90), _tta(results, 0.95)
    seeds = sorted({r.seed for r in results})
    wall: dict[str, float] = {}
    bg: dict[str, list[float]] = {}
    sct: dict[str, list[float]] = {}
    for r in results:
        if r.stages:
            sct.setdefault(r.strategy, []).append(float(np.mean([x["sct_s"] for x in r.stages])))
        wall[r.strategy] = wall.get(r.strategy, 0.0) + r.wall_s
        if r.bg_finished:
            bg.setdefault(r.strategy, []).append(r.bg_fct_mean_s)
    rows = []
    for s, per in by.items():
        rows.append(
            StrategySummary(
                strategy=s,
                mean=Interval.of([per[k].mean() for k in seeds]),
                p95=Interval.of([np.percentile(per[k], 95) for k in seeds]),
                p99=Interval.of([np.percentile(per[k], 99) for k in seeds]),
                iterations=int(sum(per[k].size for k in seeds)),
                wall_s=wall[s],
                bg_fct=Interval.of(bg[s]) if s in bg else None,
                sct=Interval.of(sct[s]) if s in sct else None,
                tta90=Interval.of(tta90[s]) if s in tta90 else None,
                tta95=Interval.of(tta95[s]) if s in tta95 else None,
            )
        )
    rows.sort(key=lambda x: x.mean.mean)
    baselines = [x for x in rows if _is_baseline(x.strategy)]
    if OURS not in by or not baselines:
        return Summary(scenario, len(seeds), rows, None, None, None, None, None)
    ours = {k: by[OURS][k].mean() for k in seeds}
    best = baselines[0]
    vs_ps = Interval.of([1 - ours[k] / by["ps"][k].mean() for k in seeds]) if "ps" in by else None
    vs_avg = Interval.of(
        [1 - ours[k] / np.mean([by[b.strategy][k].mean() for b in baselines]) for k in seeds]
    )
    vs_best = Interval.of([1 - ours[k] / by[best.strategy][k].mean() for k in seeds])
    agg_row = next(x for x in rows if x.strategy == OURS)
    vs_each = {
        x.strategy: Interval.of([1 - ours[k] / by[x.strategy][k].mean() for k in seeds])
        for x in rows
        if x.strategy != OURS
    }
    headroom = above_floor = None
    if FLOOR in by:
        floor = {k: by[FLOOR][k].mean() for k in seeds}
        headroom = Interval.of([1 - floor[k] / by[best.strategy][k].mean() for k in seeds])
        above_floor = Interval.of([ours[k] / floor[k] - 1 for k in seeds])
    return Summary(
        scenario=scenario,
        seeds=len(seeds),
        strategies=rows,
        best_baseline=best.strategy,
        vs_ps=vs_ps,
        vs_average=vs_avg,
        vs_best=vs_best,
        separated_from_best=agg_row.mean.hi < best.mean.lo,
        vs_each=vs_each,
        headroom_vs_best=headroom,
        above_floor=above_floor,
    )


def markdown(summary: Summary, scenario: Scenario) -> str:
    staged = any(r.sct is not None for r in summary.strategies)
    # time to accuracy: where scheduling policies are compared
    tta = any("+" in r.strategy for r in summary.strategies)
    lines = [
        f"### Scenario `{summary.scenario}` ({summary.seeds} seeds)",
        "",
        scenario.description or "",
        "",
        "| strategy | mean CCT (s) [95% CI] | p95 (s) | p99 (s) | iterations | sim wall (s) "
        "| background FCT (s) |"
        + (" mean SCT (s) |" if staged else "")
        + (" to 90% acc. (s) | to 95% acc. (s) |" if tta else ""),
        "|---|---|---|---|---|---|---|" + ("---|" if staged else "") + ("---|---|" if tta else ""),
    ]
    for r in summary.strategies:
        name = f"**{r.strategy}**" if r.strategy == OURS else r.strategy
        if r.strategy in LABELS:
            name += f" ({LABELS[r.strategy]})"
        lines.append(
            f"| {name} | {r.mean.fmt()} | {r.p95.fmt()} | {r.p99.fmt()} | {r.iterations} "
            f"| {r.wall_s:.0f} | {r.bg_fct.fmt() if r.bg_fct else '-'} |"
            + (f" {r.sct.fmt() if r.sct else '-'} |" if staged else "")
            + (
                f" {r.tta90.fmt() if r.tta90 else '-'} | {r.tta95.fmt() if r.tta95 else '-'} |"
                if tta
                else ""
            )
        )
    lines.append("")
    if summary.vs_average is not None:
        assert summary.vs_best is not None
        lines += [
            "AGG's mean CCT reduction (paired by seed, 95% CI):",
            "",
            f"- vs PS-only: {summary.vs_ps.fmt(100, '%') if summary.vs_ps else 'n/a'}",
            f"- vs the average of the {len(_baselines(summary))} baselines: "
            f"{summary.vs_average.fmt(100, '%')} (target: at least 40%)",
            f"- vs the best baseline (`{summary.best_baseline}`): "
            f"{summary.vs_best.fmt(100, '%')} (target: at least 30%); confidence intervals of "
            f"the means {'do not overlap' if summary.separated_from_best else 'overlap'}",
        ]
        if summary.headroom_vs_best is not None and summary.above_floor is not None:
            lines += [
                f"- the network bound (`{FLOOR}`) is {summary.headroom_vs_best.fmt(100, '%')} "
                f"below the best baseline: no strategy can reduce its mean CCT by more here; "
                f"AGG is {summary.above_floor.fmt(100, '%')} above the bound",
            ]
        lines.append("")
    if summary.vs_each:
        lines += ["| AGG's reduction of mean CCT against | paired by seed [95% CI] |", "|---|---|"]
        for name, iv in summary.vs_each.items():
            lines.append(f"| {name} | {iv.fmt(100, '%')} |")
        lines.append("")
    return "\n".join(lines)


def _is_baseline(strategy: str) -> bool:
    """Placement strategies of others; not ours, the references, or STRATEGY+POLICY runs
    (placement plus our scheduling)."""
    return strategy not in NOT_BASELINES and "+" not in strategy


def _baselines(summary: Summary) -> list[str]:
    return [r.strategy for r in summary.strategies if _is_baseline(r.strategy)]


def plot(
    results_by_scenario: dict[str, list[RunResult]],
    out: Path,
    summaries: dict[str, Summary] | None = None,
) -> list[Path]:
    """CCT CDF per strategy (one figure per scenario) and, for several scenarios, mean CCT
    relative to PS-only per scenario as grouped bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    for name, results in results_by_scenario.items():
        by: dict[str, list[float]] = {}
        for r in results:
            by.setdefault(r.strategy, []).extend(r.ccts().tolist())
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for s, v in sorted(by.items(), key=lambda kv: np.mean(kv[1])):
            x = np.sort(v)
            y = np.arange(1, x.size + 1) / x.size
            ax.step(x, y, where="post", label=s, linewidth=2.4 if s == OURS else 1.2)
        ax.set_xscale("log")
        ax.set_xlabel("iteration CCT (s, log scale)")
        ax.set_ylabel("fraction of iterations")
        ax.set_title(f"CCT CDF, scenario {name}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, ncol=2)
        fig.tight_layout()
        path = out / f"cdf-{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        files.append(path)
    if len(results_by_scenario) > 1:
        names = list(results_by_scenario)
        strategies: list[str] = []
        for res in results_by_scenario.values():
            for r in res:
                if r.strategy not in strategies:
                    strategies.append(r.strategy)
        rel = np.full((len(strategies), len(names)), np.nan)
        for j, n in enumerate(names):
            summ = (summaries or {}).get(n) or summarise(n, results_by_scenario[n])
            means = {r.strategy: r.mean.mean for r in summ.strategies}
            ps = means.get("ps")
            for i, s in enumerate(strategies):
                if s in means and ps:
                    rel[i, j] = means[s] / ps
        fig, ax = plt.subplots(figsize=(max(7, 1.3 * len(names)), 4.5))
        width = 0.8 / len(strategies)
        xs = np.arange(len(names))
        for i, s in enumerate(strategies):
            ax.bar(xs + i * width - 0.4 + width / 2, rel[i], width, label=s)
        ax.set_xticks(xs, names, rotation=20, ha="right")
        ax.set_ylabel("mean CCT / PS-only mean CCT")
        ax.set_title("Mean iteration CCT relative to PS-only, per scenario")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, ncol=5)
        fig.tight_layout()
        path = out / "bars.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        files.append(path)
    return files


def overview(summaries: list[Summary]) -> str:
    """One row per scenario: AGG against PS-only, the baselines' average and the best."""
    lines = [
        "| scenario | seeds | AGG mean CCT (s) | best baseline (mean s) | vs PS-only "
        "| vs baselines' average | vs best baseline |",
        "|---|---|---|---|---|---|---|",
    ]
    for sm in summaries:
        agg = next((r for r in sm.strategies if r.strategy == OURS), None)
        if agg is None or sm.vs_average is None or sm.vs_best is None:
            continue
        best = next(r for r in sm.strategies if r.strategy == sm.best_baseline)
        ps = sm.vs_ps.fmt(100, "%") if sm.vs_ps else "n/a"
        lines.append(
            f"| {sm.scenario} | {sm.seeds} | {agg.mean.mean:.3g} | {best.strategy} "
            f"({best.mean.mean:.3g}) | {ps} | {sm.vs_average.fmt(100, '%')} "
            f"| {sm.vs_best.fmt(100, '%')} |"
        )
    return "\n".join(lines)


def write_results(
    out: Path, scenarios: dict[str, Scenario], results: dict[str, list[RunResult]]
) -> tuple[str, list[Path]]:
    """results.json, summary.md and the plots in `out`; returns the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    md = []
    doc = {}
    summaries = []
    for name, res in results.items():
        summ = summarise(name, res)
        summaries.append(summ)
        md.append(markdown(summ, scenarios[name]))
        doc[name] = {
            "scenario": scenarios[name].model_dump(),
            "summary": summ.to_dict(),
            "runs": [
                {k: v for k, v in asdict(r).items() if k != "records"}
                | {"records": [asdict(x) for x in r.records]}
                for r in res
            ],
        }
    (out / "results.json").write_text(json.dumps(doc, indent=1))
    if len(summaries) > 1:
        md.insert(0, "### All scenarios\n\n" + overview(summaries) + "\n")
    text = "\n".join(md)
    (out / "summary.md").write_text(text + "\n")
    return text, plot(results, out, {sm.scenario: sm for sm in summaries})


def load_results(path: Path) -> tuple[dict[str, Scenario], dict[str, list[RunResult]]]:
    """Scenarios and runs back from a results.json that `write_results` wrote."""
    doc = json.loads(path.read_text())
    scenarios, results = {}, {}
    for name, entry in doc.items():
        scenarios[name] = Scenario.model_validate(entry["scenario"])
        results[name] = [
            RunResult(
                **{k: v for k, v in run.items() if k != "records"},
                records=[IterationRecord(**x) for x in run["records"]],
            )
            for run in entry["runs"]
        ]
    return scenarios, results


def default_processes() -> int:
    return max(1, min(os.cpu_count() or 1, 4))
