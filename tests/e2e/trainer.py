"""The processes of the closed-loop test, each run in a host's network namespace with this
workspace's interpreter: a training job's workers and parameter server (the host agent's
endpoints, `agg_agent.endpoints`, driven for as long as the test wants instead of a fixed
count), a paced UDP sender of background traffic, and a sink for it.

    python trainer.py worker --worker-id 0 --workers 2 --job 1 --ps 10.0.0.3 ...
    python trainer.py ps --workers 2 --job 1 --worker-addr 10.0.0.1 --worker-addr 10.0.0.2
    python trainer.py background --to 10.0.0.5:5001 --pps 750 --size 144
    python trainer.py sink --port 5001

A worker prints one JSON line per iteration: its wall-clock end (`t`, time.time()), its
duration (first chunk sent to last acknowledgement) and retransmissions; it runs until killed.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
import time

UDP_PORT = 48879  # agg_agent.protocol.UDP_PORT; the background modes start without numpy


def worker(a: argparse.Namespace) -> None:
    import numpy as np

    from agg_agent.endpoints import Worker
    from agg_agent.fixedpoint import FixedPoint

    fixed = FixedPoint.for_bound(1.0, a.workers)
    w = Worker(
        a.job,
        a.worker_id,
        fixed,
        (a.ps, UDP_PORT),
        window=a.window,
        timeout=a.timeout_ms / 1000,
        max_retries=10_000,  # a congested path must slow the job down, not end it
        bind=(a.bind, UDP_PORT),
    )
    rng = np.random.default_rng(a.worker_id)
    tensor = rng.uniform(-1.0, 1.0, a.size)
    while True:
        s = w.run_iteration(tensor)
        line = {"t": time.time(), "iteration": s.iteration, "seconds": s.seconds}
        print(json.dumps({**line, "retransmissions": s.retransmissions}), flush=True)


def parameter_server(a: argparse.Namespace) -> None:
    from agg_agent.endpoints import ParameterServer
    from agg_agent.fixedpoint import FixedPoint

    fixed = FixedPoint.for_bound(1.0, len(a.worker_addr))
    ps = ParameterServer(
        a.job,
        fixed,
        a.size,
        [(h, UDP_PORT) for h in a.worker_addr],
        bind=("0.0.0.0", UDP_PORT),
    )
    # Exact sums are checked by every completed chunk (FixedPoint.check_sum); the iterations
    # are counted by the workers.
    ps.run(1_000_000, deadline=a.deadline_s)


def background(a: argparse.Namespace) -> None:
    host, port = a.to.rsplit(":", 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    payload = bytes(a.size)
    start, sent = time.perf_counter(), 0
    while True:
        due = int((time.perf_counter() - start) * a.pps)
        while sent < due:
            s.sendto(payload, (host, int(port)))
            sent += 1
        time.sleep(0.001)


def sink(a: argparse.Namespace) -> None:
    # Bound and never read: datagrams beyond the buffer are dropped without an ICMP answer.
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", a.port))
    signal.pause()


def main() -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker")
    w.add_argument("--worker-id", type=int, required=True)
    w.add_argument("--workers", type=int, required=True)
    w.add_argument("--job", type=int, required=True)
    w.add_argument("--ps", required=True)
    w.add_argument("--bind", required=True)
    w.add_argument("--size", type=int, default=512)
    w.add_argument("--window", type=int, default=8)
    w.add_argument("--timeout-ms", type=float, default=300.0)
    ps = sub.add_parser("ps")
    ps.add_argument("--job", type=int, required=True)
    ps.add_argument("--worker-addr", action="append", required=True)
    ps.add_argument("--size", type=int, default=512)
    ps.add_argument("--deadline-s", type=float, default=600.0)
    bg = sub.add_parser("background")
    bg.add_argument("--to", required=True)
    bg.add_argument("--pps", type=float, required=True)
    bg.add_argument("--size", type=int, default=144)
    sk = sub.add_parser("sink")
    sk.add_argument("--port", type=int, required=True)
    a = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    {"worker": worker, "ps": parameter_server, "background": background, "sink": sink}[a.cmd](a)


if __name__ == "__main__":
    main()
