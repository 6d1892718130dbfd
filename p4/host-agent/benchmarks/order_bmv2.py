"""The order of two jobs' traffic classes on bmv2 (issue 31, item 4; docs/scheduling.md).

Two symmetric jobs (A = job 1, B = job 2; two workers each, the same tensor size and
iterations) send to their parameter servers on one port of one simple_switch running the
committed pipeline with 8 priority queues per port. Each arm writes the classes the
service would push: `scheduling.schedule(policy, demands, 7)` mapped onto classes 1-7 as
`service/scheduler.py` does, one `traffic_class` entry per job as the ONOS app writes it
(`TrafficClassTranslator`: is_agg 1, agg_job_id the job, set_class(c), priority 100).
Arms: `one-class` (policy fair: both jobs in class 7), `A-first` and `B-first` (policy
fifo, the first arrival in class 7, the other in 6), and `class-0` (no entry). Per job:
its mean iteration time and when it finished, from the first send of any worker.

ONOS is not in this path: the entries go through simple_switch_CLI. Starting ONOS 2.7
with a bmv2 device takes minutes per run of this script and the arms differ only in
the entries, which are the ones the app writes (tests/onos/test_bmv2_device.py checks that
a class pushed through the app lands on the switch).

The shared line. bmv2 rate-limits each priority queue on its own (`set_queue_rate` gives
every class of the port its own RATE, bm_sim/queueing.h QueueingLogicPriRL), so with a
queue rate two jobs in different classes never contend: each gets RATE. Measured with two
floods in classes 1 and 7 at twice RATE: both got RATE. What the classes of one port do
share is the egress thread that pops them (strictly, highest class first) and runs the
egress pipeline. So the port's queues are left unlimited and that thread is capped to a
share of a CPU (a cgroup v1 `cpu` group of its own: `--quota-us` per `--period-us`);
the port then serves what the thread can pop, highest class first, like a line of that
rate. The thread is found by its CPU time: the one that works for packets to the servers'
port and not for packets to another port. The port's egress thread (bmv2 maps port p to
thread p mod 4) serves no other port here: the servers are on port 4, workers on 1, 2, 3
and 5. The cap makes service bursty at the period's scale (a burst of about quota / cost
per packet, then a wait): `--period-us` is kept well under an iteration. Two side effects
are handled: every port's queues are deep (`--depth`), as all of bmv2's queues share one
lock that the stopped thread may hold; and the servers' host is paced (`--ack-pace-mbit`),
as their bursts of acknowledgements otherwise lost about a tenth inside bmv2.

Needs root (namespaces), simple_switch (/opt/p4 or PATH) and the cgroup v1 cpu controller
at /sys/fs/cgroup/cpu.

    sudo .venv/bin/python p4/host-agent/benchmarks/order_bmv2.py --runs 3 \
        --out docs/scheduling
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))

from agg_agent import p4names as n  # noqa: E402
from agg_agent.protocol import UDP_PORT  # noqa: E402
from agg_optimizer.evaluation.evaluate import Interval  # noqa: E402
from agg_optimizer.scheduling.policies import Demand, schedule  # noqa: E402
from int_collector.children import spawn  # noqa: E402
from p4 import bmv2, frames  # noqa: E402

AGENT = str(ROOT / ".venv" / "bin" / "agg-agent")
ANY = "0&&&0"
PS_PORT, OTHER_PORT = 4, 3  # OTHER_PORT: the calibration's port with another egress thread
JOBS = {"A": (1, (1, 2), "10.0.0.4"), "B": (2, (3, 5), "10.0.0.8")}  # job, worker hosts, PS
ARMS = ("one-class", "A-first", "B-first", "class-0")
CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
MIN_PERIOD_US = 1000  # cfs: period and quota are at least 1 ms


def skip_reason() -> str | None:
    """Why this benchmark cannot run here (None: it can)."""
    reason = bmv2.skip_reason()
    if reason is None and not (CGROUP_CPU / "tasks").exists():
        reason = f"no cgroup v1 cpu controller at {CGROUP_CPU}: the port's line needs it"
    return reason


def classes_for(arm: str) -> dict[str, int]:
    """The classes of jobs A and B in `arm`, as the service computes them: the policy's
    order on classes 0..6, shifted to 1..7 (class 0 stays the background's)."""
    if arm == "class-0":
        return {"A": 0, "B": 0}
    policy = "fair" if arm == "one-class" else "fifo"
    first = "B" if arm == "B-first" else "A"
    # one link, the same bytes each: symmetric jobs; only the arrival sets the fifo order
    demands = [Demand(j, {"port": 1.0}, arrival_s=0.0 if j == first else 1.0) for j in JOBS]
    s = schedule(policy, demands, n.TC_CLASSES - 1)
    return {j: c + 1 for j, c in s.classes.items()}


def class_entry(job: int, cls: int) -> str:
    key = ["1&&&1", f"{job}&&&0xffff"] + [ANY] * 6  # p4names.TC_MATCH_FIELDS
    return f"table_add {n.TC_TABLE} {n.TC_SET_CLASS} {' '.join(key)} => {cls} 100"


def fwd(ip_last: int, port: int) -> str:
    key = [ANY] * 5 + [f"0x0a0000{ip_last:02x}&&&0xffffffff"] + [ANY] * 3
    return f"table_add {n.FWD_TABLE} {n.FWD_SET_EGRESS_PORT} {' '.join(key)} => {port} 10"


def thread_cpu_ns(pid: int) -> dict[int, int]:
    """CPU time of each of the process's threads (ns, /proc/<pid>/task/<tid>/schedstat)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):
            out[int(tid)] = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
    return out


def blast(sw: bmv2.Bmv2, dst: int, count: int) -> dict[int, int]:
    """Send `count` frames from host 1 to host `dst`, paced; each thread's CPU time spent."""
    assert sw.proc is not None
    tx = bmv2.RawPort(sw.host_if(1))
    try:
        frame = frames.udp_frame(1, dst, 40000, 5000, bytes(144))
        before = thread_cpu_ns(sw.proc.pid)
        for i in range(count):
            tx.send(frame)
            if i % 50 == 49:
                time.sleep(0.005)  # pacing: the switch's queues do not overflow
        time.sleep(0.3)  # the last frames through
        after = thread_cpu_ns(sw.proc.pid)
    finally:
        tx.close()
    return {t: after[t] - before.get(t, 0) for t in after}


def egress_thread(sw: bmv2.Bmv2, frames_each: int = 6000) -> int:
    """The thread that pops PS_PORT's queues: busy for frames to PS_PORT, idle for frames to
    OTHER_PORT (the receive, ingress and transmit threads work for both)."""
    to_ps, to_other = blast(sw, PS_PORT, frames_each), blast(sw, OTHER_PORT, frames_each)
    tid = max(to_ps, key=lambda t: to_ps[t] / (to_other.get(t, 0) + 2e6))
    if to_ps[tid] < 5e6 or to_other.get(tid, 0) > 0.2 * to_ps[tid]:
        raise RuntimeError(f"no thread of simple_switch works for port {PS_PORT} alone: {to_ps}")
    return tid


@contextlib.contextmanager
def cpu_cap(tid: int, quota_us: int, period_us: int) -> Iterator[Path]:
    """Thread `tid` in a cgroup v1 cpu group of its own, `quota_us` of CPU per `period_us`;
    back in the root group and the group removed on exit."""
    group = CGROUP_CPU / f"innet-agg-order-{os.getpid()}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text(str(period_us))
        (group / "cpu.cfs_quota_us").write_text(str(quota_us))
        (group / "tasks").write_text(str(tid))
        yield group
    finally:
        with contextlib.suppress(OSError):  # the thread may be gone with its switch
            (CGROUP_CPU / "tasks").write_text(str(tid))
        group.rmdir()


def line_rate(sw: bmv2.Bmv2, seconds: float = 2.0) -> float:
    """Packets/s the capped port delivers when offered more than it can serve."""
    rx = bmv2.RawPort(sw.host_if(PS_PORT))
    arrivals: list[float] = []
    stop = threading.Event()

    def receive() -> None:
        rx.sock.settimeout(0.05)
        while not stop.is_set():
            try:
                data = rx.sock.recv(4096)
            except TimeoutError:
                continue
            if frames.udp_payload(data, 5001) is not None:
                arrivals.append(time.monotonic())

    t = threading.Thread(target=receive)
    t.start()
    tx = bmv2.RawPort(sw.host_if(1))
    try:
        frame = frames.udp_frame(1, PS_PORT, 40000, 5001, bytes(144))
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(20):
                tx.send(frame)
            time.sleep(0.001)
    finally:
        tx.close()
        time.sleep(0.5)
        stop.set()
        t.join()
        rx.close()
    if len(arrivals) < 2:
        return float("nan")
    return (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])


def setup(sw: bmv2.Bmv2, depth: int) -> None:
    """Routes (both servers behind PS_PORT) and every port's queues: `depth` packets per
    class, no queue rate (the line is the capped egress thread). On the workers' ports
    too: all queues share one lock, so while the capped thread is stopped holding it, no
    port is served, and the acknowledgements of a burst must fit (at bmv2's 64 a tenth
    of them were lost)."""
    sw.cli(
        *(fwd(i, i) for i in (1, 2, 3, 5)),
        fwd(4, PS_PORT),
        fwd(8, PS_PORT),
        f"set_queue_depth {depth}",
    )


def servers_host(sw: bmv2.Bmv2, h: bmv2.Hosts, pace_mbit: float) -> None:
    """B's server is 10.0.0.8, an address of host 4, whose MAC every worker knows; host 4
    sends at most `pace_mbit` (tc tbf). The capped port delivers in bursts, the servers
    answer each with a burst of acknowledgements, and unpaced about a tenth of those were
    lost inside bmv2 before its ingress (the veth counted them in, the traffic_class
    counter did not), each costing its worker a retransmission timeout."""
    ex = ("ip", "netns", "exec")
    subprocess.run([*ex, h.ns(PS_PORT), "tc", "qdisc", "add", "dev", sw.host_if(PS_PORT), "root",
                    "tbf", "rate", f"{pace_mbit}mbit", "burst", "2000", "limit", "400000"],
                   check=True)  # fmt: skip
    ip_b = JOBS["B"][2]
    subprocess.run([*ex, h.ns(PS_PORT), "ip", "addr", "add", f"{ip_b}/24", "dev",
                    sw.host_if(PS_PORT)], check=True)  # fmt: skip
    for i in (1, 2, 3, 5):
        subprocess.run([*ex, h.ns(i), "ip", "neigh", "add", ip_b, "lladdr",
                        f"00:00:00:00:00:{PS_PORT:02x}", "dev", sw.host_if(i)],
                       check=True)  # fmt: skip


def run_in(h: bmv2.Hosts, host: int, argv: list[str]) -> subprocess.Popen[str]:
    """A process in host `host`'s namespace that dies with this one."""
    return spawn(["ip", "netns", "exec", h.ns(host), *argv], stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, text=True)  # fmt: skip


def wait_bound(h: bmv2.Hosts, host: int, ip: str, proc: subprocess.Popen[str]) -> None:
    """Until `proc` has bound ip:UDP_PORT in host `host`'s namespace."""
    deadline = time.monotonic() + 20
    while True:
        out = subprocess.run(["ip", "netns", "exec", h.ns(host), "ss", "-Huln"],
                             capture_output=True, text=True).stdout  # fmt: skip
        if f"{ip}:{UDP_PORT}" in out:
            return
        if proc.poll() is not None:
            raise RuntimeError(
                f"server for {ip} exited: {proc.stderr.read() if proc.stderr else ''}"
            )
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing bound {ip}:{UDP_PORT} in host {host}")
        time.sleep(0.05)


def run_arm(h: bmv2.Hosts, args: argparse.Namespace, starts_with: str) -> dict[str, list[dict]]:
    """Both jobs once: servers up, then the four workers (`starts_with`'s first); each
    worker's rows (one an iteration)."""
    common = ["--size", str(args.size), "--iterations", str(args.iterations)]
    servers = []
    for job, workers, ps_ip in JOBS.values():
        cmd = [AGENT, "ps", "--job", str(job), "--bind", f"{ps_ip}:{UDP_PORT}", *common,
               "--linger-s", str(3 * args.timeout_ms / 1000)]  # fmt: skip
        for w in workers:
            cmd += ["--worker-addr", f"10.0.0.{w}:{UDP_PORT}"]
        p = run_in(h, PS_PORT, cmd)
        wait_bound(h, PS_PORT, ps_ip, p)
        servers.append(p)
    order = [starts_with] + [j for j in JOBS if j != starts_with]
    procs: list[tuple[str, subprocess.Popen[str]]] = []
    for name in order:
        job, workers, ps_ip = JOBS[name]
        for i, w in enumerate(workers):
            cmd = [
                AGENT, "worker", "--worker-id", str(i), "--job", str(job), "--workers", "2",
                "--ps", f"{ps_ip}:{UDP_PORT}", "--window", str(args.window),
                "--timeout-ms", str(args.timeout_ms), "--bind", f"10.0.0.{w}:{UDP_PORT}",
                *common,
            ]  # fmt: skip
            procs.append((name, run_in(h, w, cmd)))
    rows: dict[str, list[dict]] = {name: [] for name in JOBS}
    try:
        for name, p in procs:
            out, err = p.communicate(timeout=600)
            if p.returncode:
                raise RuntimeError(f"worker of job {name} failed: {err[-1500:]}")
            rows[name].append(
                {"rows": [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]}
            )
        for p in servers:
            _, err = p.communicate(timeout=120)
            if p.returncode:
                raise RuntimeError(f"parameter server failed: {err[-1500:]}")
    finally:
        for _, p in procs:
            p.kill()
        for p in servers:
            p.kill()
    return rows


def summarise(arm: str, run: int, classes: dict[str, int], got: dict[str, list[dict]]) -> dict:
    """Per job: mean iteration (ms: the iteration's first send to its last acknowledgement
    over its two workers) and when it finished (s, from the first send of any worker)."""
    t0 = min(w["rows"][0]["started"] for ws in got.values() for w in ws)
    out: dict = {"arm": arm, "run": run, "classes": classes}
    for name, workers in got.items():
        per_iter = [
            max(w["rows"][i]["finished"] for w in workers)
            - min(w["rows"][i]["started"] for w in workers)
            for i in range(len(workers[0]["rows"]))
        ]
        out[f"{name}_iter_ms"] = statistics.mean(per_iter) * 1e3
        out[f"{name}_done_s"] = max(w["rows"][-1]["finished"] for w in workers) - t0
        out[f"{name}_retransmissions"] = sum(
            r["retransmissions"] for w in workers for r in w["rows"]
        )
    out["mean_done_s"] = (out["A_done_s"] + out["B_done_s"]) / 2
    out["makespan_s"] = max(out["A_done_s"], out["B_done_s"])
    sent = sum(r["packets"] for ws in got.values() for w in ws for r in w["rows"])
    out["data_pps"] = sent / out["makespan_s"]  # through the port, retransmissions included
    return out


def measure(args: argparse.Namespace) -> tuple[list[dict], dict]:
    """Every arm `args.runs` times, interleaved; the rows and the line's measured rate.

    Needs a quiet machine: beside two busy loops the capped egress thread stopped being the
    port's bottleneck (the other threads and the agents were starved instead), one-class
    saw 48 retransmissions and the job above finished after the other; running the switch
    and hosts at nice -10 did not cure it."""
    return _measure(args)


def _measure(args: argparse.Namespace) -> tuple[list[dict], dict]:
    rows: list[dict] = []
    prefix = f"io{os.getpid() % 10000}"
    with bmv2.Bmv2([1, 2, 3, PS_PORT, 5], prefix=prefix,
                   target_args=("--priority-queues", str(n.TC_CLASSES))) as sw:  # fmt: skip
        assert sw.proc is not None
        setup(sw, args.depth)
        tid = egress_thread(sw)
        with cpu_cap(tid, args.quota_us, args.period_us):
            line = {"pps": line_rate(sw), "quota_us": args.quota_us, "period_us": args.period_us}
            print(f"line: {line['pps']:.0f} packets/s (thread {tid} capped at {args.quota_us} "
                  f"us per {args.period_us} us)", file=sys.stderr)  # fmt: skip
            with bmv2.Hosts(sw, [1, 2, 3, PS_PORT, 5]) as h:
                servers_host(sw, h, args.ack_pace_mbit)
                for run in range(args.runs):
                    for arm in args.arms.split(","):
                        classes = classes_for(arm)
                        sw.cli(f"table_clear {n.TC_TABLE}")
                        entries = [class_entry(JOBS[j][0], c) for j, c in classes.items() if c]
                        if entries:
                            sw.cli(*entries)
                        # who starts first alternates by run: the start-up stagger cancels
                        got = run_arm(h, args, "A" if run % 2 == 0 else "B")
                        r = summarise(arm, run, classes, got)
                        rows.append(r)
                        print(f"run {run} {arm:9s} A (class {classes['A']}) "
                              f"{r['A_iter_ms']:.0f} ms/it done {r['A_done_s']:.2f} s, "
                              f"B (class {classes['B']}) {r['B_iter_ms']:.0f} ms/it done "
                              f"{r['B_done_s']:.2f} s, mean {r['mean_done_s']:.2f} s",
                              file=sys.stderr, flush=True)  # fmt: skip
    return rows, line


def cell(rows: list[dict], key: str, fmt: str) -> str:
    v = [r[key] for r in rows]
    return f"{statistics.median(v):{fmt}} [{min(v):{fmt}}, {max(v):{fmt}}]"


def render(rows: list[dict], args: argparse.Namespace, line: dict) -> str:
    lines = [
        f"2 jobs x 2 workers, {args.size} elements x {args.iterations} iterations each, "
        f"window {args.window}, retransmission timer {args.timeout_ms:g} ms; one port whose "
        f"egress thread is capped at {line['quota_us']} us per {line['period_us']} us (it "
        f"served {line['pps']:.0f} packets/s of a flood), {args.depth} packets per class, "
        f"the servers' host paced at {args.ack_pace_mbit:g} Mbit/s; median over "
        f"{args.runs} runs [min, max]",
        "",
        "| arm | class A | class B | A ms / iteration | B ms / iteration | A done (s)"
        " | B done (s) | mean completion (s) | makespan (s) | data through the port (pkt/s)"
        " | retransmissions |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm in args.arms.split(","):
        mine = [r for r in rows if r["arm"] == arm]
        c = mine[0]["classes"]
        retrans = sum(r["A_retransmissions"] + r["B_retransmissions"] for r in mine)
        lines.append(
            f"| {arm} | {c['A']} | {c['B']} | {cell(mine, 'A_iter_ms', '.0f')} | "
            f"{cell(mine, 'B_iter_ms', '.0f')} | {cell(mine, 'A_done_s', '.2f')} | "
            f"{cell(mine, 'B_done_s', '.2f')} | {cell(mine, 'mean_done_s', '.2f')} | "
            f"{cell(mine, 'makespan_s', '.2f')} | {cell(mine, 'data_pps', '.0f')} | "
            f"{retrans} |"
        )
    return "\n".join(lines) + "\n"


def paired(rows: list[dict]) -> dict[str, tuple[Interval, int]]:
    """The order's effect, paired by run (every arm of a run shares its minute of the
    machine): per run, 1 - x/y of the job put first against the same job in one class
    (`first vs one-class`), of the job put second likewise (`second vs one-class`), of the
    first against the second in the same arm (`first vs second`), and of the arm's mean
    completion against one class's; mean over runs with its 95% Student-t interval, both
    orders (A-first, B-first) pooled. Negative: slower."""
    by_run: dict[int, dict[str, dict]] = {}
    for r in rows:
        by_run.setdefault(r["run"], {})[r["arm"]] = r
    out: dict[str, list[float]] = {}
    for arms in by_run.values():
        one = arms.get("one-class")
        for arm, first, second in (("A-first", "A", "B"), ("B-first", "B", "A")):
            r = arms.get(arm)
            if r is None:
                continue
            f, s = r[f"{first}_done_s"], r[f"{second}_done_s"]
            out.setdefault("first vs second", []).append(1 - f / s)
            if one is not None:
                out.setdefault("first vs one-class", []).append(1 - f / one[f"{first}_done_s"])
                out.setdefault("second vs one-class", []).append(1 - s / one[f"{second}_done_s"])
                out.setdefault("mean completion vs one-class", []).append(
                    1 - r["mean_done_s"] / one["mean_done_s"]
                )
        c0 = arms.get("class-0")
        if c0 is not None and one is not None:
            out.setdefault("class-0 mean completion vs one-class", []).append(
                1 - c0["mean_done_s"] / one["mean_done_s"]
            )
    return {k: (Interval.of(v), len(v)) for k, v in out.items()}


def render_paired(rows: list[dict]) -> str:
    runs = len({r["run"] for r in rows})
    lines = [
        f"Paired by run over {runs} runs (both orders pooled): the reduction 1 - x/y of "
        "completion time, mean [95% interval]; positive is sooner",
        "",
        "| x against y | reduction | samples |",
        "|---|---|---|",
    ]
    for k, (iv, count) in paired(rows).items():
        lines.append(f"| {k} | {iv.fmt(100, '%')} | {count} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], args: argparse.Namespace, path: Path) -> None:
    """Each job's completion per arm: bars the median run, dots each run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = args.arms.split(",")
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for k, (job, colour) in enumerate((("A", "C0"), ("B", "C1"))):
        for i, arm in enumerate(arms):
            v = [r[f"{job}_done_s"] for r in rows if r["arm"] == arm]
            x = i + (k - 0.5) * 0.38
            ax.bar(x, statistics.median(v), width=0.36, color=colour,
                   label=f"job {job}" if i == 0 else None)  # fmt: skip
            ax.plot([x] * len(v), v, "k.", ms=4)
    labels = []
    for arm in arms:
        c = next(r["classes"] for r in rows if r["arm"] == arm)
        labels.append(f"{arm}\n(A {c['A']}, B {c['B']})")
    ax.set_xticks(range(len(arms)), labels, fontsize=8)
    ax.set_ylabel("job finished (s from first send)")
    ax.legend(fontsize=8)
    ax.set_title(f"two symmetric jobs, one bmv2 port, {args.runs} runs (bars: median)",
                 fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--size", type=int, default=2048, help="tensor elements per iteration")
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--window", type=int, default=32, help="slots per worker")
    ap.add_argument("--depth", type=int, default=1000, help="packets per class, every port")
    ap.add_argument(
        "--timeout-ms",
        type=float,
        default=1000.0,
        help="workers' retransmission timer; a job in the lower class waits (and retransmits "
        "into its queue) while the higher one sends",
    )
    ap.add_argument("--quota-us", type=int, default=1000, help="egress thread's CPU per period")
    ap.add_argument("--period-us", type=int, default=40000)
    ap.add_argument(
        "--ack-pace-mbit", type=float, default=8.0, help="the servers' host sends at most this"
    )
    ap.add_argument("--out", type=Path, help="a directory for order_bmv2.{json,md,png}")
    args = ap.parse_args(argv)
    for arm in args.arms.split(","):
        if arm not in ARMS:
            ap.error(f"--arms: {arm!r} is not one of {', '.join(ARMS)}")
    if min(args.quota_us, args.period_us) < MIN_PERIOD_US or args.quota_us > args.period_us:
        ap.error(f"--quota-us and --period-us: at least {MIN_PERIOD_US}, quota <= period")
    return args


def main() -> None:
    args = parse()
    if (reason := skip_reason()) is not None:
        raise SystemExit(f"order_bmv2: {reason}")
    rows, line = measure(args)
    table = render(rows, args, line) + "\n" + render_paired(rows)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        meta = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        doc = {"args": meta, "line": line, "rows": rows}
        (args.out / "order_bmv2.json").write_text(json.dumps(doc, indent=1))
        (args.out / "order_bmv2.md").write_text(table)
        plot(rows, args, args.out / "order_bmv2.png")


if __name__ == "__main__":
    main()
