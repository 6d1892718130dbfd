"""Segmented sends (UDP_SEGMENT) and coalesced reads (UDP_GRO) in the C data path: a batch
is one send and one read in the kernel, yet the wire carries the same datagrams as without,
the sums stay exact, and a route that refuses segmentation gets datagram by datagram."""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from agg_agent import native
from agg_agent.endpoints import ParameterServer, Worker
from agg_agent.fixedpoint import FixedPoint
from agg_agent.protocol import FLAG_RETRANSMIT, LANES, AggPacket

from .test_runs_and_failures import together

pytestmark = pytest.mark.skipif(native.reason() is not None, reason=str(native.reason()))

UDP_GRO = getattr(socket, "UDP_GRO", 104)
W = 2


class GroRelay:
    """Between the workers and a PS: reads with UDP_GRO on, so a segmented batch arrives as
    one message, and cuts it at the size the kernel reports (this test's own reading of
    the control message, independent of datapath.c's); records every datagram and
    forwards it, one by one, to the PS."""

    def __init__(self, next_hop: tuple[str, int]) -> None:
        self.next_hop = next_hop
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.IPPROTO_UDP, UDP_GRO, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.address = self.sock.getsockname()
        self.datagrams: list[bytes] = []
        self.coalesced = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> GroRelay:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.sock.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                data, anc, _, _ = self.sock.recvmsg(1 << 16, socket.CMSG_SPACE(4))
            except TimeoutError:
                continue
            size = len(data)
            for level, kind, value in anc:
                if level == socket.IPPROTO_UDP and kind == UDP_GRO:
                    size = struct.unpack("i", value[:4])[0]
            if size < len(data):
                self.coalesced += 1
            for off in range(0, len(data), size):
                self.datagrams.append(data[off : off + size])
                self.sock.sendto(data[off : off + size], self.next_hop)


def through_relay(mode: str, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[int, list[bytes]], int]:
    """One bucket from C workers (AGG_GSO=`mode`) through a GroRelay to the Python PS: per
    worker, its first transmissions in order; and how many messages came coalesced."""
    monkeypatch.setenv("AGG_GSO", mode)
    fp = FixedPoint(1.0, W)
    ps = ParameterServer(5, fp, None, [("127.0.0.1", 9)] * W, datapath="python")
    rng = np.random.default_rng(3)
    qs = [rng.integers(-(2**20), 2**20, 40 * LANES + 5).astype(np.int32) for _ in range(W)]
    with GroRelay(ps.address) as relay:
        ws = [Worker(5, w, fp, relay.address, 64, timeout=1.0, deadline_s=60, datapath="native")
              for w in range(W)]  # fmt: skip
        ps.workers = [w.address for w in ws]
        t = threading.Thread(target=ps.serve, daemon=True)
        t.start()
        try:
            got = together([lambda w=w, q=q: w.exchange(q, end=True)[1]
                            for w, q in zip(ws, qs, strict=True)])  # fmt: skip
        finally:
            ps.stop()
            t.join(10)
            for w in ws:
                w.close()
            ps.close()
    exact = np.sum(np.array(qs, np.int64), axis=0)
    for g in got:
        assert not isinstance(g, BaseException), g
        assert np.array_equal(g, exact)
    firsts: dict[int, list[bytes]] = {}
    for d in relay.datagrams:
        p = AggPacket.decode(d)  # each one a whole packet of the wire format
        if not p.flags & FLAG_RETRANSMIT and not p.is_join:  # the run each PS drew aside
            firsts.setdefault(p.worker_id, []).append(d[:16] + bytes(4) + d[20:])
    return firsts, relay.coalesced


def test_segmented_batches_are_the_same_datagrams_on_the_wire(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plain, plain_coalesced = through_relay("off", monkeypatch)
    seg, seg_coalesced = through_relay("on", monkeypatch)
    assert plain_coalesced == 0  # nothing to coalesce without segmented sends
    assert seg_coalesced > 0  # the batches did go as segmented sends
    assert sorted(plain) == sorted(seg) == list(range(W))
    for w in range(W):
        assert len(seg[w]) == 41  # 40 * 32 + 5 values: 41 chunks, each sent once first
        assert seg[w] == plain[w]  # byte for byte, in the same order


@pytest.mark.parametrize("lanes", [LANES, 8 * LANES])
def test_c_workers_and_c_server_batch_both_ways_with_exact_sums(
    lanes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No switch between them: the workers' windows go as segmented sends, the server's
    acknowledgements to each worker too, and both read them coalesced."""
    counts = {}
    for mode in ("off", "auto"):
        monkeypatch.setenv("AGG_GSO", mode)
        before = native.gso_stats()
        fp = FixedPoint(1.0, W)
        ps = ParameterServer(5, fp, None, [("127.0.0.1", 9)] * W, datapath="native", lanes=lanes)
        ws = [Worker(5, w, fp, ps.address, 128, timeout=0.5, deadline_s=60, datapath="native",
                     lanes=lanes)
              for w in range(W)]  # fmt: skip
        ps.workers = [w.address for w in ws]
        t = threading.Thread(target=ps.serve, daemon=True)
        t.start()
        rng = np.random.default_rng(5)
        try:
            for n in (1, 33, 7 * lanes + 5, 300 * lanes):
                qs = [rng.integers(-(2**29), 2**29, n).astype(np.int32) for _ in range(W)]
                got = together([lambda w=w, q=q: w.exchange(q)[1]
                                for w, q in zip(ws, qs, strict=True)])  # fmt: skip
                exact = np.sum(np.array(qs, np.int64), axis=0)
                for g in got:
                    assert not isinstance(g, BaseException), g
                    assert np.array_equal(g, exact), (mode, n)
        finally:
            ps.stop()
            t.join(10)
            for w in ws:
                w.close()
            ps.close()
        after = native.gso_stats()
        counts[mode] = (after[0] - before[0], after[1] - before[1])
    assert counts["off"] == (0, 0)
    sends, reads = counts["auto"]
    assert sends > 0 and reads > 0, counts


FALLBACK = textwrap.dedent("""
    import subprocess, threading, numpy as np
    subprocess.run(["ip", "link", "set", "lo", "up", "mtu", "1500"], check=True)
    from agg_agent import native
    from agg_agent.endpoints import ParameterServer, Worker
    from agg_agent.fixedpoint import FixedPoint
    fp = FixedPoint(1.0, 2)
    ps = ParameterServer(5, fp, None, [("127.0.0.1", 9)] * 2, datapath="native", lanes=4096)
    ws = [Worker(5, w, fp, ps.address, 16, timeout=0.5, deadline_s=60, datapath="native",
                 lanes=4096) for w in range(2)]
    ps.workers = [w.address for w in ws]
    threading.Thread(target=ps.serve, daemon=True).start()
    qs = [np.arange(50_000, dtype=np.int32) * (w + 1) for w in range(2)]
    out = [None, None]
    def go(i):
        out[i] = ws[i].exchange(qs[i], end=True)[1]
    ts = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    [t.start() for t in ts]; [t.join(120) for t in ts]
    assert all(np.array_equal(o, np.arange(50_000) * 3) for o in out), out
    print("refused", native.gso_stats()[2])
""")


def test_a_route_that_refuses_segmentation_falls_back_datagram_by_datagram() -> None:
    """Packets of 4,096 values (16,404 B) over a loopback of MTU 1,500, in a network
    namespace of their own: the kernel refuses them as segments (only a plain datagram may
    be fragmented); the C path says so once and sends them one by one, sums exact."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        pytest.skip("needs root, unshare and ip to give a loopback MTU 1,500 in a namespace")
    r = subprocess.run(
        ["unshare", "--net", sys.executable, "-c", FALLBACK], capture_output=True, text=True,
        timeout=300, env={**os.environ, "AGG_GSO": "on"},
    )  # fmt: skip
    if r.returncode != 0 and "unshare failed" in r.stderr:
        pytest.skip(f"no network namespace here: {r.stderr.strip()[-200:]}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "refused True" in r.stdout
    assert "refused UDP segmentation" in r.stderr  # said, once, in the log
    assert r.stderr.count("refused UDP segmentation") == 1
