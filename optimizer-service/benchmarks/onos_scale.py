"""ONOS with the app at scale (issue 33, item 4): one ONOS 2.7 node, or a cluster of ONOS
nodes on three Atomix nodes (tests/onos/cluster.py), the null providers' spine-leaf of
8 spines and 72 leaves (80 switches, 144 hosts), and the intents and aggregation documents
of N jobs installed through the REST API as the service writes them: per job two workers
on two leaves and a PS on a third, four point-to-point intents pinned through one spine
(each worker's path and its reverse for the acknowledgements) and one aggregator on that
spine (fan-in 2, 8 slots of its pool). Measured: ONOS's boot, the time until every intent
is INSTALLED and every agg_job rule ADDED, the Java processes' memory; with a cluster, the
time after a SIGKILL of one node until the survivor holds everything again, and after its
restart until the restarted node does.

    uv run python optimizer-service/benchmarks/onos_scale.py --nodes 1 --jobs 1000
    uv run python optimizer-service/benchmarks/onos_scale.py --nodes 2 --jobs 1000
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from onos import cluster  # noqa: E402

from agg_optimizer.service import onosd  # noqa: E402

SHAPE = "spineleaf,8,72,2"
AGG_JOBS = 256  # p4/include/defines.p4: job numbers a fabric has
APP = "org.innetagg.scale"
RESOURCE = "/onos/innet-agg/aggregation"
JSON = {"Content-Type": "application/json"}


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def fabric(node: cluster.OnosNode) -> tuple[list[str], dict[str, list[dict]]]:
    """Spines, and the hosts of each leaf."""
    hosts = node.get("/hosts")["hosts"]
    by_leaf: dict[str, list[dict]] = {}
    for h in hosts:
        by_leaf.setdefault(h["locations"][0]["elementId"], []).append(h)
    devices = {d["id"] for d in node.get("/devices")["devices"]}
    return sorted(devices - set(by_leaf)), by_leaf


def jobs(n: int, spines: list[str], by_leaf: dict[str, list[dict]], seed: int) -> list[dict]:
    rng = random.Random(seed)
    leaves = sorted(by_leaf)
    out = []
    for j in range(n):
        l1, l2, lp = rng.sample(leaves, 3)
        w1, w2, ps = rng.choice(by_leaf[l1]), rng.choice(by_leaf[l2]), rng.choice(by_leaf[lp])
        spine = spines[j % len(spines)]
        out.append({"id": f"j{j}", "spine": spine, "leaves": (l1, l2, lp),
                    "workers": (w1, w2), "ps": ps, "pool": 8 * (j // len(spines))})  # fmt: skip
    return out


def intent(key: str, src: dict, dst: dict, waypoints: list[str]) -> dict:
    return {
        "type": "PointToPointIntent", "appId": APP, "key": key, "priority": 40000,
        "selector": {"criteria": [{"type": "ETH_SRC", "mac": src["mac"]},
                                  {"type": "ETH_DST", "mac": dst["mac"]}]},
        "ingressPoint": {"device": src["locations"][0]["elementId"],
                         "port": src["locations"][0]["port"]},
        "egressPoint": {"device": dst["locations"][0]["elementId"],
                        "port": dst["locations"][0]["port"]},
        "constraints": [{"type": "WaypointConstraint", "waypoints": waypoints}],
    }  # fmt: skip


def intents_of(job: dict) -> list[dict]:
    (l1, l2, lp), ps, out = job["leaves"], job["ps"], []
    for k, (w, leaf) in enumerate(zip(job["workers"], (l1, l2), strict=True)):
        way = [leaf, job["spine"], lp]
        out.append(intent(f"{job['id']}-w{k}", w, ps, way))
        out.append(intent(f"{job['id']}-a{k}", ps, w, way[::-1]))
    return out


def document(job: dict) -> dict:
    (l1, l2, lp), (w1, w2), ps = job["leaves"], job["workers"], job["ps"]
    spine = job["spine"]
    return {"strategy": "agg", "jobs": [{
        "job_id": job["id"],
        "aggregators": [{"switch": spine, "children": [l1, l2], "fan_in": 2, "next_hop": lp,
                         "pool": {"base": job["pool"], "size": 8}}],
        "worker_paths": {w1["id"]: [w1["id"], l1, spine, lp, ps["id"]],
                         w2["id"]: [w2["id"], l2, spine, lp, ps["id"]]},
    }]}  # fmt: skip


def counts(node: cluster.OnosNode) -> tuple[int, int]:
    """(our intents INSTALLED, agg_job rules ADDED) as `node` reports them."""
    r = node.request("GET", f"/intents/application/{APP}", timeout=300)
    installed = (
        sum(1 for i in r.json().get("intents", []) if i.get("state") == "INSTALLED")
        if r.status_code == 200 else -1
    )  # fmt: skip
    r = node.request("GET", "/flows/application/org.innetagg.app", timeout=300)
    added = (
        sum(1 for f in r.json().get("flows", [])
            if str(f.get("tableName", "")).endswith(".agg_job") and f.get("state") == "ADDED")
        if r.status_code == 200 else -1
    )  # fmt: skip
    return installed, added


def wait_counts(
    node: cluster.OnosNode, want: tuple[int, int], what: str, timeout_s: float
) -> float:
    t0 = time.monotonic()
    last = (-1, -1)
    while True:
        try:
            last = counts(node)
        except Exception as e:  # a node restarting: not yet
            say(f"{what}: {type(e).__name__}")
        if last == want:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"{what}: {last} of {want} after {timeout_s} s")
        time.sleep(2)


def rss_mb(node: cluster.OnosNode) -> float:
    """Resident memory of the node's processes (its process group: the script and Java), MB."""
    assert node.proc is not None
    pids = subprocess.run(["pgrep", "-g", str(node.proc.pid)], capture_output=True,
                          text=True).stdout.split()  # fmt: skip
    total = 0
    for pid in pids:
        r = subprocess.run(["ps", "-o", "rss=", "-p", pid], capture_output=True, text=True)
        if r.stdout.strip():
            total += int(r.stdout.strip())
    return total / 1024


def post_all(node: cluster.OnosNode, items: list[tuple[str, Any]], workers: int) -> int:
    """POST each (path, body); returns how many failed."""

    def one(item: tuple[str, Any]) -> bool:
        path, body = item
        for _ in range(5):
            r = node.request("POST", path, data=json.dumps(body), headers=JSON, timeout=300)
            if r.status_code < 300:
                return True
            if r.status_code != 503:
                say(f"{path}: {r.status_code} {r.text[:200]}")
                return False
            time.sleep(1)
        return False

    with ThreadPoolExecutor(workers) as pool:
        return sum(1 for ok in pool.map(one, items) if not ok)


def run(args: argparse.Namespace) -> dict:
    oar = sorted((ROOT / "onos-app" / "target").glob("innet-agg-onos-*.oar"))
    if not oar:
        raise SystemExit("no onos-app/target/*.oar: make onos-app")
    base = Path(tempfile.mkdtemp(prefix="onos-scale-"))
    out: dict[str, Any] = {"nodes": args.nodes, "jobs": args.jobs, "shape": SHAPE}
    atomix = cluster.AtomixCluster(base) if args.nodes > 1 else None
    t0 = time.monotonic()
    if atomix is not None:
        atomix.__enter__()
    try:
        with cluster.OnosCluster(atomix, args.nodes) as oc:
            n1 = oc.nodes[0]
            n1.shape = SHAPE
            n1._start_null_topology(time.monotonic() + cluster.START_S)
            for n in oc.nodes:
                onosd.wait_for(lambda n=n: len(n.get("/hosts")["hosts"]) >= 144, 600,
                               f"144 hosts on {n.node_id}")  # fmt: skip
            n1.install_app(oar[-1], "org.innetagg.app", timeout_s=900,
                           probe=f"{RESOURCE}/absent")  # fmt: skip
            out["boot_s"] = round(time.monotonic() - t0, 1)
            say(f"booted in {out['boot_s']} s")
            spines, by_leaf = fabric(n1)
            out["switches"] = len(spines) + len(by_leaf)
            js = jobs(args.jobs, spines, by_leaf, args.seed)
            n1.request("POST", f"/applications/{APP}/register")
            items = [("/intents", b) for j in js for b in intents_of(j)]
            t = time.monotonic()
            failed = post_all(n1, items, args.clients)
            out["intents"] = len(items)
            out["intents_posted_s"] = round(time.monotonic() - t, 1)
            out["intents_failed"] = failed
            say(f"{len(items)} intents posted in {out['intents_posted_s']} s ({failed} failed)")
            # The app hands out one of AGG_JOBS (256) job numbers per fabric: more jobs than
            # that cannot aggregate at once (503), so documents go to the first 256 only.
            docs = [(f"{RESOURCE}/{j['id']}", document(j)) for j in js[: args.agg_jobs]]
            out["documents"] = len(docs)
            nodes = oc.nodes
            t_docs = time.monotonic()
            # spread the documents over the nodes, as replicas of the service would
            failed = sum(post_all(nodes[k], docs[k::len(nodes)], args.clients)
                         for k in range(len(nodes)))  # fmt: skip
            out["docs_posted_s"] = round(time.monotonic() - t_docs, 1)
            out["docs_failed"] = failed
            say(f"{len(docs)} documents posted in {out['docs_posted_s']} s ({failed} failed)")
            want = (len(items), len(docs))
            out["after_last_post_s"] = round(wait_counts(n1, want, "everything in place", 3600), 1)
            out["install_total_s"] = round(time.monotonic() - t, 1)
            out["rss_mb"] = [round(rss_mb(n)) for n in oc.nodes]
            say(f"all in place {out['install_total_s']} s after the first POST, {out['rss_mb']} MB")
            if args.nodes > 1:
                victim = oc.nodes[-1]
                victim.kill()
                t = time.monotonic()
                out["survivor_holds_s"] = round(wait_counts(n1, want, "survivor", 1800), 1)
                r = n1.request("GET", docs[-1][0])
                out["survivor_serves"] = r.status_code == 200
                say(f"survivor holds everything {out['survivor_holds_s']} s after the kill")
                victim.launch(fresh_cache=True)
                victim.wait_ready(cluster.START_S)
                oc.wait_formed(cluster.START_S)
                out["restarted_ready_s"] = round(time.monotonic() - t, 1)
                out["restarted_holds_s"] = round(
                    wait_counts(victim, want, "restarted node", 1800) + out["restarted_ready_s"], 1
                )
                say(f"restarted node holds everything {out['restarted_holds_s']} s after the kill")
    finally:
        if atomix is not None:
            atomix.__exit__()
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    out["load"] = load.split("load average:")[-1].strip()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1, help="1: one ONOS; 2+: on 3 Atomix nodes")
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=8, help="concurrent REST clients")
    ap.add_argument("--agg-jobs", type=int, default=AGG_JOBS,
                    help="jobs given an aggregation document (the app's numbers: 256)")  # fmt: skip
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="append the JSON line here")
    args = ap.parse_args()
    if (why := cluster.skip_reason()) is not None and args.nodes > 1:
        raise SystemExit(why)
    if (why := onosd.missing()) is not None:
        raise SystemExit(why)
    res = run(args)
    print(json.dumps(res))
    if args.out:
        with args.out.open("a") as f:
            f.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
