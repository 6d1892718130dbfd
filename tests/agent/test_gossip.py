"""Decentralized training between real processes (agg_agent.gossip, docs/peers.md): four
`agg-agent gossip` workers on loopback TCP, peers drawn from a plan file, converge to the
optimum of the convex problem they share; a plan that is not a distribution is refused.
The baselines (ring all-reduce, parameter server, Prague's random groups) as processes
too; a worker that re-reads its plan follows a new one and survives a source that fails;
the CLI refuses bad values of the baselines' options."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from agg_agent.cli import app
from agg_agent.gossip import GossipWorker, Problem, load_probabilities


def _ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _plan(path: Path, names: list[str], rows: list[list[float]]) -> None:
    probs = {
        names[i]: {names[m]: p for m, p in enumerate(row) if p > 0} for i, row in enumerate(rows)
    }
    path.write_text(json.dumps({"workers": names, "probabilities": probs}))


def test_gossip_processes_converge_to_the_optimum(tmp_path: Path) -> None:
    n, features = 4, 200
    names = [f"w{i}" for i in range(n)]
    # a ring-biased plan: mostly the next worker, some of the others
    rows = [[0.0 if m == i else (0.7 if m == (i + 1) % n else 0.15) for m in range(n)]
            for i in range(n)]  # fmt: skip
    _plan(tmp_path / "plan.json", names, rows)
    peers = ",".join(f"127.0.0.1:{p}" for p in _ports(n))
    cmd = [sys.executable, "-c", "from agg_agent.cli import main; main()", "gossip"]
    procs = [
        subprocess.Popen(
            [
                *cmd,
                "--me",
                str(i),
                "--peers",
                peers,
                "--probabilities",
                str(tmp_path / "plan.json"),
                "--duration-s",
                "6",
                "--features",
                str(features),
                "--log",
                str(tmp_path / f"{i}.log"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    problem = Problem(n, features)
    opt = problem.optimum()
    start = problem.loss(np.zeros(features), *problem.eval_set())
    for i in range(n):
        points = [json.loads(ln) for ln in (tmp_path / f"{i}.log").read_text().splitlines()]
        assert len(points) > 10
        # Every copy ends within 3% of the way from the start to the optimum, over its last
        # three logged losses (local steps on a shard of its own keep each copy moving
        # around the optimum). Copies that went on after others had stopped ended 2.1% and
        # 4.4% away in two CI runs; they now stop with the first (GossipWorker.run). Here
        # the worst copy ends 0.5-0.7% away, before the change and after alike
        # (benchmarks/gossip_end_drift.py, 10 runs each beside two busy loops): the tail
        # CI met is rare, so the bound is not tightened on this evidence.
        last = float(np.median([p["loss"] for p in points[-3:]]))
        assert last - opt < 0.03 * (start - opt), (i, last, opt, start)


def test_a_plan_row_that_is_not_a_distribution_is_refused(tmp_path: Path) -> None:
    _plan(tmp_path / "bad.json", ["a", "b"], [[0.5, 0.5], [1.0, 0.0]])
    with pytest.raises(ValueError, match="probabilities: row of a"):
        load_probabilities(str(tmp_path / "bad.json"), 0, ["x:1", "y:2"])


def test_allreduce_processes_keep_one_model_and_reach_the_optimum(tmp_path: Path) -> None:
    n, features = 4, 200
    peers = ",".join(f"127.0.0.1:{p}" for p in _ports(n))
    cmd = [sys.executable, "-c", "from agg_agent.cli import main; main()", "gossip"]
    procs = [
        subprocess.Popen(
            [*cmd, "--mode", "allreduce", "--me", str(i), "--peers", peers,
             "--duration-s", "4", "--log", str(tmp_path / f"{i}.log")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for i in range(n)
    ]  # fmt: skip
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    logs = [
        [json.loads(ln) for ln in (tmp_path / f"{i}.log").read_text().splitlines()]
        for i in range(n)
    ]
    # synchronous: the same rounds, the same model, so the same losses on every worker
    assert len({len(lg) for lg in logs}) == 1 and len(logs[0]) > 5
    for a, b in zip(logs[0], logs[1], strict=True):
        assert a["it"] == b["it"] and a["loss"] == pytest.approx(b["loss"], rel=1e-9)
    problem = Problem(n, features)
    opt, start = problem.optimum(), problem.loss(np.zeros(features), *problem.eval_set())
    assert logs[0][-1]["loss"] - opt < 0.02 * (start - opt)


CMD = [sys.executable, "-c", "from agg_agent.cli import main; main()", "gossip"]


def _workers(tmp_path: Path, n: int, *args: str) -> tuple[list[list[dict]], list[dict]]:
    """Run n `agg-agent gossip` processes with `args`; every worker's log lines and its
    closing line of counts."""
    peers = ",".join(f"127.0.0.1:{p}" for p in _ports(n))
    procs = [
        subprocess.Popen(
            [*CMD, "--me", str(i), "--peers", peers, *args, "--log", str(tmp_path / f"{i}.log")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]
    counts = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        counts.append(json.loads(out.splitlines()[-1]))
    logs = [
        [json.loads(ln) for ln in (tmp_path / f"{i}.log").read_text().splitlines()]
        for i in range(n)
    ]
    return logs, counts


def test_ps_processes_keep_one_model_and_reach_the_optimum(tmp_path: Path) -> None:
    n, features = 4, 200
    # the PS on worker 2, not on the first: its index decides who listens and who dials
    logs, counts = _workers(tmp_path, n, "--mode", "ps", "--ps-index", "2", "--duration-s", "3")
    # synchronous: the PS's stop rides with its model, so every worker runs the same rounds
    # and holds the PS's model bit for bit: the same losses everywhere
    assert len({c["rounds"] for c in counts}) == 1 and {c["ps_index"] for c in counts} == {2}
    assert len({len(lg) for lg in logs}) == 1 and len(logs[0]) > 5
    for lg in logs[1:]:
        for a, b in zip(logs[0], lg, strict=True):
            assert a["it"] == b["it"] and a["loss"] == b["loss"]
    problem = Problem(n, features)
    opt, start = problem.optimum(), problem.loss(np.zeros(features), *problem.eval_set())
    # gradient descent on all the data, as the optimum's own: it gets there (1e-9 observed)
    assert logs[0][-1]["loss"] - opt < 0.02 * (start - opt)


def test_prague_processes_converge_towards_the_optimum(tmp_path: Path) -> None:
    # groups of 3 out of 4: a ring of three and, every round, a worker left alone
    n, features = 4, 200
    logs, counts = _workers(tmp_path, n, "--mode", "prague", "--group", "3", "--duration-s", "3")
    problem = Problem(n, features)
    opt, start = problem.optimum(), problem.loss(np.zeros(features), *problem.eval_set())
    for i, (lg, c) in enumerate(zip(logs, counts, strict=True)):
        assert len(lg) > 10, (i, c)
        # a quarter of the rounds alone (expected 1/4), the others averaged in the group;
        # only the last few rounds fail (0-2 observed, of ~1000): the first worker to stop
        # ends the run for all, within a round or two
        assert c["alone_rounds"] > 0.1 * c["rounds"], (i, c)
        assert c["averaged_rounds"] > 0.6 * c["rounds"], (i, c)
        assert c["failed_rounds"] <= 5, (i, c)
        # The models differ (each averages with a different group each round), but the last
        # averaging mixed three of the four and one local step drifts little: every copy
        # ends within 2% of the way from the start to the optimum, the bound gossip is held
        # to above (0.1-0.2% observed).
        assert lg[-1]["loss"] - opt < 0.02 * (start - opt), (i, lg[-1], opt, start)
    # and no one waited for a worker that had gone: all end within a few rounds (0-3 seen)
    assert max(c["rounds"] for c in counts) - min(c["rounds"] for c in counts) <= 10


def _until(cond: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _passive_peers(n: int) -> tuple[str, list[GossipWorker]]:
    """Workers 1..n-1 in this process, serving exchanges only: what they serve is what
    worker 0 sent them."""
    ports = _ports(n)
    addrs = [("127.0.0.1", p) for p in ports]
    problem = Problem(n, 20)
    uniform = np.full(n, 1.0 / (n - 1))
    peers = [GossipWorker(i, addrs, problem, uniform) for i in range(1, n)]
    return ",".join(f"127.0.0.1:{p}" for p in ports), peers


def _worker0(peers: str, source: str, log: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CMD, "--me", "0", "--peers", peers, "--probabilities", source, "--refresh-s", "0.1",
         "--duration-s", "2.5", "--features", "20", "--log", str(log)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _end(proc: subprocess.Popen[str], *peers: GossipWorker) -> None:
    if proc.poll() is None:  # the test failed while it ran
        proc.kill()
        proc.wait()
    for w in peers:
        w.close()


def test_a_worker_follows_its_plan_rewritten_mid_run(tmp_path: Path) -> None:
    names = ["w0", "w1", "w2"]
    plan = tmp_path / "plan.json"
    _plan(plan, names, [[0, 1, 0], [1, 0, 0], [1, 0, 0]])  # w0: everything to w1
    peers, (w1, w2) = _passive_peers(3)
    proc = _worker0(peers, str(plan), tmp_path / "0.log")
    try:
        _until(lambda: w1.exchanges_served > 20)
        assert w2.exchanges_served == 0
        new = tmp_path / "plan.new"  # replaced whole: a reader never sees half a file
        _plan(new, names, [[0, 0, 1], [1, 0, 0], [1, 0, 0]])  # now everything to w2
        os.replace(new, plan)
        # once w2 is served, w0 draws from the new row: it never returns to w1
        _until(lambda: w2.exchanges_served > 0)
        to_w1 = w1.exchanges_served
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
    finally:
        _end(proc, w1, w2)
    assert w1.exchanges_served == to_w1 and w2.exchanges_served > 20
    counts = json.loads(out.splitlines()[-1])
    assert counts["plan_changes"] == 1 and counts["refresh_failures"] == 0, counts
    lines = [json.loads(ln) for ln in (tmp_path / "0.log").read_text().splitlines()]
    changed = [ln for ln in lines if "plan_changed" in ln]
    assert len(changed) == 1 and changed[0]["p"] == [0.0, 0.0, 1.0]
    assert 0 < changed[0]["it"] < counts["iterations"]


def test_a_refresh_that_fails_keeps_the_row_and_training(tmp_path: Path) -> None:
    names = ["w0", "w1", "w2"]
    _plan(tmp_path / "plan.json", names, [[0, 1, 0], [1, 0, 0], [1, 0, 0]])
    state = {"body": (tmp_path / "plan.json").read_bytes(), "gets": 0}

    class Plan(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state["gets"] += 1
            self.send_response(200)
            self.send_header("Content-Length", str(len(state["body"])))
            self.end_headers()
            self.wfile.write(state["body"])

        def log_message(self, *args: object) -> None:
            pass

    service = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Plan)
    threading.Thread(target=service.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{service.server_address[1]}/api/v1/jobs/j/peers"
    peers, (w1, w2) = _passive_peers(3)
    proc = _worker0(peers, url, tmp_path / "0.log")
    try:
        _until(lambda: w1.exchanges_served > 20 and state["gets"] >= 3)
        state["body"] = b'{"workers": ["w0"'  # a bad plan: half a document
        gets = state["gets"]
        _until(lambda: state["gets"] >= gets + 3)
        service.shutdown()  # then the service is down: connections refused
        service.server_close()
        down, served = time.monotonic(), w1.exchanges_served
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert time.monotonic() - down > 0.3  # (the run went on after the service died)
    finally:
        _end(proc, w1, w2)
        service.server_close()
    # training went on with the old row: more exchanges with w1, none with w2
    assert w1.exchanges_served > served and w2.exchanges_served == 0
    counts = json.loads(out.splitlines()[-1])
    assert counts["plan_changes"] == 0 and counts["refresh_failures"] >= 4, counts
    lines = [json.loads(ln) for ln in (tmp_path / "0.log").read_text().splitlines()]
    assert not any("plan_changed" in ln for ln in lines)
    # the log goes on to the end of the run (its points come every 10 iterations; what a
    # loaded machine changes is how many iterations fit in the run, not this)
    points = [ln for ln in lines if "loss" in ln]
    assert points[-1]["it"] > counts["iterations"] - 10, (points[-1], counts)


PEERS4 = "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3,127.0.0.1:4"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mode", "ring"], "mode: 'ring' is not one of gossip, allreduce, ps, prague"),
        (["--mode", "prague", "--group", "1"], "--group: 1 is below 2"),
        (["--mode", "ps", "--ps-index", "4"], "--ps-index: 4 is not an index of the 4 peers"),
        (["--mode", "ps", "--ps-index", "-1"], "--ps-index: -1 is not an index of the 4 peers"),
        (["--refresh-s", "0", "--probabilities", "p.json"], "--refresh-s: 0 is not a positive"),
        (["--refresh-s", "-1", "--probabilities", "p.json"], "--refresh-s: -1 is not a positive"),
        (["--refresh-s", "1"], "--refresh-s: needs --probabilities"),
        (["--mode", "allreduce", "--refresh-s", "1"], "--refresh-s: only --mode gossip uses it"),
        (["--mode", "ps", "--group", "4"], "--group: only --mode prague uses it"),
        (["--mode", "prague", "--ps-index", "0"], "--ps-index: only --mode ps uses it"),
    ],
)
def test_bad_baseline_options_are_named(args: list[str], message: str) -> None:
    r = CliRunner().invoke(app, ["gossip", "--me", "0", "--peers", PEERS4, *args])
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.output.replace("│", " ").split())


def test_a_worker_stops_when_the_peer_it_picks_has_finished() -> None:
    # Once a peer has stopped taking steps, going on would train on the other shards alone
    # and move the consensus off the optimum (GossipWorker.run): a finished worker answers
    # with an empty frame, and the asker stops without averaging it in.
    addrs = [("127.0.0.1", p) for p in _ports(2)]
    problem = Problem(2, 20)
    w0 = GossipWorker(0, addrs, problem, np.array([0.0, 1.0]))
    w1 = GossipWorker(1, addrs, problem, np.array([1.0, 0.0]))
    try:
        w1.run(0.0)  # its clock has run out: it still serves, as finished
        kept = w1.w.copy()
        w0.run(30.0)
        assert (w0.ended_by, w0.iterations, w0.failed_exchanges) == (1, 0, 0)
        # one local step, nothing averaged in either direction
        step = -w0.lr * problem.grad(np.zeros(20), *problem.shard(0))
        assert np.allclose(w0.w, step) and np.array_equal(w1.w, kept)
        # a peer that no longer listens has finished too
        w1.close()
        _until(lambda: _refused(addrs[1]), 5.0)  # its accept thread lets go within 0.2 s
        w0.ended_by = None
        w0.run(30.0)
        assert (w0.ended_by, w0.iterations, w0.failed_exchanges) == (1, 0, 0)
        assert np.allclose(w0.w, step - w0.lr * problem.grad(step, *problem.shard(0)))
    finally:
        w0.close()
        w1.close()


def _refused(addr: tuple[str, int]) -> bool:
    try:
        socket.create_connection(addr, timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False
