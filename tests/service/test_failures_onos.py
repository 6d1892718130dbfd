"""The failures of `test_failures.py` against the real ONOS 2.7.0 (null providers' spine-leaf:
2 spines, 3 leaves, 2 hosts each; our app installed): a spine that leaves (`null-device
<id> down` in ONOS's shell, so ONOS itself marks it unavailable and drops its links) is
routed around by one loop pass, and a kill between steps of a move and of a delete is
repaired by the next instance's start-up reconcile, with ONOS's intents (their waypoints),
the app's aggregation document and its flow rules as the desired state says.

Every step where the kill falls is tried on the stand-in (`test_failures.py`); here the
first and last hit of each kind of step (about 20 runs), or every step with
INNET_AGG_ONOS_EVERY_STEP=1. Skipped, saying why, without the ONOS built from source."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from agg_optimizer.service import onosd
from agg_optimizer.service.app import create_app
from agg_optimizer.service.applier import Killed
from agg_optimizer.service.core import Service, View
from agg_optimizer.service.settings import Settings

APP = "org.innetagg.optimizer"
WAIT_S = 180  # ONOS on a loaded 2-core machine


def open_service(settings: Settings) -> tuple[TestClient, Service]:
    app = create_app(settings, loop=False)
    c = TestClient(app, headers={"Content-Type": "application/json"})
    c.__enter__()
    return c, app.state.service


def close(c: TestClient, svc: Service) -> None:
    c.__exit__(None, None, None)
    svc.close()


def hosts_of(onos: onosd.OnosServer) -> list[dict[str, Any]]:
    return sorted(onos.get("/hosts")["hosts"], key=lambda h: h["id"])


def job(onos: onosd.OnosServer) -> dict[str, Any]:
    hosts = [h["id"] for h in hosts_of(onos)]
    return {"id": "jf", "workers": hosts[0:3:2], "ps": hosts[-1], "update_bytes": 10_000_000}


def spines(onos: onosd.OnosServer) -> set[str]:
    """The null provider's switches without hosts (bmv2 devices of other tests in the same
    ONOS session may be listed too: not ours)."""
    edge = {h["locations"][0]["elementId"] for h in hosts_of(onos)}
    null = {d["id"] for d in onos.get("/devices")["devices"] if d["id"].startswith("null:")}
    return null - edge


def null_links(onos: onosd.OnosServer) -> int:
    return sum(1 for ln in onos.get("/links")["links"] if ln["src"]["device"].startswith("null:"))


def spine_of(svc: Service, spine_ids: set[str]) -> str:
    doc = svc.store.current("jf")["placement"]
    (s,) = {n for p in doc["worker_paths"].values() for n in p if n in spine_ids}
    return s


def ours(onos: onosd.OnosServer) -> dict[str, str]:
    return {i["key"]: i["state"] for i in onos.get(f"/intents/application/{APP}")["intents"]}


def available(onos: onosd.OnosServer, device: str) -> bool:
    return any(
        d["id"] == device and d.get("available", False) for d in onos.get("/devices")["devices"]
    )


def agreement(svc: Service, onos: onosd.OnosServer) -> None:
    """ONOS holds exactly what the store wants: intent keys and waypoints, every one
    INSTALLED, the app's aggregators and pools, and its rules on exactly those switches."""
    desired = svc.store.desired()
    jobs = {j["id"] for j in svc.store.jobs()}
    assert set(desired) == jobs, (desired.keys(), jobs)
    want: dict[str, dict[str, Any]] = {}
    for jid in jobs:
        assert desired[jid]["state"] == "converged", desired[jid]
        cur = svc.store.current(jid)
        assert cur["status"] == "applied", (cur["status"], cur["reason"])
        want.update(desired[jid]["bodies"])
    onosd.wait_for(
        lambda: ours(onos) == dict.fromkeys(want, "INSTALLED"), WAIT_S, "the desired intents"
    )
    for key, body in want.items():
        held = onos.get(f"/intents/{APP}/{key}")
        assert held["constraints"] == body["constraints"], (key, held, body)
    aggs: set[str] = set()
    for jid in jobs:
        r = onos.request("GET", f"/onos/innet-agg/aggregation/{jid}")
        assert r.status_code == 200, r.text
        held = [a for jp in r.json()["jobs"] for a in jp["aggregators"]]
        assert [(a["switch"], a["pool"]) for a in held] == [
            (a["switch"], a["pool"]) for a in desired[jid]["placement"]["aggregators"]
        ]
        aggs |= {a["switch"] for a in held}
    # A switch that left keeps, in ONOS's flow store, what it held when it went (ONOS
    # cannot remove from it); ONOS syncs it on return. The switches up hold exactly these.
    up = {d["id"] for d in onos.get("/devices")["devices"] if d.get("available")}
    onosd.wait_for(
        lambda: {r["deviceId"] for r in onos.table_flows(".agg_job")} & up == aggs,
        WAIT_S,
        "the aggregation rules on the desired switches",
    )


@pytest.fixture
def fabric(
    onos_real: onosd.OnosServer, real_onos_settings: Callable[..., Settings]
) -> Iterator[Callable[[str], tuple[TestClient, Service]]]:
    """`open(db_name)`: a service on its own database; everything is deleted after."""
    opened: list[tuple[TestClient, Service]] = []
    links = null_links(onos_real)

    def open_(name: str) -> tuple[TestClient, Service]:
        s = real_onos_settings(view_max_age_s=0)
        s = s.model_copy(update={"db_path": s.db_path.parent / name})
        c, svc = open_service(s)
        opened.append((c, svc))
        return c, svc

    yield open_
    for c, svc in opened:
        with contextlib.suppress(Exception):  # closed already by the test
            close(c, svc)
    for d in onos_real.get("/devices")["devices"]:
        if not d.get("available", True) and d["id"].startswith("null:"):
            onos_real.cli(f"null-device {d['id']} up")
    # A device back is not yet its links back: the next tests need the whole fabric.
    onosd.wait_for(lambda: null_links(onos_real) >= links, WAIT_S, "every link back")
    s = real_onos_settings()
    c, svc = open_service(s.model_copy(update={"db_path": s.db_path.parent / "cleanup"}))
    for key in ours(onos_real):
        onos_real.request("DELETE", f"/intents/{APP}/{key}")
    onos_real.request("DELETE", "/onos/innet-agg/aggregation/jf")
    close(c, svc)
    onosd.wait_for(lambda: not ours(onos_real), WAIT_S, "our intents withdrawn")


@pytest.mark.skipif(
    not os.environ.get("INNET_AGG_ONOS_NULL_DEVICE"),
    reason="`null-device <id> up` does not always bring the null switch's links back in ONOS "
    "2.7 (seen in 2 of 5 runs), which leaves the session's fabric without paths for the "
    "tests after it; a real switch leaving is tested on bmv2 (tests/e2e/"
    "test_switch_leaves.py). INNET_AGG_ONOS_NULL_DEVICE=1 runs it",
)
def test_a_spine_that_leaves_is_routed_around_by_one_loop_pass(
    onos_real: onosd.OnosServer, fabric: Callable[[str], tuple[TestClient, Service]]
) -> None:
    c, svc = fabric("leaves")
    assert c.post("/api/v1/jobs", json=job(onos_real)).status_code == 201
    assert c.post("/api/v1/jobs/jf/placement").json()["status"] == "applied"
    svc.step()
    gone = spine_of(svc, spines(onos_real))
    onos_real.cli(f"null-device {gone} down")
    onosd.wait_for(lambda: not available(onos_real, gone), WAIT_S, f"{gone} unavailable")
    dry = c.post("/api/v1/placements", json={"dry_run": True})
    assert dry.status_code == 200, dry.text
    out = svc.step()
    assert out["changed"] == ["jf"] and out["errors"] == {}, out
    assert spine_of(svc, spines(onos_real)) != gone
    agreement(svc, onos_real)
    onos_real.cli(f"null-device {gone} up")
    onosd.wait_for(lambda: available(onos_real, gone), WAIT_S, f"{gone} back")


def move(svc: Service, spine_ids: set[str]) -> None:
    """Job jf re-placed through the other spine, every switch up (the old path stays
    valid, so a kill before the new placement is recorded leaves the old one desired)."""
    view = svc.view()
    s = spine_of(svc, spine_ids)
    topo = view.topology.model_copy(
        update={
            "nodes": [n for n in view.topology.nodes if n.id != s],
            "links": [ln for ln in view.topology.links if s not in (ln.src, ln.dst)],
        }
    )
    strat, placement = svc.planner.compute(
        View(topo, view.hosts, view.devices, view.snapshot), ["jf"]
    )["jf"]
    (jp,) = placement.jobs
    with svc.apply_lock:
        svc._apply(view, svc.store.job("jf"), strat, jp, "test")


def delete(svc: Service, spine_ids: set[str]) -> None:
    svc.delete_job("jf")


@pytest.mark.parametrize("action", [move, delete], ids=["move", "delete"])
def test_a_kill_between_steps_is_repaired_by_the_next_start(
    onos_real: onosd.OnosServer, fabric: Callable[[str], tuple[TestClient, Service]], action: Any
) -> None:
    sp = spines(onos_real)

    def setup(name: str) -> tuple[TestClient, Service]:
        c, svc = fabric(name)
        assert c.post("/api/v1/jobs", json=job(onos_real)).status_code == 201
        assert c.post("/api/v1/jobs/jf/placement").json()["status"] == "applied"
        return c, svc

    c, svc = setup("trace")
    seen: list[str] = []
    svc.applier.on_fault = lambda n, point: seen.append(point)
    action(svc, sp)
    svc.applier.on_fault = None
    if action is move:
        svc.delete_job("jf")
    close(c, svc)
    if os.environ.get("INNET_AGG_ONOS_EVERY_STEP"):
        steps = list(range(1, len(seen) + 1))
    else:
        firsts = {p: seen.index(p) + 1 for p in reversed(seen)}
        lasts = {p: len(seen) - seen[::-1].index(p) for p in seen}
        steps = sorted(set(firsts.values()) | set(lasts.values()))
    for n in steps:
        c, svc = setup(f"kill{n}")

        def die(hit: int, point: str, n: int = n) -> None:
            if hit == n:
                raise Killed(point)

        svc.applier._hits = 0
        svc.applier.on_fault = die
        with pytest.raises(Killed):
            action(svc, sp)
        svc.applier.on_fault = None
        close(c, svc)
        c2, svc2 = fabric(f"kill{n}")
        try:
            agreement(svc2, onos_real)
            again = c2.post("/api/v1/reconcile").json()
            assert again["repaired"] == again["removed"] == again["resubmitted"] == [], again
        except AssertionError as e:
            raise AssertionError(f"killed at step {n} ({seen[n - 1]}): {e}") from None
        if svc2.store.job("jf"):
            assert c2.delete("/api/v1/jobs/jf").status_code == 200
        onosd.wait_for(lambda: not ours(onos_real), WAIT_S, "the job's intents withdrawn")
        close(c2, svc2)
