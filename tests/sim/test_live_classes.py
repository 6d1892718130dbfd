"""The simulated fabric of `make demo` applies the classes the service writes to the ONOS
app's traffic-class resource: they become the strict-priority level of the job's streams
in the simulator (`demo.live.LiveFabric`, over real HTTP)."""

from __future__ import annotations

import time

import requests

from agg_optimizer.demo.live import LiveFabric
from agg_optimizer.sim.training import JobSpec


def test_a_posted_class_moves_the_jobs_streams() -> None:
    fab = LiveFabric(seed=3, report_interval_s=1.0).start()
    try:
        hosts = sorted(fab.ips)
        spec = JobSpec("a", hosts[:2], hosts[-1], 25_000_000, 10**6, 0.02)
        fab.add_job(spec)
        root = fab.onos_url.rsplit("/onos/", 1)[0]
        auth = ("onos", "rocks")
        r = requests.post(f"{root}/onos/innet-agg/aggregation/a", json={"jobs": []}, auth=auth)
        assert r.status_code == 201  # a new job, as the app answers
        r = requests.post(
            f"{root}/onos/innet-agg/priority/a",
            json={"job_id": "a", "priority_class": 3},
            auth=auth,
            timeout=5,
        )
        assert r.status_code == 201, r.text
        deadline = time.monotonic() + 60
        seen: set[int] = set()
        while time.monotonic() < deadline and 3 not in seen:
            with fab.lock:
                running = fab.cluster.jobs.get("a")
                seen |= {f.priority for f in running.flows} if running else set()
            time.sleep(0.01)
        assert fab.cluster.priority["a"] == 3 and 3 in seen
        assert fab.class_log[-1][1:] == ("a", 3)
        r = requests.delete(f"{root}/onos/innet-agg/priority/a", auth=auth, timeout=5)
        assert r.status_code == 204
        assert fab.cluster.priority["a"] == 0 and fab.class_log[-1][1:] == ("a", None)
        bad = requests.post(
            f"{root}/onos/innet-agg/priority/a",
            json={"job_id": "a", "priority_class": 9},
            auth=auth,
            timeout=5,
        )
        assert bad.status_code == 400 and "priority_class" in bad.json()["message"]
    finally:
        fab.stop()
