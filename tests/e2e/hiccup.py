"""A scheduling hiccup meter: sleeps 10 ms in a loop and logs every gap over 0.5 s with how
long this process itself waited in the run queue (/proc/self/schedstat) and what the CPUs
did meanwhile (/proc/stat, in jiffies), plus the worst gap of every 10 s.

Run it in a session of its own beside a test (`setsid python3 tests/e2e/hiccup.py out.txt
&`): a gap whose wait is the whole gap while the CPUs were busy is the machine's scheduler
keeping a runnable process off the CPUs, whatever the test's own processes do. docs/e2e.md
("Beside two busy loops") used it to tell a machine-wide stall from one inside ONOS.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

PERIOD_S = 0.01
REPORT_S = 0.5


def schedstat() -> tuple[float, float]:
    """(seconds on a CPU, seconds waiting in the run queue) of this process."""
    run, wait, _ = Path("/proc/self/schedstat").read_text().split()
    return int(run) / 1e9, int(wait) / 1e9


def cpu_jiffies() -> list[int]:
    """user nice system idle iowait irq softirq steal, summed over the CPUs."""
    return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]


def main(path: str) -> None:
    with open(path, "a", buffering=1) as out:
        last, (run0, wait0), cpu0 = time.monotonic(), schedstat(), cpu_jiffies()
        worst, reported = 0.0, last
        while True:
            time.sleep(PERIOD_S)
            now, (run, wait), cpu = time.monotonic(), schedstat(), cpu_jiffies()
            gap = now - last - PERIOD_S
            worst = max(worst, gap)
            if gap > REPORT_S:
                d = dict(
                    zip(("us", "ni", "sy", "idle", "io", "irq", "si", "st"),
                        (b - a for a, b in zip(cpu0, cpu, strict=True)), strict=True)
                )  # fmt: skip
                out.write(
                    f"{time.strftime('%T')} hiccup {gap:.2f}s own_run {run - run0:.3f}s "
                    f"own_wait {wait - wait0:.3f}s cpu {d}\n"
                )
            if now - reported > 10:
                out.write(f"{time.strftime('%T')} worst10s {worst:.3f}s\n")
                worst, reported = 0.0, now
            last, run0, wait0, cpu0 = now, run, wait, cpu


if __name__ == "__main__":
    main(sys.argv[1])
