"""What a wider aggregation packet costs bmv2: the committed pipeline (32 values a packet)
against variants compiled with 64 and 128 (AGG_LANES), side by side in one run.

    uv run python p4/host-agent/benchmarks/lanes_bmv2.py [--lanes 32,64,128] [--chunks 3000]
        [--rounds 3] [--out docs/benchmarks]          (make bench-lanes; root, bmv2, p4c)

Per variant: a simple_switch on veth pairs (log off), one job of 2 workers aggregated into
a pool of 64 slots; both workers send their chunks a window of 64 at a time and wait for
the window's sums at the parameter server's port, as the protocol does. Measured: chunks
summed a second, values summed a second, and the switch's CPU seconds per packet in. The
variants are built into a temporary folder from the committed sources by changing
AGG_LANES and what follows from it (cells, UDP length, one register action per lane);
nothing in p4/ changes. Writes `lanes_bmv2.json` and prints the table of
docs/benchmarks/training.md ("Chunk size").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))

from p4.frames import udp_frame, udp_payload  # noqa: E402

from agg_agent import p4names as n  # noqa: E402
from agg_agent.protocol import FLAG_AGGREGATED, UDP_PORT, AggPacket  # noqa: E402
from p4 import bmv2  # noqa: E402

PS = 3
ANY = "0&&&0"
POOL = 16


def variant(lanes: int, into: Path) -> Path:
    """The pipeline compiled with `lanes` values a packet (the committed one for 32)."""
    if lanes == 32:
        return ROOT / n.BMV2_JSON_PATH
    shift = lanes.bit_length() - 1
    if 1 << shift != lanes:
        raise SystemExit(f"--lanes: {lanes} is not a power of two")
    src = into / f"p4-{lanes}"
    shutil.copytree(ROOT / "p4", src, ignore=shutil.ignore_patterns("build", "host-agent"))
    d = src / "include" / "defines.p4"
    text = d.read_text()
    text = re.sub(r"#define AGG_LANES 32", f"#define AGG_LANES {lanes}", text)
    text = re.sub(r"AGG_UDP_LEN = 156", f"AGG_UDP_LEN = {28 + 4 * lanes}", text)
    text = re.sub(r"AGG_LANE_CELLS = 32768", f"AGG_LANE_CELLS = {1024 * lanes}", text)
    d.write_text(text)
    a = src / "include" / "aggregation.p4"
    text = a.read_text().replace("slot << 5", f"slot << {shift}")
    more = "".join(f"        LANE({i})\n" for i in range(32, lanes))
    a.write_text(text.replace("        LANE(31)\n", "        LANE(31)\n" + more))
    p4c = bmv2.tool("p4c-bm2-ss")
    if p4c is None:
        raise SystemExit("p4c-bm2-ss not found (PATH or /opt/p4/bin): the variants need it")
    out = src / "build" / "innet_agg.json"
    out.parent.mkdir(exist_ok=True)
    subprocess.run([p4c, "--std", "p4-16", "--Wdisable", "-o", str(out), "innet_agg.p4"],
                   cwd=src, check=True, capture_output=True)  # fmt: skip
    return out


def fwd_to(ip_last: int, port: int) -> str:
    key = [ANY] * 5 + [f"0x0a0000{ip_last:02x}&&&0xffffffff"] + [ANY] * 3
    return f"table_add {n.FWD_TABLE} {n.FWD_SET_EGRESS_PORT} {' '.join(key)} => {port} 10"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(program: Path, lanes: int, chunks: int) -> dict:
    with bmv2.Bmv2([1, 2, PS], program=program) as sw:
        sw.cli(fwd_to(PS, PS), f"table_add {n.AGG_JOB_TABLE} {n.AGG_SET_JOB} 7 => 0 {POOL} 2 {PS}")
        ports = {i: bmv2.RawPort(sw.host_if(i)) for i in sw.ports}
        try:
            frames = [
                [udp_frame(w + 1, PS, 40000 + w, UDP_PORT, AggPacket(
                    7, seq % POOL, w, 2, seq, 1 << w, 0, tuple([w + 1] * lanes)).encode())
                 for seq in range(chunks)]
                for w in range(2)
            ]  # fmt: skip
            assert sw.proc is not None
            summed, lost = 0, 0
            cpu0, t0 = cpu_seconds(sw.proc.pid), time.perf_counter()
            for lo in range(0, chunks, POOL):
                hi = min(chunks, lo + POOL)
                for seq in range(lo, hi):
                    ports[1].send(frames[0][seq])
                    ports[2].send(frames[1][seq])
                got = ports[PS].frames(2.0, want=hi - lo)
                for f in got:
                    pkt = AggPacket.decode(udp_payload(f, UDP_PORT) or b"")
                    assert pkt.flags & FLAG_AGGREGATED and pkt.values == (3,) * lanes, pkt
                summed += len(got)
                lost += hi - lo - len(got)
            secs, cpu = time.perf_counter() - t0, cpu_seconds(sw.proc.pid) - cpu0
        finally:
            for p in ports.values():
                p.close()
    return {"lanes": lanes, "chunks": chunks, "summed": summed, "lost": lost, "seconds": secs,
            "switch_cpu_s": cpu, "chunks_per_s": summed / secs,
            "values_per_s": summed * lanes / secs,
            "cpu_us_per_packet_in": 1e6 * cpu / (2 * chunks)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lanes", default="32,64,128")
    ap.add_argument("--chunks", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks")
    args = ap.parse_args()
    why = bmv2.skip_reason()
    if why:
        raise SystemExit(f"lanes_bmv2: {why}")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {load}", flush=True)
    widths = [int(x) for x in args.lanes.split(",")]
    runs: list[dict] = []
    with tempfile.TemporaryDirectory() as d:
        programs = {w: variant(w, Path(d)) for w in widths}
        for r in range(args.rounds):  # alternating, so the machine's moments are shared
            for w in widths:
                row = {"round": r, **measure(programs[w], w, args.chunks)}
                runs.append(row)
                print(f"round {r}, {w:>4} values: {row['chunks_per_s']:,.0f} chunks/s, "
                      f"{row['values_per_s']:,.0f} values/s, "
                      f"{row['cpu_us_per_packet_in']:.0f} us CPU/packet, lost {row['lost']}",
                      flush=True)  # fmt: skip
    out = {"started_load": load, "ended_load": os.getloadavg(), "runs": runs}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "lanes_bmv2.json").write_text(json.dumps(out, indent=1))
    base = {k: sorted(x[k] for x in runs if x["lanes"] == widths[0])[args.rounds // 2]
            for k in ("chunks_per_s", "values_per_s", "cpu_us_per_packet_in")}  # fmt: skip
    print("\n| values a packet | chunks summed /s | values summed /s | switch CPU per packet in "
          "| values /s against 32 |\n|---|---|---|---|---|")  # fmt: skip
    for w in widths:
        med = {k: sorted(x[k] for x in runs if x["lanes"] == w)[args.rounds // 2]
               for k in base}  # fmt: skip
        print(f"| {w} | {med['chunks_per_s']:,.0f} | {med['values_per_s']:,.0f} | "
              f"{med['cpu_us_per_packet_in']:.0f} µs | "
              f"{med['values_per_s'] / base['values_per_s']:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
