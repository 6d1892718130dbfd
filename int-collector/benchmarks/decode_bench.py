"""Collector throughput: decode only, decode + state, and end to end over UDP loopback.

    uv run python int-collector/benchmarks/decode_bench.py [--seconds 5] [--rates 50000 100000]

End to end: the generator runs in its own process and sends at a fixed rate; the collector
(receive loop, decode, state, change-driven writes to a real InfluxDB 1.8.10 started here)
runs in this process. Loss is 1 - decoded / sent. Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import threading
import time

from int_collector.generator import SyntheticFabric, generate
from int_collector.influxd import InfluxServer, default_binary
from int_collector.service import Collector
from int_collector.settings import load_settings
from int_collector.state import Fabric
from int_collector.wire import Decoder


def pool(family: str, switches: int = 16, n: int = 1000) -> list[bytes]:
    f = SyntheticFabric(switches, seed=1, family=family)
    return [f.random_report()[1] for _ in range(n)]


def decode_rate(data: list[bytes], seconds: float, with_state: bool) -> float:
    dec = Decoder()
    fab = Fabric(load_settings(None))
    decode, observe = dec.decode, fab.observe
    n = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for d in data:
            for r in decode(d):
                if with_state:
                    observe(r, 1)
        n += len(data)
    return n / (time.perf_counter() - start)


def _gen(port: int, rate: float, seconds: float, out: mp.Queue) -> None:
    out.put(generate(("127.0.0.1", port), rate, 16, duration_s=seconds, seed=2))


def end_to_end(rate: float, seconds: float, server: InfluxServer | None) -> dict[str, float]:
    kw: dict[str, object] = dict(listen_host="127.0.0.1", listen_port=0, http_port=0)
    if server is not None:
        kw.update(influx_url=server.url, influx_bucket=server.bucket)
    c = Collector(load_settings(None, **kw))
    t = threading.Thread(target=c.run, daemon=True)
    t.start()
    q: mp.Queue = mp.Queue()
    p = mp.Process(target=_gen, args=(c.port, rate, seconds, q))
    cpu0 = time.process_time()
    p.start()
    sent = q.get()
    p.join()
    time.sleep(0.5)  # let the socket drain
    cpu = time.process_time() - cpu0
    c.stop()
    t.join()
    c.close()
    return {
        "offered": rate,
        "sent": sent,
        "achieved_send_rate": sent / seconds,
        "decoded": c.decoded,
        "loss": 1 - c.decoded / sent if sent else 0.0,
        "points": c.writer.written,
        "collector_cpu": cpu / (seconds + 0.5),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rates", type=float, nargs="*", default=[25_000, 50_000, 100_000])
    args = ap.parse_args()
    print(f"CPU cores: {os.cpu_count()}, load average at start: {os.getloadavg()[0]:.2f}\n")
    print("| report | bytes | decode only (reports/s) | decode + state (reports/s) |")
    print("|---|---|---|---|")
    for family, label in (("v2", "TR v2.0 + INT-MD v2.1, 1 or 3 hops, 7 fields"),
                          ("v1", "ONOS v1.0, 1 or 3 hops, 4 fields")):  # fmt: skip
        data = pool(family)
        size = sum(map(len, data)) / len(data)
        d = decode_rate(data, args.seconds, False)
        s = decode_rate(data, args.seconds, True)
        print(f"| {label} | {size:.0f} | {d:,.0f} | {s:,.0f} |")
    server = None
    if default_binary().is_file():
        server = InfluxServer()
        server.start()
    where = "1.8.10 (local)" if server else "none (writes fail, backlog grows)"
    print(f"\nEnd to end over UDP loopback, {args.seconds:.0f} s per rate, InfluxDB: {where}\n")
    print(
        "| offered (reports/s) | sent | achieved send rate | decoded | loss "
        "| points written | collector CPU |"
    )
    print("|---|---|---|---|---|---|---|")
    try:
        for rate in args.rates:
            r = end_to_end(rate, args.seconds, server)
            print(
                f"| {rate:,.0f} | {r['sent']:,} | {r['achieved_send_rate']:,.0f} "
                f"| {r['decoded']:,} | {100 * r['loss']:.3f}% | {r['points']:,} "
                f"| {100 * r['collector_cpu']:.0f}% |"
            )
    finally:
        if server is not None:
            server.stop(remove=True)


if __name__ == "__main__":
    main()
