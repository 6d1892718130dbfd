"""The closed loop, run end to end: INT → `int-collector` → InfluxDB → `agg-optimizer serve`
(its control loop) → the fabric's ONOS API → the fabric → faster training. `make demo` runs
it on the simulated fabric (`demo.live`); every other part is the real one: a real InfluxDB
1.8.10, the collector and the service as their own processes, real UDP and real HTTP.

The scenario: two jobs train on a leaf-spine; every `hotspot_every_s` a bulk transfer of
another tenant congests the link into job `a`'s parameter server from the spine that sums
its streams; the telemetry shows it, the service moves the job to the other spine, and the
job's iteration time recovers. Each hotspot gives one reaction time: from the moment the
telemetry crossed the service's threshold (the collector's first InfluxDB point for that
link that moved by `utilization_threshold`) to the moment the new placement reached the
fabric (the aggregation resource's POST, the last step of an apply).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import requests

from agg_optimizer.demo.live import Change, Hotspot, LeafSpine, LiveFabric
from agg_optimizer.sim.training import JobSpec

Say = Callable[[str], None]


@dataclass
class LoopConfig:
    duration_s: float = 45.0  # from the jobs' placement on
    first_hotspot_s: float = 4.0
    hotspot_every_s: float = 9.0
    hotspot_len_s: float = 5.0
    hotspot_flows: int = 4
    period_s: float = 0.2  # the service's control-loop period
    utilization_threshold: float = 0.1
    report_interval_s: float = 0.1
    seed: int = 0
    out: Path = Path("demo-out")


@dataclass
class Reaction:
    link: str
    onset_s: float
    telemetry_s: float | None  # when the telemetry crossed the threshold (InfluxDB point)
    applied_s: float | None  # when the new placement reached the fabric
    old: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)

    @property
    def reaction_s(self) -> float | None:
        if self.telemetry_s is None or self.applied_s is None:
            return None
        return self.applied_s - self.telemetry_s


@dataclass
class LoopResult:
    config: dict[str, Any]
    iterations: list[dict[str, Any]]
    changes: list[dict[str, Any]]
    hotspots: list[dict[str, Any]]
    telemetry: list[dict[str, Any]]  # what the service's /telemetry showed, polled
    reactions: list[dict[str, Any]]
    reports_sent: int
    # The service's placement decisions as it wrote them to InfluxDB: time (fabric clock),
    # job, trigger (telemetry, topology, periodic, ...), aggregators, predicted CCT.
    decisions: list[dict[str, Any]] = field(default_factory=list)

    def reaction_times(self) -> list[float]:
        return [r["reaction_s"] for r in self.reactions if r["reaction_s"] is not None]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _script(name: str) -> str:
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else name


class _Proc:
    """A part of the loop as its own process (its own process group, ended with the run
    whatever ends it: `int_collector.children`), logging to `log`."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        from int_collector import children

        self.name, self.log = name, log
        self.p = children.spawn(argv, env={**os.environ, **env}, log=log)

    def check(self) -> None:
        if self.p.poll() is not None:
            from int_collector.children import NotReady

            raise NotReady(
                f"{self.name} exited with status {self.p.returncode}; its log: {self.log}"
            )

    def stop(self) -> None:
        from int_collector import children

        children.stop(self.p)


# Deadlines for a cold first run on a loaded 2-core machine; each wait says every 10 s what
# it waits for. The collector compiles its receive path if `make sync` has not (minutes at
# a load of 20); the others take seconds on an idle machine.
COLLECTOR_START_S = 900.0
SERVICE_START_S = 300.0
FIRST_TELEMETRY_S = 300.0


def _wait(
    check: Callable[[], bool], timeout_s: float, what: str, procs: list[_Proc], say: Say,
    log: Path | None = None,
) -> None:  # fmt: skip
    from int_collector import children

    def ready() -> bool:
        for p in procs:
            p.check()
        return check()

    def checked() -> bool:
        try:
            return ready()
        except requests.RequestException:
            return False

    t = time.monotonic()
    try:
        children.wait_ready(checked, what, timeout_s=timeout_s, log=log, say=say)
    except children.NotReady:
        for p in procs:  # a part that exited says so rather than the timeout
            p.check()
        raise
    if time.monotonic() - t > 2:
        say(f"{what}: ready after {time.monotonic() - t:.1f} s")


def _clear(out: Path) -> None:
    """An earlier run's results go before this run starts, so that what is left after a
    failure is never taken for this run's."""
    for name in ("timeline.json", "loop.png"):
        (out / name).unlink(missing_ok=True)
    shutil.rmtree(out / "run", ignore_errors=True)


def run(cfg: LoopConfig, say: Say = print, influxd: Path | None = None) -> LoopResult:
    """The scenario end to end. A part that does not come up raises
    `int_collector.children.NotReady` naming it and its log; every process started here
    ends before this returns or raises (SIGTERM and SIGHUP too, with `children.on_signals`)."""
    from int_collector.influxd import InfluxServer

    cfg.out.mkdir(parents=True, exist_ok=True)
    _clear(cfg.out)
    # The processes' logs and the service's database stay in the output directory.
    work = cfg.out / "run"
    work.mkdir(parents=True)
    influx = InfluxServer(influxd)
    procs: list[_Proc] = []
    fabric: LiveFabric | None = None
    try:
        t = time.monotonic()
        say("starting InfluxDB 1.8.10")
        influx.start(say=say)
        say(f"InfluxDB 1.8.10 up at {influx.url} ({time.monotonic() - t:.1f} s)")
        int_port, int_http = _free_port(), _free_port()
        procs.append(
            _Proc(
                "int-collector",
                [_script("int-collector"), "serve", "--listen", f"127.0.0.1:{int_port}"],
                {
                    "INT_COLLECTOR_INFLUX_URL": influx.url,
                    "INT_COLLECTOR_INFLUX_BUCKET": influx.bucket,
                    "INT_COLLECTOR_HTTP_PORT": str(int_http),
                    "INT_COLLECTOR_TICK_S": "0.05",
                    "INT_COLLECTOR_FLUSH_INTERVAL_S": "0.05",
                    # A steady link is written at least every second, so the service's
                    # staleness bound (3 s) never drops a link that is congested and steady.
                    "INT_COLLECTOR_KEEPALIVE_S": "1",
                    "INT_COLLECTOR_START_TIMEOUT_S": str(COLLECTOR_START_S),
                },
                work / "collector.log",
            )
        )
        api_port = _free_port()
        api = f"http://127.0.0.1:{api_port}/api/v1"
        http = requests.Session()
        # The collector's workers read their sockets before the fabric sends: a report that
        # waited in a socket would be stamped late (docs/e2e.md).
        say(f"starting int-collector (UDP {int_port}, health on :{int_http})")
        _wait(lambda: http.get(f"http://127.0.0.1:{int_http}/readyz", timeout=2).ok,
              COLLECTOR_START_S, "int-collector's /readyz", procs, say,
              work / "collector.log")  # fmt: skip
        fabric = LiveFabric(
            LeafSpine(2, 4, 3),
            collector=("127.0.0.1", int_port),
            report_interval_s=cfg.report_interval_s,
            seed=cfg.seed,
        ).start()
        say(
            f"simulated fabric: 2 spines, 4 leaves, 12 hosts (the third of each leaf is another "
            f"tenant's); ONOS API at {fabric.onos_url}; "
            f"INT reports every {cfg.report_interval_s * 1e3:.0f} ms to int-collector on "
            f"UDP {int_port}"
        )
        procs.append(
            _Proc(
                "agg-optimizer serve",
                [_script("agg-optimizer"), "serve", "--port", str(api_port)],
                {
                    "AGG_OPTIMIZER_ONOS_URL": fabric.onos_url,
                    "AGG_OPTIMIZER_INFLUX_URL": influx.url,
                    "AGG_OPTIMIZER_INFLUX_BUCKET": influx.bucket,
                    "AGG_OPTIMIZER_DB_PATH": str(work / "service.sqlite"),
                    "AGG_OPTIMIZER_REOPTIMIZE_PERIOD_S": str(cfg.period_s),
                    "AGG_OPTIMIZER_UTILIZATION_THRESHOLD": str(cfg.utilization_threshold),
                    "AGG_OPTIMIZER_TELEMETRY_WINDOW_S": "30",
                    "AGG_OPTIMIZER_TELEMETRY_STALE_S": "3",
                    "AGG_OPTIMIZER_INTENT_WAIT_S": "5",
                },
                work / "service.log",
            )
        )
        say(f"starting agg-optimizer serve on :{api_port}")
        _wait(lambda: http.get(api.rsplit("/api", 1)[0] + "/readyz", timeout=2).ok,
              SERVICE_START_S, "agg-optimizer serve's /readyz", procs, say,
              work / "service.log")  # fmt: skip
        _wait(lambda: len(http.get(f"{api}/telemetry", timeout=2).json().get("links", [])) > 0,
              FIRST_TELEMETRY_S, "the first INT reports in the service's /telemetry", procs,
              say, work / "collector.log")  # fmt: skip
        say(f"agg-optimizer serve up at {api} (control loop every {cfg.period_s * 1e3:.0f} ms)")
        return _scenario(cfg, fabric, http, api, influx, procs, say)
    finally:
        for p in reversed(procs):  # the service before the fabric it talks to
            p.stop()
        if fabric is not None:
            fabric.stop()
        influx.stop(remove=True)


def _host(leaf: int, j: int) -> str:
    return f"10.0.{leaf}.{j}"


def _scenario(
    cfg: LoopConfig,
    fabric: LiveFabric,
    http: requests.Session,
    api: str,
    influx: Any,
    procs: list[_Proc],
    say: Say,
) -> LoopResult:
    ip_to_id = {ip: h for h, ip in fabric.ips.items()}
    jobs = [
        {"id": "a", "workers": [_host(1, 1), _host(2, 1), _host(3, 1)], "ps": _host(4, 1),
         "update_bytes": 25_000_000},
        {"id": "b", "workers": [_host(1, 2), _host(2, 2)], "ps": _host(3, 2),
         "update_bytes": 25_000_000},
    ]  # fmt: skip
    for j in jobs:
        fabric.add_job(
            JobSpec(
                id=j["id"],
                workers=[ip_to_id[w] for w in j["workers"]],
                ps=ip_to_id[j["ps"]],
                update_bytes=j["update_bytes"],
                iterations=1_000_000,
                compute_s=0.15,
            )
        )
        r = http.post(f"{api}/jobs", json=j, timeout=10)
        if r.status_code != 201:
            raise RuntimeError(f"creating job {j['id']}: {r.status_code} {r.text}")
    name = {d: d.split(":")[1] for d in fabric.int_id}

    def show(kind: str, what: Any) -> None:
        if kind == "placement":
            c: Change = what
            say(f"t={c.t:6.2f} s  placement  job {c.job}: aggregates at "
                f"{', '.join(name.get(s, s) for s in c.aggregators) or 'the PS only'}")  # fmt: skip
        elif kind == "hotspot":
            h: Hotspot = what
            say(f"t={h.start_s:6.2f} s  congestion  {len(h.flows)} background flows on "
                f"{name[h.link[0]]}->{name[h.link[1]]}")  # fmt: skip
        elif kind == "hotspot-end":
            say(f"t={what.end_s:6.2f} s  congestion  ends on "
                f"{name[what.link[0]]}->{name[what.link[1]]}")  # fmt: skip
        elif kind == "priority":
            t, job, cls = what
            say(
                f"t={t:6.2f} s  class      job {job}: "
                + (f"priority class {cls}" if cls is not None else "class removed")
            )

    fabric.listeners.append(show)
    r = http.post(f"{api}/placements", json={}, timeout=30)
    if r.status_code != 200:
        raise RuntimeError(f"placing the jobs: {r.status_code} {r.text}")

    telemetry: list[dict[str, Any]] = []
    alerts: set[tuple[str, str]] = set()
    stop = threading.Event()
    port_link = {(fabric.int_id[u], p): (u, v) for (u, v), p in fabric.port.items()
                 if u in fabric.int_id}  # fmt: skip

    def poll() -> None:
        last_print = 0.0
        while not stop.wait(0.25):
            now = fabric.now()
            try:
                links = http.get(f"{api}/telemetry", timeout=2).json().get("links", [])
            except (requests.RequestException, ValueError):
                continue
            for ln in links:
                key = (ln["src"], ln["dst"])
                if key[0] not in fabric.int_id or key[1] not in fabric.int_id:
                    continue
                telemetry.append({"t": now, "src": key[0], "dst": key[1],
                                  "utilization": ln["utilization"]})  # fmt: skip
                hot = ln["utilization"] >= 0.8
                if hot and key not in alerts:
                    alerts.add(key)
                    u = ln["utilization"]
                    say(f"t={now:6.2f} s  link alert  {name[key[0]]}->{name[key[1]]} "
                        f"utilisation {u:.2f} (INT, via the collector)")  # fmt: skip
                elif not hot and ln["utilization"] < 0.5 and key in alerts:
                    alerts.discard(key)
                    say(f"t={now:6.2f} s  link clear  {name[key[0]]}->{name[key[1]]} "
                        f"utilisation {ln['utilization']:.2f}")  # fmt: skip
            if now - last_print >= 3.0:
                last_print = now
                recs = [x for x in fabric.records() if x.start_s >= now - 3.0]
                parts = []
                for j in ("a", "b"):
                    cct = [x.cct_s for x in recs if x.job == j]
                    if cct:
                        parts.append(f"job {j} {np.mean(cct) * 1e3:5.0f} ms ({len(cct)} it.)")
                if parts:
                    say(f"t={now:6.2f} s  iterations  " + ", ".join(parts))
            for p in procs:
                p.check()

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    hotspots: list[Hotspot] = []
    onsets: list[tuple[Hotspot, list[str]]] = []
    try:
        # The scenario's clock starts once the jobs are placed (start-up time varies).
        placed = fabric.now()
        next_hot = placed + cfg.first_hotspot_s
        end = placed + cfg.duration_s
        active: Hotspot | None = None
        while fabric.now() < end:
            now = fabric.now()
            if active and now >= active.start_s + cfg.hotspot_len_s:
                fabric.end_hotspot(active)
                active = None
            if active is None and now >= next_hot and now + cfg.hotspot_len_s < end:
                link = _link_into_ps(fabric, "a")
                before = list(fabric.aggregation.get("a", []))
                active = fabric.add_hotspot(link, flows=cfg.hotspot_flows)
                hotspots.append(active)
                onsets.append((active, before))
                next_hot = now + cfg.hotspot_every_s
            time.sleep(0.02)
        if active:
            fabric.end_hotspot(active)
    finally:
        stop.set()
        poller.join(5)
    time.sleep(0.5)  # the collector's last points
    reactions = _reactions(fabric, influx, onsets, port_link, cfg)
    decisions = _decisions(fabric, influx)
    for r in reactions:
        rt = r.reaction_s
        say(f"reaction  {r.link}: congestion at {r.onset_s:.2f} s, telemetry over the threshold "
            f"at {_fmt(r.telemetry_s)}, new placement applied at {_fmt(r.applied_s)}: "
            f"{'-' if rt is None else f'{rt * 1e3:.0f} ms'}")  # fmt: skip
    return LoopResult(
        config={k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()},
        iterations=[asdict(x) for x in fabric.records()],
        changes=[asdict(c) for c in fabric.changes],
        hotspots=[
            {
                "link": [name[h.link[0]], name[h.link[1]]],
                "start_s": h.start_s,
                "end_s": h.end_s,
                "flows": len(h.flows),
            }
            for h in hotspots
        ],
        telemetry=[{**x, "src": name[x["src"]], "dst": name[x["dst"]]} for x in telemetry],
        reactions=[{**asdict(r), "reaction_s": r.reaction_s} for r in reactions],
        reports_sent=fabric.reports_sent,
        decisions=decisions,
    )


def _fmt(t: float | None) -> str:
    return "-" if t is None else f"{t:.2f} s"


def _link_into_ps(fabric: LiveFabric, job: str) -> tuple[str, str]:
    """The link into the PS's leaf on the job's current tree: it carries the whole sum."""
    spec = fabric.specs[job]
    path = fabric._paths(job, spec.ps).get(spec.workers[0])
    if not path or len(path) < 4:
        raise RuntimeError(f"job {job}: no applied path to congest ({path})")
    return path[-3], path[-2]


def _decisions(fabric: LiveFabric, influx: Any) -> list[dict[str, Any]]:
    wall0 = time.time() - fabric.now()
    q = influx.query_v1(
        'SELECT "switches", "predicted_cct_s" FROM "telemetry"."autogen"."placement_decision" '
        'GROUP BY "job", "trigger"'
    )
    out = []
    for s in json.loads(q)["results"][0].get("series", []):
        for ts, switches, cct in s["values"]:
            out.append(
                {
                    "t": round(_epoch(ts) - wall0, 3),
                    "job": s["tags"]["job"],
                    "trigger": s["tags"]["trigger"],
                    "aggregators": (switches or "").split(","),
                    "predicted_cct_s": cct,
                }
            )
    return sorted(out, key=lambda d: d["t"])


def _reactions(
    fabric: LiveFabric,
    influx: Any,
    onsets: list[tuple[Hotspot, list[str]]],
    port_link: dict[tuple[int, int], tuple[str, str]],
    cfg: LoopConfig,
) -> list[Reaction]:
    """Per hotspot: when InfluxDB first held a point of the congested link that moved by the
    threshold, and when the job's next different placement reached the fabric."""
    wall0 = time.time() - fabric.now()
    q = influx.query_v1(
        'SELECT "utilization" FROM "telemetry"."autogen"."int_link" GROUP BY "switch", "port"'
    )
    series: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for s in json.loads(q)["results"][0].get("series", []):
        tags = s["tags"]
        link = port_link.get((int(tags["switch"]), int(tags["port"])))
        if link is None:
            continue
        pts = []
        for ts, u in s["values"]:
            if u is None:
                continue
            pts.append((_epoch(ts) - wall0, float(u)))
        series[link] = sorted(pts)
    name = {d: d.split(":")[1] for d in fabric.int_id}
    out = []
    for hs, before in onsets:
        pts = series.get(hs.link, [])
        base = [u for t, u in pts if t < hs.start_s]
        u0 = base[-1] if base else 0.0
        crossed = next(
            (t for t, u in pts if t >= hs.start_s and u - u0 >= cfg.utilization_threshold),
            None,
        )
        moved = next(
            (c for c in fabric.changes
             if c.job == "a" and c.t >= hs.start_s and c.aggregators != before
             and (hs.end_s is None or c.t <= hs.end_s)),
            None,
        )  # fmt: skip
        out.append(
            Reaction(
                link=f"{name[hs.link[0]]}->{name[hs.link[1]]}",
                onset_s=hs.start_s,
                telemetry_s=crossed,
                applied_s=moved.t if moved else None,
                old=[name.get(s, s) for s in before],
                new=[name.get(s, s) for s in moved.aggregators] if moved else [],
            )
        )
    return out


def _epoch(ts: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def _gapped(pts: list[tuple[float, float]], gap_s: float) -> tuple[list[float], list[float]]:
    """The points as x and y lists with a NaN wherever consecutive x are more than `gap_s`
    apart, so that a line breaks where data is missing instead of bridging it."""
    xs: list[float] = []
    ys: list[float] = []
    for i, (x, y) in enumerate(sorted(pts)):
        if i and x - xs[-1] > gap_s:
            xs.append(float("nan"))
            ys.append(float("nan"))
        xs.append(x)
        ys.append(y)
    return xs, ys


def plot(result: LoopResult, path: Path) -> None:
    """Iteration time per job, the congested link's utilisation as the service saw it, and
    the placement changes, on one time axis (the fabric's clock). Lines break where data is
    missing (no iteration finished, or the service's telemetry was not read, for over 1 s)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    # Job b as a wide pale band under job a's thin line: where both take the same time, a's
    # line runs inside b's band, so neither hides the other.
    styles = (("b", "tab:green", dict(lw=6, alpha=0.35, solid_capstyle="butt"), 2),
              ("a", "tab:blue", dict(lw=1.2, marker="o", ms=2.5), 3))  # fmt: skip
    for job, colour, style, z in styles:
        pts = [(x["start_s"], x["cct_s"] * 1e3) for x in result.iterations if x["job"] == job]
        if pts:
            t, c = _gapped(pts, 1.0)
            ax1.plot(t, c, "-", color=colour, zorder=z, label=f"job {job}", **style)
    for h in result.hotspots:
        for ax in (ax1, ax2):
            ax.axvspan(h["start_s"], h["end_s"] or h["start_s"], color="tab:red", alpha=0.08)
    ymax = max((x["cct_s"] * 1e3 for x in result.iterations), default=1.0)
    ax1.set_ylim(0, ymax * 1.35)  # headroom for the move labels, inside the axes
    for c in result.changes:
        if c["job"] == "a" and c["kind"] == "aggregation":
            ax1.axvline(c["t"], color="tab:purple", lw=0.8, ls="--")
            ax1.annotate(
                " " + (",".join(s.split(":")[-1] for s in c["aggregators"]) or "PS"),
                (c["t"], 0.98), xycoords=("data", "axes fraction"), fontsize=8,
                rotation=90, va="top", ha="left", color="tab:purple", annotation_clip=True,
            )  # fmt: skip
    ax1.set_ylabel("iteration communication time (ms)")
    ax1.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8)
    ax1.set_title("Closed loop on the simulated fabric: congestion (red), job a moved (purple)")
    links = sorted({(x["src"], x["dst"]) for x in result.telemetry if x["dst"].startswith("l")})
    hot = {tuple(h["link"]) for h in result.hotspots}
    for src, dst in links:
        pts = [(x["t"], x["utilization"]) for x in result.telemetry
               if (x["src"], x["dst"]) == (src, dst)]  # fmt: skip
        if not pts or max(u for _, u in pts) < 0.05:
            continue
        t, u = _gapped(pts, 1.0)
        ax2.plot(t, u, lw=1.4 if (src, dst) in hot else 0.7, label=f"{src}->{dst}")
    ax2.set_ylabel("utilisation (service's view of INT)")
    ax2.set_xlabel("time since the fabric started (s)")
    ax2.set_ylim(0, 1.05)
    ax2.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
