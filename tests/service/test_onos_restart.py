"""ONOS restarted without its state (as after `onos-service restart` with no cluster
store): the service registers its application id again, the control loop puts the applied
jobs' intents and aggregation entries back within two loop periods without duplicates,
and reconcile resubmits what ONOS lost."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from agg_optimizer.service.app import create_app
from agg_optimizer.service.onosd import wait_for

from .conftest import make_settings
from .onos_standin import StandinOnos

H1, H2, H3 = (f"00:00:00:00:00:0{i}/None" for i in range(1, 4))
JOB = {"id": "j", "workers": [H1, H2], "ps": H3, "update_bytes": 50_000_000}
APP = "org.innetagg.optimizer"
PERIOD_S = 1.0


def restart_empty(onos: StandinOnos) -> StandinOnos:
    onos.stop()
    fresh = StandinOnos(port=onos.port)
    fresh.aggregation = {}  # the ONOS app is installed (its entries are gone)
    fresh.start()
    return fresh


def posts(onos: StandinOnos) -> int:
    return sum(1 for m, p in onos.requests if m == "POST" and p.endswith("/intents"))


@pytest.fixture
def looping(onos, influx, bucket, tmp_path) -> Iterator[TestClient]:
    s = make_settings(onos, influx, bucket, tmp_path / "db", reoptimize_period_s=PERIOD_S)
    app = create_app(s, loop=True)
    with TestClient(app, headers={"Content-Type": "application/json"}) as c:
        yield c
    app.state.service.close()


def test_the_loop_puts_lost_intents_back_within_two_periods(looping, onos) -> None:
    onos.aggregation = {}
    assert looping.post("/api/v1/jobs", json=JOB).status_code == 201
    r = looping.post("/api/v1/jobs/j/placement").json()
    assert r["status"] == "applied", r
    want = {k for (app, k) in onos.intents if app == APP}
    assert len(want) == 4  # two workers, an intent each way

    fresh = restart_empty(onos)
    start = time.monotonic()
    while time.monotonic() - start < 2 * PERIOD_S + 0.5:
        if {k for (app, k) in fresh.intents if app == APP} == want and "j" in fresh.aggregation:
            break
        time.sleep(0.05)
    assert {k for (app, k) in fresh.intents if app == APP} == want
    assert fresh.aggregation.get("j"), "the aggregation entries were not written again"
    assert APP in fresh.apps
    assert posts(fresh) == len(want)  # each once: no duplicates
    # Nothing more to do afterwards: the next runs submit nothing.
    time.sleep(2 * PERIOD_S)
    assert posts(fresh) == len(want)
    assert looping.get("/api/v1/jobs/j/placement").json()["status"] == "applied"


def test_reconcile_resubmits_what_onos_lost(client, onos) -> None:
    assert client.post("/api/v1/jobs", json=JOB).status_code == 201
    assert client.post("/api/v1/jobs/j/placement").json()["status"] == "applied"
    want = {k for (app, k) in onos.intents if app == APP}
    fresh = restart_empty(onos)
    out = client.post("/api/v1/reconcile").json()
    assert sorted(out["resubmitted"]) == sorted(want) and out["failed"] == [], out
    assert {k for (app, k) in fresh.intents if app == APP} == want
    # A placement after the restart works too (the registration is renewed on ONOS's 404).
    fresh2 = restart_empty(fresh)
    r = client.post("/api/v1/jobs/j/placement").json()
    assert r["status"] == "applied", r
    assert {k for (app, k) in fresh2.intents if app == APP} == want


LONG_PERIOD_S = 300.0  # far beyond the tests' deadlines: only a wake or a retry can act


@pytest.fixture
def slow_loop(onos, influx, bucket, tmp_path) -> Iterator[TestClient]:
    s = make_settings(
        onos, influx, bucket, tmp_path / "db", reoptimize_period_s=LONG_PERIOD_S,
        probe_period_s=0.2,
    )  # fmt: skip
    app = create_app(s, loop=True)
    with TestClient(app, headers={"Content-Type": "application/json"}) as c:
        yield c
    app.state.service.close()


def test_onos_answering_again_wakes_the_loop_before_its_period(slow_loop, onos) -> None:
    """ONOS restarted without its state: the probe sees it answer again and the loop's
    pass puts the job back at once, not a loop period (here 300 s) later."""
    onos.aggregation = {}
    assert slow_loop.post("/api/v1/jobs", json=JOB).status_code == 201
    assert slow_loop.post("/api/v1/jobs/j/placement").json()["status"] == "applied"
    want = {k for (app, k) in onos.intents if app == APP}
    onos.stop()
    wait_for(lambda: slow_loop.get("/readyz").status_code == 503, 30, "ONOS seen down")
    fresh = StandinOnos(port=onos.port)
    fresh.aggregation = {}
    fresh.start()
    try:
        began = time.monotonic()
        wait_for(
            lambda: {k for (app, k) in fresh.intents if app == APP} == want
            and "j" in fresh.aggregation,
            60, "the job's intents and aggregation back in ONOS",
        )  # fmt: skip
        took = time.monotonic() - began
        assert took < LONG_PERIOD_S / 5, took
        assert posts(fresh) == len(want)  # each once
        counters = slow_loop.app.state.service.counters
        assert counters.get("loop_wakes", 0) >= 1, counters
        assert slow_loop.get("/api/v1/jobs/j/placement").json()["status"] == "applied"
    finally:
        fresh.stop()


def test_a_job_short_of_applied_is_retried_soon_not_at_the_period(slow_loop, onos) -> None:
    """ONOS back without our app: the pass puts the intents back and leaves the job
    `intents-only`. Once the app answers, a retry within seconds (2, 4, 8, ... s after the
    pass, never later than the period) writes its aggregation."""
    onos.aggregation = {}
    assert slow_loop.post("/api/v1/jobs", json=JOB).status_code == 201
    assert slow_loop.post("/api/v1/jobs/j/placement").json()["status"] == "applied"
    onos.stop()
    wait_for(lambda: slow_loop.get("/readyz").status_code == 503, 30, "ONOS seen down")
    fresh = StandinOnos(port=onos.port)  # aggregation None: our app is not installed
    fresh.start()
    try:
        status = lambda: slow_loop.get("/api/v1/jobs/j/placement").json()["status"]  # noqa: E731
        wait_for(lambda: status() == "intents-only", 60, "the job intents-only")
        fresh.aggregation = {}  # the app is installed now
        began = time.monotonic()
        wait_for(lambda: "j" in fresh.aggregation, 60, "the aggregation written")
        assert time.monotonic() - began < LONG_PERIOD_S / 5
        wait_for(lambda: status() == "applied", 30, "the job applied")
    finally:
        fresh.stop()


def test_wakes_in_a_burst_start_a_pass_at_most_every_wake_gap(slow_loop) -> None:
    """An ONOS that flaps wakes the loop on every return. Woken every 50 ms for 3 s, the
    loop runs a pass at once and then no sooner than WAKE_GAP_S after the last one ended:
    two passes in the burst, not one per wake."""
    from agg_optimizer.service.loop import WAKE_GAP_S

    BURST_S = 3.0
    svc = slow_loop.app.state.service
    assert slow_loop.post("/api/v1/jobs", json=JOB).status_code == 201
    assert slow_loop.post("/api/v1/jobs/j/placement").json()["status"] == "applied"
    wait_for(lambda: svc.control._thread is not None, 30, "the loop started")
    runs = lambda: svc.counters.get("loop_runs", 0)  # noqa: E731
    before = runs()
    began = time.monotonic()
    while time.monotonic() - began < BURST_S:
        svc.control.wake("a burst")
        time.sleep(0.05)
    wait_for(lambda: runs() > before, 60, "a pass after the wakes")
    time.sleep(0.2)  # a pass started inside the burst has ended by now on the stand-in
    # passes start WAKE_GAP_S apart at least: 2 in the 3 s
    assert 1 <= runs() - before <= 1 + int(BURST_S / WAKE_GAP_S), (before, runs())
    assert svc.counters.get("loop_wakes", 0) >= 50
