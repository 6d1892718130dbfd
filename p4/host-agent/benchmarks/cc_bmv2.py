"""Congestion control on bmv2 (issue 18, docs/congestion.md): two jobs of two workers each
send to their parameter servers behind one port of one simple_switch, rate-limited to
RATE packets/s with a queue of DEPTH packets; a heartbeat prober shares that port. For
each scheme (fixed window, AIMD, DCTCP with ECN marking at K, the explicit rule) and run:
the queue the acknowledgements echoed (p50, p99), the heartbeats' round trip (p50, p99)
and loss, goodput as a fraction of RATE, and Jain's fairness between the two jobs.

Needs root (network namespaces) and simple_switch (/opt/p4 or PATH); the switch runs the
committed p4/build JSON. No aggregation entry is written: every worker's stream reaches
its parameter server raw, the incast whose queue the schemes must keep short.

    sudo .venv/bin/python p4/host-agent/benchmarks/cc_bmv2.py --runs 3 --out docs/congestion
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))

from agg_agent import p4names as n  # noqa: E402
from agg_agent.congestion import Explicit  # noqa: E402
from agg_agent.protocol import PACKET_BYTES  # noqa: E402
from int_collector.wire import Decoder  # noqa: E402
from p4 import bmv2, frames  # noqa: E402

PS_PORT = 5
PS2_IP = "10.0.0.7"  # the second job's parameter server: an alias on host 5
AGENT = str(ROOT / ".venv" / "bin" / "agg-agent")
ANY = "0&&&0"
SCHEMES = ("fixed", "aimd", "dctcp", "explicit")
BG_HOST, BG_PORT = 4, 7001  # background: from a worker's host to the servers' port
INT_PORT, REPORT_UDP = 6, 32766  # INT reports of the heartbeats leave on this switch port

PROBE = r"""
import json, socket, sys, time
mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
period, duration = float(sys.argv[4]), float(sys.argv[5])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
if mode == "echo":
    s.bind(("0.0.0.0", port))
    s.settimeout(duration)
    try:
        while True:
            data, addr = s.recvfrom(2048)
            s.sendto(data, addr)
    except TimeoutError:
        sys.exit(0)
if mode == "sink":  # count what arrives (until `duration` or SIGTERM)
    import signal
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    s.bind(("0.0.0.0", port))
    s.settimeout(0.2)
    n, first, last, end = 0, None, None, time.monotonic() + duration
    while time.monotonic() < end and not stop:
        try:
            s.recv(2048)
        except TimeoutError:
            continue
        last = time.monotonic()
        first = first or last
        n += 1
    print(json.dumps({"received": n, "seconds": (last - first) if n > 1 else 0.0}))
    sys.exit(0)
if mode == "blast":  # unresponsive background: `period` between packets, sent when due
    size, n, end = int(sys.argv[6]), 0, time.monotonic() + duration
    nxt = time.monotonic()
    while time.monotonic() < end:
        while time.monotonic() >= nxt:
            s.sendto(bytes(size), (host, port))
            n += 1
            nxt += period
        time.sleep(max(0.0, min(nxt - time.monotonic(), 0.001)))
    print(json.dumps({"sent": n}))
    sys.exit(0)
import signal
stop = []  # SIGTERM: the run it shares the port with is over
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
s.settimeout(0.001)
start = time.monotonic()
sent, rtts, seq, end = {}, [], 0, start + duration
nxt = start
def take_reply():
    try:
        k = int.from_bytes(s.recv(2048)[:4], "big")
        if k in sent:
            rtts.append(time.monotonic() - sent.pop(k))
    except TimeoutError:
        pass
while time.monotonic() < end and not stop:
    now = time.monotonic()
    if now >= nxt:
        s.sendto(seq.to_bytes(4, "big") + bytes(60), (host, port))
        sent[seq] = now
        seq += 1
        nxt += period
    take_reply()
# replies to the last probes still in flight: read them, not count them lost
drain = time.monotonic() + 0.5
while sent and time.monotonic() < drain:
    take_reply()
print(json.dumps({"sent": seq, "rtts": rtts, "seconds": time.monotonic() - start}))
"""


def fwd(sw: bmv2.Bmv2, ip_last: int, port: int) -> str:
    key = [ANY] * 5 + [f"0x0a0000{ip_last:02x}&&&0xffffffff"] + [ANY] * 3
    return f"table_add {n.FWD_TABLE} {n.FWD_SET_EGRESS_PORT} {' '.join(key)} => {port} 10"


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


class HeartbeatHops(threading.Thread):
    """The switch's own measure of the heartbeats' delay: the switch is INT source and sink
    for UDP port 7000 towards the servers' port, and this reads its reports on `INT_PORT`.
    A report is an ingress clone of the heartbeat, sent out `INT_PORT`: its hop latency runs
    from the heartbeat's arrival to the clone's egress, so it covers bmv2's input buffer and
    ingress pipeline (where a traffic class does not help), not the wait in the servers'
    port queue. Free of the hosts' scheduling, unlike the round trip the prober measures."""

    def __init__(self, sw: bmv2.Bmv2) -> None:
        super().__init__(daemon=True)
        self.port = bmv2.RawPort(sw.host_if(INT_PORT))
        self.decoder = Decoder()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.latencies_us: list[float] = []

    def run(self) -> None:
        while not self.stop.is_set():
            for frame in self.port.frames(0.1):
                payload = frames.udp_payload(frame, REPORT_UDP)
                if payload is None:
                    continue
                for r in self.decoder.decode(payload):
                    if r.flow is None or r.flow.dport != 7000:
                        continue
                    for hop in r.hops():
                        if hop.hop_latency is not None:
                            with self.lock:
                                self.latencies_us.append(hop.hop_latency / 1e3)

    def take(self) -> list[float]:
        """The latencies since the last call."""
        time.sleep(0.3)  # the last reports
        with self.lock:
            out, self.latencies_us = self.latencies_us, []
        return out

    def close(self) -> None:
        self.stop.set()
        self.join(2)
        self.port.close()


@dataclass(frozen=True)
class Scheme:
    """A scheme as `--schemes` names it: `fixed:W` (a fixed window of W), `dctcp:K`
    (marking at K packets), `explicit:S` (W_AI = S) or `explicit:S:M` (and the smallest
    window M chunks: 1 is the floor without pacing), `aimd`; without the suffix, the
    options' `--window`, `--ecn-k`, `--step`. Several settings of one scheme run side by
    side in one invocation."""

    cc: str
    window: int
    ecn_k: int
    step: float
    min_window: float = Explicit.min_window

    @staticmethod
    def parse(text: str, args: argparse.Namespace) -> Scheme:
        cc, _, param = text.partition(":")
        if cc not in SCHEMES:
            raise SystemExit(f"--schemes: {cc!r} is not one of {', '.join(SCHEMES)}")
        window, k, step = args.window, getattr(args, "ecn_k", 8), args.step
        floor = Explicit.min_window
        try:
            if param and cc == "fixed":
                window = int(param)
            elif param and cc == "dctcp":
                k = int(param)
            elif param and cc == "explicit":
                step_text, _, floor_text = param.partition(":")
                step = float(step_text)
                floor = float(floor_text) if floor_text else floor
                if not 0 < floor <= 1:
                    raise ValueError
            elif param:
                raise ValueError
        except ValueError:
            raise SystemExit(f"--schemes: {text!r}: bad or unexpected parameter") from None
        return Scheme(cc, window, k if cc == "dctcp" else 0, step, floor)


def run_once(
    hosts: bmv2.Hosts,
    args: argparse.Namespace,
    scheme: str,
    probe: Path,
    hops: HeartbeatHops | None = None,
) -> dict:
    spec = Scheme.parse(scheme, args)
    hosts_rt = getattr(args, "hosts_rt", 0)
    data_rt = fifo(hosts_rt)
    jobs = {1: ([1, 2], "10.0.0.5"), 2: ([3, 4], PS2_IP)}
    procs: list[tuple[str, int, subprocess.Popen[str]]] = []
    common = ["--size", str(args.size), "--iterations", str(args.iterations)]
    for job, (workers, ps_ip) in jobs.items():
        addrs = [f"10.0.0.{w}:{bmv2_port()}" for w in workers]
        ps_cmd = [AGENT, "ps", "--job", str(job), "--bind", f"{ps_ip}:{bmv2_port()}", *common]
        for a in addrs:
            ps_cmd += ["--worker-addr", a]
        procs.append(("ps", job, hosts.run(PS_PORT, [*data_rt, *ps_cmd])))
    for job, (_, _ps_ip) in jobs.items():
        hosts.wait_udp_listening(PS_PORT, bmv2_port(), procs[job - 1][2])
    control_rt = getattr(args, "control_rt", 0)
    rt = fifo(control_rt)
    echo = hosts.run(PS_PORT, [*rt, sys.executable, str(probe), "echo", "0", "7000", "0", "600"])
    hosts.wait_udp_listening(PS_PORT, 7000, echo)
    if hops:
        hops.take()  # from this run only
    prober = hosts.run(
        1,
        [
            *rt,
            sys.executable,
            str(probe),
            "probe",
            "10.0.0.5",
            "7000",
            str(args.probe_ms / 1000),
            "600",
        ],
    )  # fmt: skip  (until the workers are done: heartbeats share the port all along)
    background = []
    if args.background:
        sink = hosts.run(PS_PORT, [sys.executable, str(probe), "sink", "0", str(BG_PORT), "0",
                                   "600"])  # fmt: skip
        hosts.wait_udp_listening(PS_PORT, BG_PORT, sink)
        blast = hosts.run(BG_HOST, [sys.executable, str(probe), "blast", "10.0.0.5",
                                    str(BG_PORT), str(1.0 / args.background), "600",
                                    str(PACKET_BYTES)])  # fmt: skip
        background = [sink, blast]
    for job, (workers, ps_ip) in jobs.items():
        for i, w in enumerate(workers):
            cmd = [
                AGENT, "worker", "--worker-id", str(i), "--job", str(job), "--workers", "2",
                "--ps", f"{ps_ip}:{bmv2_port()}", "--window", str(spec.window),
                "--cc", spec.cc, "--bdp", str(args.bdp), "--target-queue", str(args.target),
                "--cc-step", str(spec.step), "--cc-min-window", str(spec.min_window),
                "--bind", f"10.0.0.{w}:{bmv2_port()}", *common,
            ]  # fmt: skip
            procs.append(("worker", job, hosts.run(w, [*data_rt, *cmd])))
    out: dict = {"scheme": scheme, "workers": [], "ps": [], "stalled": []}
    stalled_jobs: set[int] = set()
    # workers first: the parameter server of a job whose worker gave up is stopped, not
    # left waiting for its deadline
    for role, job, p in sorted(procs, key=lambda x: x[0] == "ps"):
        if role == "ps" and job in stalled_jobs:
            p.kill()
        stdout, stderr = p.communicate(timeout=600)
        if role == "ps" and job in stalled_jobs:
            out["ps"].append({"job": job, "rows": []})
            continue
        rows = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
        if p.returncode:
            # A worker out of retries (or its PS waiting for it): the job stalled. Kept as
            # a result: the iterations it finished count, and the run is marked.
            last = [ln for ln in stderr.splitlines() if "Error" in ln][-1:] or ["exit"]
            out["stalled"].append(f"{role} of job {job}: {last[0].strip()[:200]}")
            stalled_jobs.add(job)
            if "TimeoutError" not in stderr:
                raise RuntimeError(f"{role} of job {job} failed: {stderr[-2000:]}")
        out["workers" if role == "worker" else "ps"].append({"job": job, "rows": rows})
    if background:
        sink, blast = background
        blast.kill()
        blast.wait()
        sink.terminate()
        got = json.loads(sink.communicate(timeout=10)[0].strip().splitlines()[-1])
        out["background_pps"] = got["received"] / got["seconds"] if got["seconds"] else 0.0
    prober.terminate()
    probe_out, _ = prober.communicate(timeout=30)
    out["hb_switch_us"] = hops.take() if hops else []
    echo.kill()
    echo.wait(timeout=30)
    out["probe"] = json.loads(probe_out.strip().splitlines()[-1])
    return out


def fifo(priority: int) -> list[str]:
    """The prefix that runs a command at this SCHED_FIFO priority (none for 0)."""
    return ["chrt", "-f", str(priority)] if priority else []


def cpu_times() -> tuple[int, int]:
    """(all, stolen) CPU ticks since boot, every CPU (/proc/stat): a virtual machine's
    hypervisor may take time from it, which the switch and the hosts then lack."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields[:8]), fields[7]


def bmv2_port() -> int:
    return 48879  # the aggregation protocol's UDP port (the parser keys on it)


def steady_rate(workers: list[dict]) -> tuple[float, float]:
    """Chunks delivered per second while every worker is sending, and for how long: from
    the last worker's first send to the first worker's last acknowledgement (wall clock).
    The whole-run rate also counts the processes' staggered start (a worker's first
    iteration waits for its partner's) and the tail where one job runs alone."""
    runs = [w["rows"] for w in workers if w["rows"]]
    if len(runs) < len(workers) or any("started" not in r[0] for r in runs):
        return 0.0, 0.0
    t0 = max(r[0]["started"] for r in runs)
    t1 = min(r[-1]["finished"] for r in runs)
    if t1 <= t0:
        return 0.0, 0.0
    chunks = 0.0
    for rows in runs:
        for r in rows:
            s, e = r["started"], r["finished"]
            inside = min(e, t1) - max(s, t0)
            if inside > 0:  # the iteration's chunks, pro rata of its time in the window
                chunks += (r["packets"] - r["retransmissions"]) * inside / max(e - s, 1e-9)
    return chunks / (t1 - t0), t1 - t0


def summarise(run: dict, rate: float, capacity: float, heartbeats_share: bool = True) -> dict:
    """`heartbeats_share`: the heartbeats use the data's queue (class 0). In a class of
    their own they do not take from its rate: bmv2 limits each priority queue separately."""
    queues: dict[int, int] = {}
    per_job: dict[int, list[float]] = {}
    total_pkts = 0
    longest = 0.0
    retrans = 0
    for w in run["workers"]:
        if not w["rows"]:
            per_job.setdefault(w["job"], []).append(0.0)
            continue
        seconds = sum(r["seconds"] for r in w["rows"])
        pkts = sum(r["packets"] - r["retransmissions"] for r in w["rows"])
        retrans += sum(r["retransmissions"] for r in w["rows"])
        total_pkts += pkts
        longest = max(longest, seconds)
        per_job.setdefault(w["job"], []).append(pkts / seconds)
        for r in w["rows"]:
            for q, c in r["queue_counts"].items():
                queues[int(q)] = queues.get(int(q), 0) + c
    flat = [q for q, c in sorted(queues.items()) for _ in range(c)]
    job_rates = [sum(v) for v in per_job.values()]
    squares = sum(x * x for x in job_rates)
    jain = sum(job_rates) ** 2 / (len(job_rates) * squares) if squares else float("nan")
    rtts = [x * 1e3 for x in run["probe"]["rtts"]]
    hb_pps = run["probe"]["sent"] / run["probe"]["seconds"]
    other = (hb_pps if heartbeats_share else 0.0) + run.get("background_pps", 0.0)
    sent = run["probe"]["sent"]
    steady, overlap = steady_rate(run["workers"])
    return {
        "scheme": run["scheme"],
        "queue_p50": pct(flat, 0.5),
        "queue_p99": pct(flat, 0.99),
        "hb_p50_ms": pct(rtts, 0.5),
        "hb_p99_ms": pct(rtts, 0.99),
        "hb_loss": 1 - len(rtts) / sent if sent else float("nan"),
        "hb_lost": sent - len(rtts),
        # in the switch, from its INT reports (ms)
        "hb_switch_p50_ms": pct(run.get("hb_switch_us", []), 0.5) / 1e3,
        "hb_switch_p99_ms": pct(run.get("hb_switch_us", []), 0.99) / 1e3,
        "goodput": total_pkts / longest / rate if longest else 0.0,
        # of what the port had left: its measured service rate less the heartbeats' and
        # the background's packets
        "goodput_left": total_pkts / longest / (capacity - other) if longest else 0.0,
        # while all four workers send (steady_rate)
        "goodput_steady": steady / rate,
        "goodput_steady_left": steady / (capacity - other),
        "overlap_s": overlap,
        "heartbeat_pps": hb_pps,
        "background_pps": run.get("background_pps", 0.0),
        "jain": jain,
        "retransmissions": retrans,
        "stalled": len(run["stalled"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--rate", type=int, default=1000, help="bottleneck, packets/s")
    ap.add_argument("--depth", type=int, default=100, help="bottleneck queue, packets")
    ap.add_argument("--ecn-k", type=int, default=8, help="DCTCP marking threshold, packets")
    ap.add_argument("--window", type=int, default=32, help="slots: the most any scheme opens")
    ap.add_argument(
        "--bdp",
        type=float,
        default=0.0,
        help="explicit: B, packets (0: the port's rate x the aggregation round trip measured "
        "idle before the runs)",
    )
    ap.add_argument("--target", type=float, default=1.0)
    ap.add_argument("--step", type=float, default=1.0, help="explicit: W_AI, packets per RTT")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument(
        "--iterations",
        type=int,
        default=80,
        help="per worker; short runs count the processes' staggered start against goodput",
    )
    ap.add_argument("--probe-ms", type=float, default=5.0)
    ap.add_argument(
        "--background",
        type=float,
        default=0.0,
        help="unresponsive UDP through the bottleneck, packets/s (0: none)",
    )
    ap.add_argument("--out", type=Path)
    ap.add_argument("--name", default="cc_bmv2", help="file names under --out")
    ap.add_argument(
        "--heartbeat-class",
        type=int,
        default=0,
        help="put the heartbeats (UDP port 7000) in this strict-priority class (priority.p4); "
        "0: they share the data's queue",
    )
    ap.add_argument(
        "--switch-rt",
        type=int,
        default=0,
        help="run every simple_switch thread at this SCHED_FIFO priority (0: as the hosts): a "
        "switch whose pipeline does not wait for the hosts' CPU, as on hardware",
    )
    ap.add_argument(
        "--control-rt",
        type=int,
        default=0,
        help="run the heartbeat prober and echo server at this SCHED_FIFO priority (0: as the "
        "workers): a control thread with a core of its own, as on a host with cores to spare",
    )
    ap.add_argument(
        "--hosts-rt",
        type=int,
        default=0,
        help="run the workers and parameter servers at this SCHED_FIFO priority (0: not): "
        "senders woken when an acknowledgement arrives, as on hosts with cores of their own",
    )
    ap.add_argument("--replot", type=Path, help="a run's JSON: write its table and plot again")
    args = ap.parse_args()
    if args.replot:
        doc = json.loads(args.replot.read_text())
        saved = argparse.Namespace(**{**vars(args), **doc["args"], "replot": None})
        (args.replot.with_suffix(".md")).write_text(render(doc["rows"], saved, doc["idle_rtt_ms"]))
        plot(doc["rows"], saved, doc["idle_rtt_ms"], args.replot.with_suffix(".png"))
        return
    for text in args.schemes.split(","):
        Scheme.parse(text, args)  # refused before the switch starts
    if (reason := bmv2.skip_reason()) is not None:
        raise SystemExit(f"cc_bmv2: {reason}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.py"
        probe.write_text(PROBE)
        queues = ("--priority-queues", str(n.TC_CLASSES)) if args.heartbeat_class else ()
        with (
            bmv2.Bmv2([1, 2, 3, 4, PS_PORT, INT_PORT], target_args=queues) as sw,
            bmv2.Hosts(sw, [1, 2, 3, 4, PS_PORT]) as h,
        ):
            setup(sw, h, args)
            if args.switch_rt:
                assert sw.proc is not None
                subprocess.run(["chrt", "-a", "-f", "-p", str(args.switch_rt), str(sw.proc.pid)],
                               check=True)  # fmt: skip
            hops = HeartbeatHops(sw)
            hops.start()
            try:
                # The idle round trip is sampled before every run too, and pooled: on 2
                # shared cores its tail drifts with what else the machine does.
                idle_pool = idle_rtt(h, probe, rt=args.control_rt)
                idle = idle_stats(idle_pool)
                idle_sw = hops.take()
                idle["switch_p50"] = pct(idle_sw, 0.5) / 1e3
                idle["switch_p99"] = pct(idle_sw, 0.99) / 1e3
                print(f"idle heartbeat in the switch (INT, {len(idle_sw)} reports): p50 "
                      f"{idle['switch_p50']:.3f} ms, p99 {idle['switch_p99']:.3f} ms",
                      file=sys.stderr)  # fmt: skip
                capacity = service_rate(h, probe, args.rate)
                idle["service_pps"] = capacity
                # sampled before every run too and pooled, as the heartbeats' idle round
                # trip; the explicit rule's B is this first estimate, for every run
                data_pool = data_rtt(h, args.size, rt=args.hosts_rt)
                first = statistics.median(data_pool)
                print(f"idle aggregation round trip {first:.2f} ms: BDP "
                      f"{capacity * first / 1e3:.2f} packets", file=sys.stderr)  # fmt: skip
                if not args.bdp:
                    args.bdp = round(capacity * first / 1e3, 2)
                print(f"the port serves {capacity:.0f} pkt/s of {args.rate} set", file=sys.stderr)
                print(f"idle heartbeat round trip: p50 {idle['p50']:.2f} ms, p99 "
                      f"{idle['p99']:.2f} ms", file=sys.stderr)  # fmt: skip
                for run in range(args.runs):
                    for scheme in args.schemes.split(","):
                        k = Scheme.parse(scheme, args).ecn_k
                        sw.cli(f"table_set_default {n.ECN_TABLE} {n.ECN_SET_THRESHOLD} {k}")
                        t0 = time.monotonic()
                        idle_pool += idle_rtt(h, probe, rt=args.control_rt)
                        here = data_rtt(h, args.size, rt=args.hosts_rt)
                        data_pool += here
                        before = cpu_times()
                        run_ = run_once(h, args, scheme, probe, hops)
                        after = cpu_times()
                        got = summarise(run_, args.rate, capacity, not args.heartbeat_class)
                        got["steal"] = (after[1] - before[1]) / max(1, after[0] - before[0])
                        got["run"] = run
                        got["data_rtt_ms"] = statistics.median(here)  # just before the run
                        rows.append(got)
                        print(
                            f"run {run} {scheme:9s} queue p50/p99 {got['queue_p50']}/"
                            f"{got['queue_p99']}  heartbeat p50/p99 {got['hb_p50_ms']:.1f}/"
                            f"{got['hb_p99_ms']:.1f} ms (in switch {got['hb_switch_p50_ms']:.2f}/"
                            f"{got['hb_switch_p99_ms']:.2f}) loss {got['hb_loss']:.1%}  goodput "
                            f"{got['goodput']:.2f} (of what is left {got['goodput_left']:.2f}; all "
                            f"sending {got['goodput_steady_left']:.2f} over "
                            f"{got['overlap_s']:.1f} s)  "
                            f"jain {got['jain']:.3f}  steal {got['steal']:.0%}  "
                            f"stalled {got['stalled']}  ({time.monotonic() - t0:.0f} s)",
                            file=sys.stderr,
                            flush=True,
                        )
                        time.sleep(1.0)  # the queue drains
                idle |= idle_stats(idle_pool)
                idle["data_rtt"] = statistics.median(data_pool)
                idle["data_rtt_range"] = [min(data_pool), max(data_pool)]
                idle["bdp_pkts"] = capacity * idle["data_rtt"] / 1e3
                print(f"idle aggregation round trip, pooled ({len(data_pool)}): p50 "
                      f"{idle['data_rtt']:.2f} ms: BDP {idle['bdp_pkts']:.2f} packets",
                      file=sys.stderr)  # fmt: skip
                print(f"idle heartbeat round trip, pooled ({len(idle_pool)}): p50 "
                      f"{idle['p50']:.2f} ms, p99 {idle['p99']:.2f} ms",
                      file=sys.stderr)  # fmt: skip
            finally:
                hops.close()
    table = render(rows, args, idle)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        meta = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        doc = {"args": meta, "idle_rtt_ms": idle, "rows": rows}
        (args.out / f"{args.name}.json").write_text(json.dumps(doc, indent=1))
        (args.out / f"{args.name}.md").write_text(table)
        plot(rows, args, idle, args.out / f"{args.name}.png")


def setup(sw: bmv2.Bmv2, h: bmv2.Hosts, args: argparse.Namespace) -> None:
    """Routes to every host, the bottleneck on the parameter servers' port, the second
    server's address, and the heartbeats' class."""
    if args.heartbeat_class:
        key = [ANY] * 7 + ["7000&&&0xffff"]  # l4_dst_port (p4names.TC_MATCH_FIELDS)
        sw.cli(
            f"table_add {n.TC_TABLE} {n.TC_SET_CLASS} {' '.join(key)} => {args.heartbeat_class} 100"
        )
    watch = [ANY, ANY, "17&&&0xff", ANY, "7000&&&0xffff"]  # p4names.INT_WATCHLIST_MATCH_FIELDS
    sw.cli(
        # INT for the heartbeats towards the servers: this switch is source and sink and
        # sends each report to INT_PORT (HeartbeatHops reads them)
        f"table_set_default {n.INT_SWITCH_TABLE} {n.INT_SET_SWITCH} 1",
        f"table_add {n.INT_WATCHLIST_TABLE} {n.INT_SOURCE} {' '.join(watch)} => 8 0xfd00 10",
        f"table_add {n.INT_SINK_TABLE} {n.INT_SET_SINK} {PS_PORT} =>",
        f"table_set_default {n.REPORT_TABLE} {n.REPORT_SET_COLLECTOR} "
        f"00:00:00:00:00:fe 00:00:00:00:00:06 10.0.9.254 10.0.9.1 {REPORT_UDP}",
        f"mirroring_add {n.REPORT_CLONE_SESSION} {INT_PORT}",
        *(fwd(sw, i, i) for i in (1, 2, 3, 4, 5)),
        fwd(sw, 7, PS_PORT),
        f"set_queue_rate {args.rate} {PS_PORT}",
        f"set_queue_depth {args.depth} {PS_PORT}",
    )
    ex = ("ip", "netns", "exec")
    subprocess.run([*ex, h.ns(PS_PORT), "ip", "addr", "add", f"{PS2_IP}/24", "dev",
                    sw.host_if(PS_PORT)], check=True)  # fmt: skip
    for i in (1, 2, 3, 4):
        subprocess.run([*ex, h.ns(i), "ip", "neigh", "add", PS2_IP, "lladdr",
                        f"00:00:00:00:00:{PS_PORT:02x}", "dev", sw.host_if(i)],
                       check=True)  # fmt: skip


def idle_rtt(hosts: bmv2.Hosts, probe: Path, seconds: float = 2.0, rt: int = 0) -> list[float]:
    """The heartbeats' round trips (ms) with nothing else on the port, at the priority the
    runs give the prober and echo server."""
    pre = fifo(rt)
    echo = hosts.run(PS_PORT, [*pre, sys.executable, str(probe), "echo", "0", "7000", "0",
                               str(seconds + 4)])  # fmt: skip
    hosts.wait_udp_listening(PS_PORT, 7000, echo)
    p = hosts.run(1, [*pre, sys.executable, str(probe), "probe", "10.0.0.5", "7000", "0.005",
                      str(seconds)])  # fmt: skip
    out, _ = p.communicate(timeout=30)
    echo.wait(timeout=30)
    return [x * 1e3 for x in json.loads(out.strip().splitlines()[-1])["rtts"]]


def idle_stats(rtts: list[float]) -> dict[str, float]:
    return {"p50": pct(rtts, 0.5), "p99": pct(rtts, 0.99), "samples": len(rtts)}


def data_rtt(hosts: bmv2.Hosts, size: int, iterations: int = 8, rt: int = 0) -> list[float]:
    """The aggregation protocol's own round trip on the idle fabric (ms, one value per
    iteration after the first): one job, window 1, so each chunk waits for the one before
    it; the time per chunk is a worker's send, the switch, the parameter server's sum and
    its acknowledgement. With the port's rate it gives the data path's bandwidth-delay
    product, the unit of the queue target."""
    common = ["--size", str(size), "--iterations", str(iterations)]
    ps_cmd = [AGENT, "ps", "--job", "1", "--bind", f"10.0.0.5:{bmv2_port()}", *common]
    for w in (1, 2):
        ps_cmd += ["--worker-addr", f"10.0.0.{w}:{bmv2_port()}"]
    pre = fifo(rt)  # as the runs will have them
    ps = hosts.run(PS_PORT, [*pre, *ps_cmd])
    hosts.wait_udp_listening(PS_PORT, bmv2_port(), ps)
    workers = []
    for i, w in enumerate((1, 2)):
        cmd = [
            AGENT, "worker", "--worker-id", str(i), "--job", "1", "--workers", "2",
            "--ps", f"10.0.0.5:{bmv2_port()}", "--window", "1",
            "--bind", f"10.0.0.{w}:{bmv2_port()}", *common,
        ]  # fmt: skip
        workers.append(hosts.run(w, [*pre, *cmd]))
    per_chunk = []
    for p in workers:
        out, err = p.communicate(timeout=120)
        if p.returncode:
            raise RuntimeError(f"data_rtt worker: {err[-500:]}")
        rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        per_chunk += [r["seconds"] / (r["packets"] - r["retransmissions"]) for r in rows[1:]]
    ps.communicate(timeout=30)
    return [x * 1e3 for x in per_chunk]


def service_rate(hosts: bmv2.Hosts, probe: Path, rate: int, seconds: float = 4.0) -> float:
    """What the bottleneck port delivers when offered twice its set rate of packets the
    size of the aggregation protocol's: bmv2 sharing the hosts' 2 cores may serve less than
    it is set to, and goodput is measured against what it can serve."""
    sink = hosts.run(PS_PORT, [sys.executable, str(probe), "sink", "0", str(BG_PORT), "0",
                               str(seconds + 2)])  # fmt: skip
    hosts.wait_udp_listening(PS_PORT, BG_PORT, sink)
    blast = hosts.run(BG_HOST, [sys.executable, str(probe), "blast", "10.0.0.5", str(BG_PORT),
                                str(0.5 / rate), str(seconds), str(PACKET_BYTES)])  # fmt: skip
    blast.communicate(timeout=seconds + 30)
    got = json.loads(sink.communicate(timeout=seconds + 30)[0].strip().splitlines()[-1])
    time.sleep(1.0)  # the queue drains
    return got["received"] / got["seconds"] if got["seconds"] else float("nan")


def plot(rows: list[dict], args: argparse.Namespace, idle: dict[str, float], path: Path) -> None:
    """Each target's measure per scheme, its line drawn: bars the median run, dots each run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    schemes = args.schemes.split(",")
    panels = [
        ("queue_p99", "queue p99 (packets)", 2 * idle["bdp_pkts"], "2 BDP"),
        ("hb_p99_ms", "heartbeat round trip p99 (ms)", 2 * idle["p99"], "2x idle p99"),
        ("hb_switch_p99_ms", "heartbeat in the switch p99 (ms, INT)", None, ""),
        ("goodput_steady_left", "goodput / port left, all sending", 0.9, "0.9"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(15, 3.6))
    for ax, (key, label, line, line_label) in zip(axes, panels, strict=True):
        for i, s in enumerate(schemes):
            v = [r[key] for r in rows if r["scheme"] == s]
            ax.bar(i, statistics.median(v), color=f"C{i}")
            ax.plot([i] * len(v), v, "k.", ms=4)
        if line is not None:
            ax.axhline(line, color="r", ls="--", lw=1, label=line_label)
        if key == "hb_p99_ms":  # the strict reading: against the idle median
            ax.axhline(2 * idle["p50"], color="0.4", ls=":", lw=1, label="2x idle p50")
        if line is not None:
            ax.legend(fontsize=8, loc="upper left")
        ax.set_xticks(range(len(schemes)), schemes, rotation=35, ha="right", fontsize=8)
        ax.set_title(label, fontsize=10)
        if key != "goodput_steady_left":
            ax.set_yscale("log")
    bg = f", {args.background:g} pkt/s background" if args.background else ""
    fig.suptitle(
        f"{args.rate} pkt/s bottleneck, 2 jobs x 2 workers{bg}, heartbeats in class "
        f"{args.heartbeat_class}, {args.runs} runs (bars: median)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def render(rows: list[dict], args: argparse.Namespace, idle: dict[str, float]) -> str:
    lines = [
        f"bottleneck {args.rate} pkt/s, queue {args.depth} packets, 2 jobs x 2 workers, "
        f"window {args.window}, explicit B={args.bdp} q_t={args.target} W_AI={args.step}, "
        f"DCTCP K={args.ecn_k}; "
        f"heartbeats in class {args.heartbeat_class}; "
        f"median over {args.runs} runs [min, max]; idle heartbeat round trip p50 "
        f"{idle['p50']:.2f} ms, p99 {idle['p99']:.2f} ms; the port served "
        f"{idle['service_pps']:.0f} pkt/s when offered {2 * args.rate}; background "
        f"{args.background:g} pkt/s offered; idle heartbeat in the switch (INT) p50 "
        f"{idle['switch_p50']:.3f} ms, p99 {idle['switch_p99']:.3f} ms; idle aggregation round "
        f"trip p50 {idle['data_rtt']:.2f} ms (pooled over the runs), so BDP {idle['bdp_pkts']:.2f} "
        f"packets; switch threads "
        f"at SCHED_FIFO {args.switch_rt or 'no'}, prober and echo at {args.control_rt or 'no'}, "
        f"workers and servers at {args.hosts_rt or 'no'}",
        "",
        "| scheme | queue p50 (pkts) | queue p99 (pkts) | heartbeat RTT p50 (ms)"
        " | heartbeat RTT p99 (ms) | heartbeat in switch p50 (ms) | heartbeat in switch p99 (ms)"
        " | heartbeat loss | goodput / rate | goodput / port left"
        " | goodput / port left, all sending | background (pkt/s)"
        " | Jain (jobs) | retransmissions | runs stalled | CPU stolen by the hypervisor |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for scheme in args.schemes.split(","):
        mine = [r for r in rows if r["scheme"] == scheme]

        def cell(key: str, fmt: str, mine: list[dict] = mine) -> str:
            v = [r[key] for r in mine]
            mid, lo, hi = (format(x, fmt) for x in (statistics.median(v), min(v), max(v)))
            return f"{mid} [{lo}, {hi}]"

        lines.append(
            f"| {scheme} | {cell('queue_p50', '.0f')} | {cell('queue_p99', '.0f')} | "
            f"{cell('hb_p50_ms', '.1f')} | {cell('hb_p99_ms', '.1f')} | "
            f"{cell('hb_switch_p50_ms', '.2f')} | {cell('hb_switch_p99_ms', '.2f')} | "
            f"{cell('hb_loss', '.1%')} | "
            f"{cell('goodput', '.2f')} | {cell('goodput_left', '.2f')} | "
            f"{cell('goodput_steady_left', '.2f')} | "
            f"{cell('background_pps', '.0f')} | {cell('jain', '.3f')} | "
            f"{cell('retransmissions', '.0f')} | {sum(1 for r in mine if r['stalled'])} of "
            f"{len(mine)} | {cell('steal', '.0%') if 'steal' in mine[0] else 'n/a'} |"
        )
    lines += [
        "",
        "Against the targets (every run): queue p99 at most 2 BDP; heartbeat round-trip p99 at "
        "most 2x the idle one (p99 to p99; also shown against the idle p50), no heartbeat lost; "
        "goodput at least 0.9 of what the port had left while all four workers send.",
        "",
        "| scheme | queue p99 / 2 BDP | heartbeat p99 / idle p99 | heartbeat p99 / idle p50"
        " | heartbeats lost | goodput, all sending | all four met, runs |",
        "|---|---|---|---|---|---|---|",
    ]
    two_bdp = 2 * idle["bdp_pkts"]
    for scheme in args.schemes.split(","):
        mine = [r for r in rows if r["scheme"] == scheme]
        met = sum(
            r["queue_p99"] <= two_bdp
            and r["hb_p99_ms"] <= 2 * idle["p99"]
            and r["hb_loss"] == 0
            and r["goodput_steady_left"] >= 0.9
            for r in mine
        )
        worst_q = max(r["queue_p99"] for r in mine) / two_bdp
        worst_hb = max(r["hb_p99_ms"] for r in mine)
        lines.append(
            f"| {scheme} | {worst_q:.2f} | {worst_hb / idle['p99']:.2f} | "
            f"{worst_hb / idle['p50']:.2f} | {sum(r['hb_lost'] for r in mine)} | "
            f"{min(r['goodput_steady_left'] for r in mine):.2f} | {met} of {len(mine)} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
