"""Decentralized training between worker processes (docs/peers.md): asynchronous gossip
SGD over TCP, each worker picking one peer per iteration with the probabilities NetMax (or
a baseline) gives it.

The model is L2-regularised logistic regression in numpy on data every worker generates
from a shared seed (no downloads): worker i trains on its own shard, features shifted per
worker so the shards are not identically distributed, and can evaluate any model on all
shards. One iteration of worker i:

1. a gradient step on its shard (`compute_s` is a floor: it sleeps the rest);
2. pick peer m with probability p_im; send its model to m over TCP; m answers with its
   own model and keeps the average; i keeps the average too (the two are not atomic: an
   exchange that m serves meanwhile is averaged in as well);
3. every `eval_every` iterations, the loss of its model on every shard's first 50 samples
   (`Problem.eval_set`) goes to its log.

Each worker serves its peers' exchanges from a thread, so it answers while it computes.
Frames: 4-byte magic, 4-byte length, then float64 values, big-endian.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = b"GSP1"


@dataclass(frozen=True)
class Problem:
    workers: int
    features: int = 200
    samples: int = 200
    seed: int = 0
    l2: float = 1e-3

    def shard(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Worker i's samples: features N(0, 1) shifted per worker, scaled by
        1/sqrt(features) so that one learning rate suits every model size."""
        rng = np.random.default_rng([self.seed, 7])
        w_true = rng.normal(size=self.features)
        r = np.random.default_rng([self.seed, 11, i])
        x = r.normal(size=(self.samples, self.features)) + r.normal(scale=0.5, size=self.features)
        x /= np.sqrt(self.features)
        p = 1.0 / (1.0 + np.exp(-2.0 * (x @ w_true)))
        return x, (r.random(self.samples) < p).astype(float)

    def eval_set(self, per_shard: int = 50) -> tuple[np.ndarray, np.ndarray]:
        """The first `per_shard` samples of every shard: the loss every worker reports."""
        parts = [self.shard(i) for i in range(self.workers)]
        return (
            np.vstack([p[0][:per_shard] for p in parts]),
            np.concatenate([p[1][:per_shard] for p in parts]),
        )

    def all(self) -> tuple[np.ndarray, np.ndarray]:
        parts = [self.shard(i) for i in range(self.workers)]
        return np.vstack([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def loss(self, w: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
        z = x @ w
        return float(np.mean(np.logaddexp(0.0, z) - y * z) + 0.5 * self.l2 * (w @ w))

    def grad(self, w: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return x.T @ (1.0 / (1.0 + np.exp(-(x @ w))) - y) / len(y) + self.l2 * w

    def optimum(self, steps: int = 2000, lr: float = 5.0) -> float:
        """The loss, on `eval_set`, of the model trained by gradient descent on all data."""
        x, y = self.all()
        w = np.zeros(self.features)
        for _ in range(steps):
            w -= lr * self.grad(w, x, y)
        return self.loss(w, *self.eval_set())


def _send(sock: socket.socket, v: np.ndarray) -> None:
    data = v.astype(">f8").tobytes()
    sock.sendall(MAGIC + struct.pack("!I", len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionError("peer closed the connection")
        buf += chunk
    return bytes(buf)


def _recv(sock: socket.socket) -> np.ndarray:
    head = _recv_exact(sock, 8)
    if head[:4] != MAGIC:
        raise ConnectionError("not a gossip frame")
    (n,) = struct.unpack("!I", head[4:])
    return np.frombuffer(_recv_exact(sock, n), dtype=">f8").astype(np.float64)


def load_probabilities(source: str, me: int, peers: list[str]) -> np.ndarray:
    """Worker `me`'s row: from a file or URL holding a peer plan (the service's
    `GET /api/v1/jobs/{id}/peers` answer, or `agg-optimizer peers` output)."""
    if source.startswith(("http://", "https://")):
        with urllib.request.urlopen(source, timeout=10) as r:
            plan = json.load(r)
    else:
        plan = json.loads(Path(source).read_text())
    names = plan["workers"]
    row = plan["probabilities"][names[me]]
    p = np.array([float(row.get(names[m], 0.0)) for m in range(len(peers))])
    if p[me] != 0 or p.sum() <= 0:
        raise ValueError(f"probabilities: row of {names[me]} is not a distribution over peers")
    return p / p.sum()


def _gradient(
    problem: Problem, w: np.ndarray, x: np.ndarray, y: np.ndarray, floor_s: float
) -> np.ndarray:
    """A local gradient that takes at least `floor_s` (the compute time being modelled)."""
    t0 = time.monotonic()
    g = problem.grad(w, x, y)
    rest = floor_s - (time.monotonic() - t0)
    if rest > 0:
        time.sleep(rest)
    return g


class _LossLog:
    """(seconds since start, loss on the evaluation set) every `every` iterations, kept and
    written as JSON lines to `path` if given."""

    def __init__(self, problem: Problem, path: Path | None, every: int) -> None:
        self.problem, self.every = problem, every
        self.x, self.y = problem.eval_set()
        self.start = time.monotonic()
        self.points: list[tuple[float, float]] = []
        self.fh = path.open("w") if path else None

    def after(self, it: int, w: np.ndarray) -> None:
        if it % self.every:
            return
        point = (time.monotonic() - self.start, self.problem.loss(w, self.x, self.y))
        self.points.append(point)
        if self.fh:
            self.fh.write(json.dumps({"t": point[0], "loss": point[1], "it": it}) + "\n")
            self.fh.flush()

    def close(self) -> None:
        if self.fh:
            self.fh.close()


class GossipWorker:
    def __init__(
        self,
        me: int,
        peers: list[tuple[str, int]],
        problem: Problem,
        probabilities: np.ndarray,
        lr: float = 5.0,
        compute_s: float = 0.0,
        eval_every: int = 10,
        seed: int = 0,
    ) -> None:
        self.me, self.peers, self.problem = me, peers, problem
        self.p = probabilities
        self.lr, self.compute_s, self.eval_every = lr, compute_s, eval_every
        self.x, self.y = problem.shard(me)
        self.w = np.zeros(problem.features)
        self.lock = threading.Lock()
        self.rng = np.random.default_rng([seed, me])
        self.exchanges_served = 0
        self.failed_exchanges = 0
        self._stop = threading.Event()
        self.server = socket.create_server(peers[me], reuse_port=False)
        self.server.settimeout(0.2)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._exchange_in, args=(conn,), daemon=True).start()

    def _exchange_in(self, conn: socket.socket) -> None:
        with conn:
            try:
                theirs = _recv(conn)
                with self.lock:
                    mine = self.w.copy()
                    self.w = (self.w + theirs) / 2.0
                    self.exchanges_served += 1
                _send(conn, mine)
            except (OSError, ConnectionError):
                return

    def _exchange_out(self, m: int) -> None:
        with self.lock:
            mine = self.w.copy()
        with socket.create_connection(self.peers[m], timeout=30) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _send(s, mine)
            theirs = _recv(s)
        with self.lock:
            self.w = (self.w + theirs) / 2.0

    def wait_for_peers(self, timeout_s: float = 30.0) -> None:
        """Until every peer listens, so that the workers' clocks start together (a worker
        that starts or ends alone trains on its own shard only and drifts)."""
        deadline = time.monotonic() + timeout_s
        for m, addr in enumerate(self.peers):
            while m != self.me:
                try:
                    socket.create_connection(addr, timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"peers[{m}]: {addr} not listening") from None
                    time.sleep(0.05)

    def run(self, duration_s: float, log: Path | None = None) -> list[tuple[float, float]]:
        """Train for `duration_s`; returns (seconds since start, loss on the eval set)."""
        losses = _LossLog(self.problem, log, self.eval_every)
        it = 0
        try:
            while time.monotonic() - losses.start < duration_s:
                with self.lock:
                    w = self.w.copy()
                g = _gradient(self.problem, w, self.x, self.y, self.compute_s)
                with self.lock:
                    self.w -= self.lr * g
                m = int(self.rng.choice(len(self.peers), p=self.p))
                try:
                    self._exchange_out(m)
                except (OSError, ConnectionError):
                    self.failed_exchanges += 1  # the peer is gone (its run ended first)
                it += 1
                if it % self.eval_every == 0:
                    with self.lock:
                        w = self.w.copy()
                    losses.after(it, w)
        finally:
            losses.close()
        return losses.points

    def close(self) -> None:
        self._stop.set()
        self.server.close()


class AllReduceWorker:
    """The synchronous baseline: every iteration, ring all-reduce of the gradients over TCP
    (reduce-scatter then all-gather, 2 (n - 1) steps of 1/n of the vector each, every step
    paced by the slowest link of the ring), then the same step on every worker: gradient
    descent on all the data, as data-parallel training with all-reduce does."""

    def __init__(
        self,
        me: int,
        peers: list[tuple[str, int]],
        problem: Problem,
        lr: float = 5.0,
        compute_s: float = 0.0,
        eval_every: int = 10,
    ) -> None:
        self.me, self.peers, self.problem = me, peers, problem
        self.n = len(peers)
        self.lr, self.compute_s, self.eval_every = lr, compute_s, eval_every
        self.x, self.y = problem.shard(me)
        self.w = np.zeros(problem.features)
        self.server = socket.create_server(peers[me])
        self.right: socket.socket | None = None
        self.left: socket.socket | None = None

    def connect(self, timeout_s: float = 30.0) -> None:
        """Connect to the right neighbour, accept the left one."""
        deadline = time.monotonic() + timeout_s
        accepted: list[socket.socket] = []

        def accept() -> None:
            self.server.settimeout(timeout_s)
            conn, _ = self.server.accept()
            accepted.append(conn)

        t = threading.Thread(target=accept, daemon=True)
        t.start()
        right = self.peers[(self.me + 1) % self.n]
        while True:
            try:
                self.right = socket.create_connection(right, timeout=timeout_s)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"peers[{(self.me + 1) % self.n}]: {right}") from None
                time.sleep(0.05)
        self.right.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t.join(timeout_s)
        if not accepted:
            raise TimeoutError("the left neighbour never connected")
        self.left = accepted[0]

    def allreduce(self, v: np.ndarray) -> np.ndarray:
        assert self.left is not None and self.right is not None
        n, me = self.n, self.me
        chunks = [c.copy() for c in np.array_split(v, n)]
        for s in range(n - 1):  # reduce-scatter
            _send(self.right, chunks[(me - s) % n])
            k = (me - s - 1) % n
            chunks[k] += _recv(self.left)
        for s in range(n - 1):  # all-gather
            _send(self.right, chunks[(me + 1 - s) % n])
            chunks[(me - s) % n] = _recv(self.left)
        return np.concatenate(chunks)

    def run(self, duration_s: float, log: Path | None = None) -> list[tuple[float, float]]:
        losses = _LossLog(self.problem, log, self.eval_every)
        it = 0
        try:
            # Every worker runs the same number of rounds: the ring is synchronous, so one
            # that stopped on its own clock would leave its neighbours waiting.
            while True:
                g = _gradient(self.problem, self.w, self.x, self.y, self.compute_s)
                total = self.allreduce(np.append(g, time.monotonic() - losses.start))
                self.w -= self.lr * total[:-1] / self.n
                it += 1
                losses.after(it, self.w)
                if total[-1] / self.n >= duration_s:  # the workers' mean clock, agreed
                    break
        finally:
            losses.close()
        return losses.points

    def close(self) -> None:
        for s in (self.left, self.right, self.server):
            if s is not None:
                s.close()
