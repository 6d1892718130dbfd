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
With `refresh_s`, a thread re-reads the worker's row from the plan's source meanwhile, so
a worker follows a plan the service re-computes as the links change.

The baselines of `agg_optimizer.peers.selection.plan`, on the same problem and sockets:
`AllReduceWorker` (synchronous ring all-reduce), `PSWorker` (synchronous parameter server
hosted by one of the workers) and `PragueWorker` (random groups, partial all-reduce).
Frames: 4-byte magic, 4-byte length, then float64 values, big-endian.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import time
import urllib.request
from collections import deque
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
    written as JSON lines to `path` if given. `event` adds other lines (a plan change) from
    another thread: the lock keeps lines whole and none after `close`."""

    def __init__(self, problem: Problem, path: Path | None, every: int) -> None:
        self.problem, self.every = problem, every
        self.x, self.y = problem.eval_set()
        self.start = time.monotonic()
        self.points: list[tuple[float, float]] = []
        self.fh = path.open("w") if path else None
        self.lock = threading.Lock()

    def after(self, it: int, w: np.ndarray) -> None:
        if it % self.every:
            return
        point = (time.monotonic() - self.start, self.problem.loss(w, self.x, self.y))
        self.points.append(point)
        self._write({"t": point[0], "loss": point[1], "it": it})

    def event(self, **fields: object) -> None:
        self._write({"t": time.monotonic() - self.start, **fields})

    def _write(self, line: dict[str, object]) -> None:
        with self.lock:
            if self.fh:
                self.fh.write(json.dumps(line) + "\n")
                self.fh.flush()

    def close(self) -> None:
        with self.lock:
            if self.fh:
                self.fh.close()
                self.fh = None


class GossipWorker:
    """Asynchronous gossip SGD (module docstring). With `source` and `refresh_s` > 0, a
    thread re-reads this worker's row from `source` (`load_probabilities`) every
    `refresh_s` seconds while `run` trains: a row that differs replaces `self.p` (one
    assignment, so an iteration draws from the old row or the new one, never a mix) and
    logs `{"t", "plan_changed": true, "it", "p"}`; a failed read (the service down, a bad
    plan) keeps the row in force and counts in `refresh_failures`, as training must not
    stop for the plan's source."""

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
        source: str = "",
        refresh_s: float = 0.0,
    ) -> None:
        self.me, self.peers, self.problem = me, peers, problem
        self.p = probabilities
        self.lr, self.compute_s, self.eval_every = lr, compute_s, eval_every
        self.source, self.refresh_s = source, refresh_s
        self.x, self.y = problem.shard(me)
        self.w = np.zeros(problem.features)
        self.lock = threading.Lock()
        self.rng = np.random.default_rng([seed, me])
        self.iterations = 0
        self.exchanges_served = 0
        self.failed_exchanges = 0
        self.plan_changes = 0
        self.refresh_failures = 0
        self.ended_by: int | None = None  # the peer whose end ended this run, if one did
        self._finished = threading.Event()
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
                if self._finished.is_set():
                    _send(conn, np.empty(0))  # "I have finished": the asker ends too
                    return
                with self.lock:
                    mine = self.w.copy()
                    self.w = (self.w + theirs) / 2.0
                    self.exchanges_served += 1
                _send(conn, mine)
            except (OSError, ConnectionError):
                return

    def _exchange_out(self, m: int) -> bool:
        """Average with peer m; False when m has finished its run (an empty answer, or no
        longer listening), and nothing is averaged."""
        with self.lock:
            mine = self.w.copy()
        try:
            with socket.create_connection(self.peers[m], timeout=30) as s:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                _send(s, mine)
                theirs = _recv(s)
        except ConnectionRefusedError:
            return False
        if theirs.size == 0:
            return False
        with self.lock:
            self.w = (self.w + theirs) / 2.0
        return True

    def wait_for_peers(self, timeout_s: float = 30.0) -> None:
        """Until every peer listens, so that the workers' clocks start together (a worker
        that starts alone trains on its own shard only and drifts; see `run` for the end)."""
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

    def _refresh(self, losses: _LossLog, done: threading.Event) -> None:
        names = [f"{h}:{pt}" for h, pt in self.peers]
        while not done.wait(self.refresh_s):
            try:
                p = load_probabilities(self.source, self.me, names)
            except Exception:  # whatever the source did wrong, training goes on
                self.refresh_failures += 1
                continue
            if not np.array_equal(p, self.p):
                self.p = p
                self.plan_changes += 1
                losses.event(plan_changed=True, it=self.iterations, p=p.round(6).tolist())

    def run(self, duration_s: float, log: Path | None = None) -> list[tuple[float, float]]:
        """Train for `duration_s`, or until a peer it picks has finished; returns (seconds
        since start, loss on the eval set).

        The workers' clocks start tens of milliseconds apart. Once some have stopped, the
        others' gradient steps come from their shards alone, and on shards that are not
        identically distributed the consensus moves off the optimum: a clean-clone CI run
        ended a copy 4.4% of the way back from it in its last 40 ms (0.1% a second before).
        So a finished worker answers exchanges with an empty frame, and a worker that gets
        one (or finds the peer no longer listening) stops there too: the run ends within an
        exchange or two of the first worker's end."""
        losses = _LossLog(self.problem, log, self.eval_every)
        done = threading.Event()
        if self.source and self.refresh_s > 0:
            threading.Thread(target=self._refresh, args=(losses, done), daemon=True).start()
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
                    if not self._exchange_out(m):
                        self.ended_by = m
                        break
                except (OSError, ConnectionError):
                    self.failed_exchanges += 1
                it += 1
                self.iterations = it
                if it % self.eval_every == 0:
                    with self.lock:
                        w = self.w.copy()
                    losses.after(it, w)
        finally:
            self._finished.set()
            done.set()  # a read in progress may finish later: the log drops its line then
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
        self.rounds = 0
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
        k = (self.me + 1) % self.n
        self.right = _dial(self.peers[k], deadline, f"peers[{k}]")
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
                self.rounds = it
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


def _dial(addr: tuple[str, int], deadline: float, what: str) -> socket.socket:
    """Connect to `addr`, retrying until `deadline` (the peer may not listen yet)."""
    while True:
        try:
            s = socket.create_connection(addr, timeout=max(deadline - time.monotonic(), 1.0))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return s
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: {addr} not listening") from None
            time.sleep(0.05)


class PSWorker:
    """The parameter-server baseline: worker `ps_index` hosts the PS and trains too. Every
    iteration each worker sends its gradient to the PS, which averages the n gradients,
    takes the step and sends the model back to every worker: the PS's link carries n - 1
    vectors in and n - 1 out per iteration, as `peers.plan("ps")` models it. Every worker
    then holds the PS's model, bit for bit."""

    def __init__(
        self,
        me: int,
        peers: list[tuple[str, int]],
        problem: Problem,
        ps_index: int = 0,
        lr: float = 5.0,
        compute_s: float = 0.0,
        eval_every: int = 10,
    ) -> None:
        if not 0 <= ps_index < len(peers):
            raise ValueError(f"ps_index: {ps_index} is not an index of the {len(peers)} peers")
        self.me, self.peers, self.problem, self.ps_index = me, peers, problem, ps_index
        self.n = len(peers)
        self.lr, self.compute_s, self.eval_every = lr, compute_s, eval_every
        self.x, self.y = problem.shard(me)
        self.w = np.zeros(problem.features)
        self.rounds = 0
        # The PS: one connection per worker, by index; a worker: one, to the PS.
        self.server = socket.create_server(peers[me]) if me == ps_index else None
        self.workers: dict[int, socket.socket] = {}
        self.ps: socket.socket | None = None

    def connect(self, timeout_s: float = 30.0) -> None:
        """The PS accepts every other worker (each says its index first); a worker
        connects to the PS."""
        deadline = time.monotonic() + timeout_s
        if self.server is None:
            self.ps = _dial(self.peers[self.ps_index], deadline, f"peers[{self.ps_index}]")
            self.ps.settimeout(None)
            _send(self.ps, np.array([float(self.me)]))
            return
        while len(self.workers) < self.n - 1:
            self.server.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                missing = sorted(set(range(self.n)) - {self.me, *self.workers})
                raise TimeoutError(f"workers {missing} never connected to the PS") from None
            conn.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                (i,) = _recv(conn)
            except (OSError, ConnectionError, ValueError):
                conn.close()  # not one of ours (a probe): wait for the others
                continue
            k = int(i)
            if k == self.me or not 0 <= k < self.n or k in self.workers:
                conn.close()
                continue
            conn.settimeout(None)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.workers[k] = conn

    def run(self, duration_s: float, log: Path | None = None) -> list[tuple[float, float]]:
        """Train until the workers' mean clock reaches `duration_s`: the PS decides, with
        the clocks the gradients carry, and says so with the model, so every worker runs
        the same rounds (a worker that stopped on its own clock would leave the PS
        waiting for its gradient)."""
        losses = _LossLog(self.problem, log, self.eval_every)
        try:
            while True:
                g = _gradient(self.problem, self.w, self.x, self.y, self.compute_s)
                clock = time.monotonic() - losses.start
                if self.server is None:
                    assert self.ps is not None
                    _send(self.ps, np.append(g, clock))
                    answer = _recv(self.ps)
                    self.w, stop = answer[:-1], bool(answer[-1])
                else:
                    total, clocks = g.copy(), clock
                    for k in sorted(self.workers):  # a fixed order: the same sum every run
                        v = _recv(self.workers[k])
                        total += v[:-1]
                        clocks += v[-1]
                    self.w = self.w - self.lr * total / self.n
                    stop = clocks / self.n >= duration_s  # the workers' mean clock, agreed
                    answer = np.append(self.w, float(stop))
                    for k in sorted(self.workers):
                        _send(self.workers[k], answer)
                self.rounds += 1
                losses.after(self.rounds, self.w)
                if stop:
                    break
        finally:
            losses.close()
        return losses.points

    def close(self) -> None:
        for s in (self.ps, self.server, *self.workers.values()):
            if s is not None:
                s.close()


class PragueWorker:
    """The Prague baseline (partial all-reduce in random groups). Round r: every worker
    draws the same partition of the n workers from (seed, r), consecutive runs of `group`
    in `default_rng([seed, r]).permutation(n)`; it takes a gradient step on its shard, then
    its group averages models by ring all-reduce inside the group (reduce-scatter then
    all-gather, as `AllReduceWorker` over the group). A group waits only for its members;
    a leftover group of one keeps its model.

    The workers keep one TCP connection per pair, opened by `connect` (a handshake per
    round would cost a round trip per link per round on a slow link); a round's group uses
    its members' connections, and every frame carries (round, step), so a frame that
    belongs to a round its receiver abandoned is told apart and dropped. A thread per
    connection reads its frames into an inbox, so sends never wait for the receiver.

    Stopping: a worker stops after the round in which its own clock passes `duration_s`,
    or in which it learns that another worker has stopped (its connection closed). So the
    run ends for all within about a round of the first clock to expire, and nobody waits
    for a worker that is gone: a member that waits for a peer that closed, or that
    answers with an abort, abandons the round's averaging (keeps its local step), tells
    its group so, and counts it in `failed_rounds`. That is deadlock-free: a waiting
    worker waits only for its round's members, each of which either reaches that round
    (the one in the lowest round never waits for anyone further behind), or has stopped
    and closed. `timeout_s` only bounds a wait for a peer that hangs without closing."""

    def __init__(
        self,
        me: int,
        peers: list[tuple[str, int]],
        problem: Problem,
        group: int = 4,
        lr: float = 5.0,
        compute_s: float = 0.0,
        eval_every: int = 10,
        seed: int = 0,
        timeout_s: float = 30.0,
    ) -> None:
        if group < 2:
            raise ValueError(f"group: {group} is below 2 (a group of one averages nothing)")
        self.me, self.peers, self.problem, self.group = me, peers, problem, group
        self.n = len(peers)
        self.lr, self.compute_s, self.eval_every = lr, compute_s, eval_every
        self.seed, self.timeout_s = seed, timeout_s
        self.x, self.y = problem.shard(me)
        self.w = np.zeros(problem.features)
        self.rounds = 0
        self.averaged_rounds = 0
        self.alone_rounds = 0  # the leftover group of one
        self.failed_rounds = 0
        self.server = socket.create_server(peers[me])
        self.conns: dict[int, socket.socket] = {}
        self.inbox: dict[int, deque[np.ndarray]] = {m: deque() for m in range(self.n)}
        self.gone: set[int] = set()
        self.cv = threading.Condition()
        self.readers: list[threading.Thread] = []

    def connect(self, timeout_s: float = 30.0) -> None:
        """One connection per pair: connect to every higher index, accept every lower one
        (each says its index first)."""
        deadline = time.monotonic() + timeout_s
        accepted: dict[int, socket.socket] = {}

        def accept() -> None:
            try:
                while len(accepted) < self.me:
                    self.server.settimeout(max(deadline - time.monotonic(), 0.01))
                    conn, _ = self.server.accept()
                    conn.settimeout(max(deadline - time.monotonic(), 0.01))
                    try:
                        (i,) = _recv(conn)
                    except (OSError, ConnectionError, ValueError):
                        conn.close()  # not one of ours
                        continue
                    k = int(i)
                    if 0 <= k < self.me and k not in accepted:
                        accepted[k] = conn
                    else:
                        conn.close()
            except OSError:
                return  # the deadline: reported below

        t = threading.Thread(target=accept, daemon=True)
        t.start()
        for m in range(self.me + 1, self.n):
            s = _dial(self.peers[m], deadline, f"peers[{m}]")
            _send(s, np.array([float(self.me)]))
            self.conns[m] = s
        t.join(max(deadline - time.monotonic(), 0.01))
        if len(accepted) < self.me:
            missing = sorted(set(range(self.me)) - set(accepted))
            raise TimeoutError(f"peers {missing} never connected")
        for k, conn in accepted.items():
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.conns[k] = conn
        for m, s in self.conns.items():
            s.settimeout(None)
            r = threading.Thread(target=self._read, args=(m, s), daemon=True)
            r.start()
            self.readers.append(r)

    def _read(self, m: int, s: socket.socket) -> None:
        try:
            while True:
                frame = _recv(s)
                with self.cv:
                    self.inbox[m].append(frame)
                    self.cv.notify_all()
        except (OSError, ConnectionError):
            pass
        with self.cv:
            self.gone.add(m)
            self.cv.notify_all()

    def _send(self, m: int, r: int, step: int, v: np.ndarray) -> bool:
        try:
            _send(self.conns[m], np.concatenate(([float(r), float(step)], v)))
            return True
        except OSError:
            return False

    def _take(self, m: int, r: int, step: int, deadline: float) -> np.ndarray | None:
        """Peer m's frame for (r, step); None if m is gone, aborted round r, or hangs."""
        with self.cv:
            q = self.inbox[m]
            while True:
                while q and q[0][0] < r:
                    q.popleft()  # from a round this worker abandoned
                if q:
                    if q[0][0] > r:
                        return None  # m is past round r: it abandoned it
                    frame = q.popleft()
                    return frame[2:] if frame[1] == step else None  # else: an abort
                if m in self.gone:
                    return None
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cv.wait(left)

    def groups(self, r: int) -> list[list[int]]:
        """Round r's partition: the same on every worker, from (seed, r) alone."""
        order = np.random.default_rng([self.seed, r]).permutation(self.n)
        return [[int(m) for m in order[s : s + self.group]] for s in range(0, self.n, self.group)]

    def average(self, r: int, members: list[int]) -> bool:
        """Ring all-reduce of the models inside `members` (in ring order). False, the model
        unchanged and the members told, if the round failed."""
        k, pos = len(members), members.index(self.me)
        right, left = members[(pos + 1) % k], members[(pos - 1) % k]
        deadline = time.monotonic() + self.timeout_s
        chunks = [c.copy() for c in np.array_split(self.w, k)]
        for s in range(2 * (k - 1)):
            if s < k - 1:  # reduce-scatter
                out, into = (pos - s) % k, (pos - s - 1) % k
            else:  # all-gather
                out, into = (pos + 1 - (s - k + 1)) % k, (pos - (s - k + 1)) % k
            got = self._take(left, r, s, deadline) if self._send(right, r, s, chunks[out]) else None
            if got is None:
                for m in members:  # so that the others stop waiting for this worker
                    if m != self.me:
                        self._send(m, r, -1, np.zeros(0))
                return False
            chunks[into] = chunks[into] + got if s < k - 1 else got
        self.w = np.concatenate(chunks) / k
        return True

    def run(self, duration_s: float, log: Path | None = None) -> list[tuple[float, float]]:
        """Train until `duration_s` on this worker's clock, or until another worker has
        stopped (class docstring)."""
        losses = _LossLog(self.problem, log, self.eval_every)
        try:
            while True:
                r = self.rounds
                g = _gradient(self.problem, self.w, self.x, self.y, self.compute_s)
                self.w = self.w - self.lr * g
                members = next(grp for grp in self.groups(r) if self.me in grp)
                if len(members) == 1:
                    self.alone_rounds += 1
                elif self.average(r, members):
                    self.averaged_rounds += 1
                else:
                    self.failed_rounds += 1
                self.rounds += 1
                losses.after(self.rounds, self.w)
                with self.cv:
                    someone_stopped = bool(self.gone)
                if someone_stopped or time.monotonic() - losses.start >= duration_s:
                    break
        finally:
            losses.close()
        return losses.points

    def close(self, linger_s: float = 5.0) -> None:
        """Say so to every peer (end of stream), then read what they still send until
        they stop too, at most `linger_s`: closing with unread data would reset the
        connection, and a peer could lose frames of the round it finishes."""
        for s in self.conns.values():
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + linger_s
        for t in self.readers:
            t.join(max(deadline - time.monotonic(), 0.0))
        for s in (*self.conns.values(), self.server):
            s.close()
