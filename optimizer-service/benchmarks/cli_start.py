"""Wall time of the `agg-optimizer` CLI as a user scripting it sees it (issue 16, item 4).

Each command runs as a fresh process of `.venv/bin/agg-optimizer` (import included), 5 times;
the table gives the median, after one unmeasured run of each that writes Python's bytecode
cache (an installed package has it; without it, compiling the sources of scipy, networkx
and pydantic took 2 s of a 3 s solve here, where PYTHONDONTWRITEBYTECODE was set).
`--exe` may be given more than once (e.g. an older copy of the CLI): the runs of the
executables are interleaved, so a busy machine slows them alike and the columns compare.
`--imports` adds the solve path's imports one by one in a fresh interpreter
(median of the same runs): where the time that remains goes.

    uv run --frozen python optimizer-service/benchmarks/cli_start.py [--imports]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_EXE = ROOT / ".venv" / "bin" / "agg-optimizer"

# What `agg-optimizer solve` imports, in the order it needs them (what each one adds).
SOLVE_IMPORTS = (
    "typer",
    "numpy",
    "pydantic",
    "agg_optimizer.model.documents",
    "scipy.sparse",
    "scipy.sparse.csgraph",
    "highspy",
    "agg_optimizer.placement.engine",
)

_IMPORT_PROBE = """
import importlib, sys, time
last = time.perf_counter()
for name in sys.argv[1:]:
    importlib.import_module(name)
    now = time.perf_counter()
    print(name, now - last)
    last = now
"""


# Children write and use the bytecode cache whatever the caller's environment says.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _wall(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stderr}")
    return dt


def _short(exe: Path) -> str:
    try:
        return str(exe.resolve().relative_to(ROOT))
    except ValueError:
        return str(exe)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exe", action="append", type=Path, help="CLI executable(s) to time")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--imports", action="store_true", help="also time the solve path's imports")
    args = ap.parse_args()
    exes = args.exe or [DEFAULT_EXE]

    with tempfile.TemporaryDirectory() as tmp:
        inst = Path(tmp) / "k4.json"
        subprocess.run([str(exes[0]), "example", "-o", str(inst)], check=True)
        commands = {
            "--help": ["--help"],
            "example (k=4, 4 jobs)": ["example", "-o", str(Path(tmp) / "e.json")],
            "solve (k=4, 4 jobs, agg)": ["solve", str(inst), "-o", str(Path(tmp) / "p.json")],
        }
        runs: dict[tuple[str, int], list[float]] = {}
        python = ROOT / ".venv" / "bin" / "python"
        floor = [str(python), "-c", "pass"]
        base: list[float] = []
        for argv in commands.values():  # bytecode cache, not measured
            for exe in exes:
                _wall([str(exe), *argv])
        for _ in range(args.runs):
            base.append(_wall(floor))
            for label, argv in commands.items():
                for i, exe in enumerate(exes):
                    runs.setdefault((label, i), []).append(_wall([str(exe), *argv]))

        head = "| command | " + " | ".join(f"`{_short(e)}` (s)" for e in exes) + " |"
        print(head)
        print("|" + "---|" * (len(exes) + 1))
        print(f"| `python -c pass` | {statistics.median(base):.3f}" + " |" * len(exes))
        for label in commands:
            cells = " | ".join(f"{statistics.median(runs[label, i]):.3f}" for i in range(len(exes)))
            print(f"| {label} | {cells} |")

        if args.imports:
            per: dict[str, list[float]] = {}
            for _ in range(args.runs):
                out = subprocess.run(
                    [str(python), "-c", _IMPORT_PROBE, *SOLVE_IMPORTS],
                    capture_output=True,
                    text=True,
                    check=True,
                    env=ENV,
                ).stdout
                for line in out.splitlines():
                    name, dt = line.split()
                    per.setdefault(name, []).append(float(dt))
            print()
            print("| import (in this order, what each adds) | median (s) |")
            print("|---|---|")
            total = 0.0
            for name in SOLVE_IMPORTS:
                m = statistics.median(per[name])
                total += m
                print(f"| `{name}` | {m:.3f} |")
            print(f"| total | {total:.3f} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
