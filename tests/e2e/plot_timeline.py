"""Plot the timeline the closed-loop test records (INNET_AGG_E2E_RECORD=<path.json>).

    uv run --frozen python tests/e2e/plot_timeline.py timeline.json -o docs/images/e2e-bmv2-loop.png

Four panels over the same time axis: the job's iteration time (worker 0), the utilisation
and the queue of the spine links as InfluxDB holds them (INT → int-collector), and which spine
carries the job (the service's placements, and the first worker's packets seen on each
uplink). Shaded: background traffic on a spine; dashed: telemetry crossing the threshold;
solid: every intent of the job INSTALLED through the other spine in ONOS.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

SPINE_COLOURS = {"sp1": "tab:blue", "sp2": "tab:orange"}


def plot(tl: dict, out: Path) -> None:
    eps = tl["episodes"]
    t0 = (eps[0]["t_start"] - 5.0) if eps else tl["t0"]
    end = max([e["t_end"] for e in eps] + [t0 + 10]) + 4.0

    def x(t: float) -> float:
        return t - t0

    fig, ax = plt.subplots(4, 1, figsize=(11, 9.5), sharex=True)
    it = [i for i in tl["iterations"] if i["worker"] == 0 and t0 <= i["t"] <= end]
    ax[0].plot([x(i["t"]) for i in it], [i["seconds"] * 1e3 for i in it], ".-", lw=0.8, ms=3)
    ax[0].set_yscale("log")
    ax[0].set_ylabel("iteration (ms)\nworker 0")

    spine_links = sorted(
        {r["link"] for r in tl["telemetry"] if r["link"].startswith("sp") or "->sp" in r["link"]}
    )
    # The collector writes a point when a value moves, and at least every keep-alive while
    # reports arrive; a series without points for longer has no reports: drawn as a gap.
    gap = 2 * tl["params"].get("collector_keepalive_s", 0.5)
    for n, link in enumerate(spine_links):
        colour = f"C{n}"
        rows = [r for r in tl["telemetry"] if r["link"] == link and t0 <= r["t"] <= end]
        for axis, field in ((ax[1], "utilization"), (ax[2], "queue_occupancy")):
            pts = [(r["t"], r[field]) for r in rows if r[field] is not None]
            label = link
            for i, (t, v) in enumerate(pts):
                nxt = pts[i + 1][0] if i + 1 < len(pts) else t + gap
                axis.plot([x(t), x(min(nxt, t + gap))], [v, v], color=colour, lw=1, label=label)
                if nxt <= t + gap and i + 1 < len(pts):
                    axis.plot([x(nxt)] * 2, [v, pts[i + 1][1]], color=colour, lw=1)
                label = None
    thr = tl["params"]["utilization_threshold"]
    ax[1].axhline(thr, color="grey", lw=0.8, ls=":")
    ax[1].set_ylabel("utilisation\n(INT, InfluxDB)")
    ax[1].set_ylim(-0.03, 1.05)
    ax[1].legend(loc="upper right", fontsize=7, ncol=2)
    ax[2].set_ylabel("queue (packets)\n(INT, InfluxDB)")
    ax[2].legend(loc="upper right", fontsize=7, ncol=2)

    for spine, colour in SPINE_COLOURS.items():
        bins = [b for b in tl["dataplane"] if t0 <= b["t"] <= end]
        ax[3].plot(
            [x(b["t"]) for b in bins],
            [b.get(spine, 0) for b in bins],
            color=colour,
            lw=0.8,
            label=f"worker 0 packets / 100 ms via {spine}",
        )
    placed = [p for p in tl["placements"] if p["status"] == "applied"]
    ys = [(x(max(p["t"], t0)), 1 if p["spine"] == "sp1" else 0) for p in placed]
    ys.append((x(end), ys[-1][1]))
    ax3b = ax[3].twinx()
    ax3b.step(*zip(*ys, strict=True), where="post", color="k", lw=1.2, label="placement")
    ax3b.set_yticks([0, 1], ["sp2", "sp1"])
    ax3b.set_ylim(-0.2, 1.2)
    ax[3].set_ylabel("packets / 100 ms")
    ax[3].legend(loc="upper left", fontsize=7)
    ax3b.legend(loc="upper right", fontsize=7)
    ax[3].set_xlabel("seconds")

    for e in eps:
        for a in ax:
            a.axvspan(x(e["t_start"]), x(e["t_end"]), color=SPINE_COLOURS[e["spine"]], alpha=0.12)
            if e["t_cross"]:
                a.axvline(x(e["t_cross"]), color="red", lw=0.8, ls="--")
            if e["t_onos_installed"]:
                a.axvline(x(e["t_onos_installed"]), color="green", lw=0.8)
        if "reaction_s" in e:
            ax[0].annotate(
                f"{e['reaction_s']:.2f} s",
                (x(e["t_onos_installed"]), ax[0].get_ylim()[1]),
                fontsize=7,
                ha="left",
                va="top",
            )
    r = tl["reaction_s"]
    fig.suptitle(
        "bmv2 under ONOS 2.7: background on the job's spine (shaded), INT crosses the threshold "
        "(dashed),\nthe service moves the job (solid): reaction median "
        f"{r['median']:.2f} s, p95 {r['p95']:.2f} s over {r['samples']} episodes",
        fontsize=9,
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("timeline", type=Path)
    p.add_argument("-o", "--out", type=Path, default=Path("docs/images/e2e-bmv2-loop.png"))
    a = p.parse_args()
    plot(json.loads(a.timeline.read_text()), a.out)
    print(a.out)


if __name__ == "__main__":
    main()
