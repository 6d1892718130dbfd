"""How often a placement's `agg_job` rules are missing from ONOS's flow list right after the
app's 201, on the real ONOS 2.7.0 built from source (docs/service.md).

ONOS's `FlowRuleManager.applyFlowRules` hands the batch to an executor and returns, so a
client that reads `/onos/v1/flows/{device}` once after the placement can miss the rules.
This boots ONOS with the null providers' spine-leaf (the tests' harness), installs the app's
built .oar, then N times: POST a one-aggregator placement, read the device's flows once
(then poll until the rules show, timing the wait), DELETE, wait until they are gone.
`--busy K` runs K busy loops meanwhile, as a CI run's other work would.

    make onos-app
    uv run python optimizer-service/benchmarks/onos_rule_visibility.py -n 100 --busy 2
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

from agg_optimizer.service import onosd

REPO = Path(__file__).resolve().parents[2]
APP = "org.innetagg.app"
JOB = "/onos/innet-agg/aggregation/visibility-probe"


def _spin() -> None:
    while True:
        pass


def _rules(srv: onosd.OnosServer, device: str) -> int:
    return sum(f.get("appId") == APP for f in srv.table_flows(".agg_job", device))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=100, help="placements")
    ap.add_argument("--busy", type=int, default=0, help="busy loops running meanwhile")
    a = ap.parse_args()
    why = onosd.missing()
    oars = sorted((REPO / "onos-app" / "target").glob("innet-agg-onos-*.oar"))
    if why or not oars:
        print(why or "no onos-app/target/*.oar: `make onos-app` builds it", file=sys.stderr)
        return 2
    srv = onosd.OnosServer("spineleaf,2,3,2")
    srv.start()
    spinners = [mp.Process(target=_spin, daemon=True) for _ in range(a.busy)]
    try:
        srv.install_app(oars[-1], APP, probe="/onos/innet-agg/aggregation/absent")
        ps = srv.get("/hosts")["hosts"][0]
        device = ps["locations"][0]["elementId"]
        agg = {"switch": device, "children": [], "fan_in": 2, "next_hop": ps["id"]}
        doc = {"jobs": [{"job_id": "visibility-probe", "worker_paths": {},
                         "aggregators": [{**agg, "pool": {"base": 0, "size": 64}}]}]}  # fmt: skip
        for p in spinners:
            p.start()
        late: list[float] = []
        for i in range(a.n):
            r = srv.request("POST", JOB, json=doc)
            if r.status_code not in (200, 201):
                raise SystemExit(f"placement {i}: {r.status_code} {r.text}")
            t = time.monotonic()
            if _rules(srv, device) == 0:
                while _rules(srv, device) == 0:
                    time.sleep(0.005)
                late.append(time.monotonic() - t)
            srv.request("DELETE", JOB)
            while _rules(srv, device):
                time.sleep(0.05)
            print(f"\r{i + 1}/{a.n} placements, {len(late)} late", end="", file=sys.stderr)
        print(file=sys.stderr)
        waits = ", ".join(f"{w * 1e3:.0f}" for w in sorted(late)) or "-"
        print("| placements | busy loops | rules absent at the first read | their wait (ms) |")
        print("|---|---|---|---|")
        print(f"| {a.n} | {a.busy} | {len(late)} | {waits} |")
    finally:
        for p in spinners:
            p.kill()
        srv.stop(remove=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
