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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))

from agg_agent import p4names as n  # noqa: E402
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
    for UDP port 7000 towards the servers' port, and this reads its reports on `INT_PORT`;
    each report's hop latency is the time the heartbeat spent in the switch, its queue
    included (bmv2's timestamps, microseconds). Free of the hosts' scheduling, unlike the
    round trip the prober measures."""

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


def run_once(
    hosts: bmv2.Hosts,
    args: argparse.Namespace,
    scheme: str,
    probe: Path,
    hops: HeartbeatHops | None = None,
) -> dict:
    jobs = {1: ([1, 2], "10.0.0.5"), 2: ([3, 4], PS2_IP)}
    procs: list[tuple[str, int, subprocess.Popen[str]]] = []
    common = ["--size", str(args.size), "--iterations", str(args.iterations)]
    for job, (workers, ps_ip) in jobs.items():
        addrs = [f"10.0.0.{w}:{bmv2_port()}" for w in workers]
        ps_cmd = [AGENT, "ps", "--job", str(job), "--bind", f"{ps_ip}:{bmv2_port()}", *common]
        for a in addrs:
            ps_cmd += ["--worker-addr", a]
        procs.append(("ps", job, hosts.run(PS_PORT, ps_cmd)))
    for job, (_, _ps_ip) in jobs.items():
        hosts.wait_udp_listening(PS_PORT, bmv2_port(), procs[job - 1][2])
    echo = hosts.run(PS_PORT, [sys.executable, str(probe), "echo", "0", "7000", "0", "600"])
    hosts.wait_udp_listening(PS_PORT, 7000, echo)
    if hops:
        hops.take()  # from this run only
    prober = hosts.run(
        1,
        [sys.executable, str(probe), "probe", "10.0.0.5", "7000", str(args.probe_ms / 1000), "600"],
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
                "--ps", f"{ps_ip}:{bmv2_port()}", "--window", str(args.window),
                "--cc", scheme, "--bdp", str(args.bdp), "--target-queue", str(args.target),
                "--cc-step", str(args.step),
                "--bind", f"10.0.0.{w}:{bmv2_port()}", *common,
            ]  # fmt: skip
            procs.append(("worker", job, hosts.run(w, cmd)))
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


def bmv2_port() -> int:
    return 48879  # the aggregation protocol's UDP port (the parser keys on it)


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
    return {
        "scheme": run["scheme"],
        "queue_p50": pct(flat, 0.5),
        "queue_p99": pct(flat, 0.99),
        "hb_p50_ms": pct(rtts, 0.5),
        "hb_p99_ms": pct(rtts, 0.99),
        "hb_loss": 1 - len(rtts) / sent if sent else float("nan"),
        # in the switch, from its INT reports (ms)
        "hb_switch_p50_ms": pct(run.get("hb_switch_us", []), 0.5) / 1e3,
        "hb_switch_p99_ms": pct(run.get("hb_switch_us", []), 0.99) / 1e3,
        "goodput": total_pkts / longest / rate if longest else 0.0,
        # of what the port had left: its measured service rate less the heartbeats' and
        # the background's packets
        "goodput_left": total_pkts / longest / (capacity - other) if longest else 0.0,
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
    ap.add_argument("--bdp", type=float, default=2.0)
    ap.add_argument("--target", type=float, default=1.0)
    ap.add_argument("--step", type=float, default=1.0, help="explicit: W_AI, packets per RTT")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--iterations", type=int, default=25)
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
    args = ap.parse_args()
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
            hops = HeartbeatHops(sw)
            hops.start()
            try:
                idle = idle_rtt(h, probe)
                idle_sw = hops.take()
                idle["switch_p50"] = pct(idle_sw, 0.5) / 1e3
                idle["switch_p99"] = pct(idle_sw, 0.99) / 1e3
                print(f"idle heartbeat in the switch (INT, {len(idle_sw)} reports): p50 "
                      f"{idle['switch_p50']:.3f} ms, p99 {idle['switch_p99']:.3f} ms",
                      file=sys.stderr)  # fmt: skip
                capacity = service_rate(h, probe, args.rate)
                idle["service_pps"] = capacity
                print(f"the port serves {capacity:.0f} pkt/s of {args.rate} set", file=sys.stderr)
                print(f"idle heartbeat round trip: p50 {idle['p50']:.2f} ms, p99 "
                      f"{idle['p99']:.2f} ms", file=sys.stderr)  # fmt: skip
                for run in range(args.runs):
                    for scheme in args.schemes.split(","):
                        k = args.ecn_k if scheme == "dctcp" else 0
                        sw.cli(f"table_set_default {n.ECN_TABLE} {n.ECN_SET_THRESHOLD} {k}")
                        t0 = time.monotonic()
                        run_ = run_once(h, args, scheme, probe, hops)
                        got = summarise(run_, args.rate, capacity, not args.heartbeat_class)
                        got["run"] = run
                        rows.append(got)
                        print(
                            f"run {run} {scheme:9s} queue p50/p99 {got['queue_p50']}/"
                            f"{got['queue_p99']}  heartbeat p50/p99 {got['hb_p50_ms']:.1f}/"
                            f"{got['hb_p99_ms']:.1f} ms (in switch {got['hb_switch_p50_ms']:.2f}/"
                            f"{got['hb_switch_p99_ms']:.2f}) loss {got['hb_loss']:.1%}  goodput "
                            f"{got['goodput']:.2f} (of what is left {got['goodput_left']:.2f})  "
                            f"jain {got['jain']:.3f}  "
                            f"stalled {got['stalled']}  ({time.monotonic() - t0:.0f} s)",
                            file=sys.stderr,
                            flush=True,
                        )
                        time.sleep(1.0)  # the queue drains
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
        plot(rows, args, args.out / f"{args.name}.png")


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


def idle_rtt(hosts: bmv2.Hosts, probe: Path, seconds: float = 2.0) -> dict[str, float]:
    """The heartbeat's round trip with nothing else on the port."""
    echo = hosts.run(PS_PORT, [sys.executable, str(probe), "echo", "0", "7000", "0", "6"])
    hosts.wait_udp_listening(PS_PORT, 7000, echo)
    p = hosts.run(1, [sys.executable, str(probe), "probe", "10.0.0.5", "7000", "0.005",
                      str(seconds)])  # fmt: skip
    out, _ = p.communicate(timeout=30)
    echo.wait(timeout=30)
    rtts = [x * 1e3 for x in json.loads(out.strip().splitlines()[-1])["rtts"]]
    return {"p50": pct(rtts, 0.5), "p99": pct(rtts, 0.99)}


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


def plot(rows: list[dict], args: argparse.Namespace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    schemes = args.schemes.split(",")
    panels = [
        ("queue_p99", "queue p99 (packets)"),
        ("hb_switch_p99_ms", "heartbeat in the switch p99 (ms, INT)"),
        ("goodput", "goodput / bottleneck rate"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(11, 3.2))
    for ax, (key, label) in zip(axes, panels, strict=True):
        for i, s in enumerate(schemes):
            v = [r[key] for r in rows if r["scheme"] == s]
            ax.bar(i, statistics.median(v), color=f"C{i}")
            ax.plot([i] * len(v), v, "k.", ms=4)
        ax.set_xticks(range(len(schemes)), schemes)
        ax.set_title(label, fontsize=10)
        if key in ("hb_switch_p99_ms", "queue_p99"):
            ax.set_yscale("log")
    fig.suptitle(
        f"{args.rate} pkt/s bottleneck, 2 jobs x 2 workers, {args.runs} runs (bars: median)",
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
        f"{idle['switch_p50']:.3f} ms, p99 {idle['switch_p99']:.3f} ms",
        "",
        "| scheme | queue p50 (pkts) | queue p99 (pkts) | heartbeat RTT p50 (ms)"
        " | heartbeat RTT p99 (ms) | heartbeat in switch p50 (ms) | heartbeat in switch p99 (ms)"
        " | heartbeat loss | goodput / rate | goodput / port left | background (pkt/s)"
        " | Jain (jobs) | retransmissions | runs stalled |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
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
            f"{cell('background_pps', '.0f')} | {cell('jain', '.3f')} | "
            f"{cell('retransmissions', '.0f')} | {sum(1 for r in mine if r['stalled'])} of "
            f"{len(mine)} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
