"""The host agent's CLI through bmv2: three workers and a PS in network namespaces.

A configured job arrives at the PS as aggregates only; an unconfigured one as raw
packets (the fallback); both sums are exact within the fixed-point bound.
Skipped where bmv2 is not installed (CI machines), with the reason.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import numpy as np
import pytest

from agg_agent import p4names as n
from agg_agent.fixedpoint import FixedPoint
from agg_agent.protocol import LANES, UDP_PORT

from . import bmv2

REASON = bmv2.skip_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=str(REASON))

WORKERS, PS, SIZE, ITERATIONS, SEED = 3, 4, 200, 2, 11
AGENT = [sys.executable, "-c", "from agg_agent.cli import main; main()"]
ANY = "0&&&0"


@pytest.fixture(scope="module")
def hosts() -> Iterator[bmv2.Hosts]:
    with bmv2.Bmv2([1, 2, 3, 4], prefix=f"ib{bmv2.os.getpid() % 10000}") as sw:
        for i in range(1, 5):
            key = [ANY] * 5 + [f"0x0a0000{i:02x}&&&0xffffffff"] + [ANY] * 3
            sw.cli(f"table_add {n.FWD_TABLE} {n.FWD_SET_EGRESS_PORT} {' '.join(key)} => {i} 10")
        sw.cli(f"table_add {n.AGG_JOB_TABLE} {n.AGG_SET_JOB} 7 => 0 8 {WORKERS} {PS}")
        with bmv2.Hosts(sw, [1, 2, 3, 4]) as h:
            yield h


def run_job(hosts: bmv2.Hosts, job: int, first_seq: int = 0) -> tuple[list[dict], list[list[dict]]]:
    """The PS's rows per iteration, and each worker's."""
    common = ["--job", str(job), "--size", str(SIZE), "--iterations", str(ITERATIONS),
              "--first-seq", str(first_seq)]  # fmt: skip
    ps = hosts.run(
        PS,
        [*AGENT, "ps", *common, "--bind", f"10.0.0.{PS}:{UDP_PORT}"]
        + [a for w in range(WORKERS) for a in ("--worker-addr", f"10.0.0.{w + 1}:{UDP_PORT}")],
    )
    # A chunk the switch completes before the PS listens is lost, and the workers' resends
    # then arrive raw: the PS must listen before any worker sends.
    hosts.wait_udp_listening(PS, UDP_PORT, ps)
    workers = [
        hosts.run(
            w + 1,
            [
                *AGENT,
                "worker",
                *common,
                *("--workers", str(WORKERS), "--worker-id", str(w), "--window", "8"),
                *("--ps", f"10.0.0.{PS}:{UDP_PORT}", "--bind", f"10.0.0.{w + 1}:{UDP_PORT}"),
                *("--seed", str(SEED), "--timeout-ms", "200"),
            ],
        )
        for w in range(WORKERS)
    ]
    rows: list[list[dict]] = []
    try:
        for p in workers:
            wout, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
            rows.append([json.loads(ln) for ln in wout.splitlines() if ln.startswith("{")])
        out, err = ps.communicate(timeout=60)
        assert ps.returncode == 0, err
    finally:
        for p in (*workers, ps):
            if p.poll() is None:
                p.kill()
                p.wait()
    return [json.loads(line) for line in out.splitlines()], rows


def expected_heads() -> list[np.ndarray]:
    # The worker CLI's tensors: uniform in [-bound, bound] from default_rng(seed + worker_id).
    rngs = [np.random.default_rng(SEED + w) for w in range(WORKERS)]
    return [sum(r.uniform(-1.0, 1.0, SIZE) for r in rngs)[:4] for _ in range(ITERATIONS)]


@pytest.mark.parametrize(
    ("job", "aggregated", "first_seq"),
    [(7, True, 0), (9, False, 0), (7, True, 2**32 - 10)],
    ids=["aggregated", "raw", "across-the-wrap"],
)
def test_iterations_complete_with_the_exact_sum(
    hosts: bmv2.Hosts, job: int, aggregated: bool, first_seq: int
) -> None:
    """`across-the-wrap`: 7 chunks an iteration from seq 2^32 - 10: the second iteration
    crosses 2^32 - 1 -> 0 in bmv2's registers, which compare seqs modulo 2^32."""
    results, worker_rows = run_job(hosts, job, first_seq)
    chunks = -(-SIZE // LANES)
    bound = FixedPoint.for_bound(1.0, WORKERS).error_bound
    assert [r["iteration"] for r in results] == list(range(ITERATIONS))
    for it, (r, head) in enumerate(zip(results, expected_heads(), strict=True)):
        assert np.max(np.abs(np.array(r["sum_head"]) - head)) <= bound
        # every worker got the PS's sum back through bmv2, bit for bit
        assert all(w[it]["sum_head"] == r["sum_head"] for w in worker_rows), (r, worker_rows)
        if aggregated:
            # One packet per chunk from the switch. On a loaded machine a worker's 200 ms
            # timer can fire (one CI run saw a whole iteration resent): a worker that
            # started 200-400 ms before the others resends each chunk once, the
            # retransmission flushes the chunk's partial sum (its own packet) up as the
            # aggregate, and the others' packets for that chunk, arriving after, pass the
            # switch raw (aggregation.p4: a free slot, the same seq as the last). So raw
            # packets come only from chunks a retransmission flushed, at most the other
            # WORKERS - 1 contributors each (CI run 19: 14 raw after 7 retransmissions).
            resent = sum(w[it]["retransmissions"] for w in worker_rows)
            assert r["aggregated_packets"] == chunks, r
            assert r["raw_packets"] <= (WORKERS - 1) * resent, (r, resent)
        else:
            assert r["aggregated_packets"] == 0 and r["raw_packets"] == WORKERS * chunks
