"""Decentralized training between real processes (agg_agent.gossip, docs/peers.md): four
`agg-agent gossip` workers on loopback TCP, peers drawn from a plan file, converge to the
optimum of the convex problem they share; a plan that is not a distribution is refused."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from agg_agent.gossip import Problem, load_probabilities


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
        last = points[-1]["loss"]
        # every copy ends within 2% of the way from the start to the optimum
        assert last - opt < 0.02 * (start - opt), (i, last, opt, start)


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
