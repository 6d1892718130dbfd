"""One writer per fabric, with real `agg-optimizer serve` processes against the ONOS stand-in
(real HTTP) and a real InfluxDB: a second instance never withdraws what it does not own (it
refuses to start, before anything, when the port is taken or ONOS holds another database's
intents); instances sharing one database elect a leader by lease, and a standby takes over
from a SIGKILLed leader; a SIGKILL at a step of a move, then a restart on the same
database, ends with ONOS holding exactly the desired state."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import requests

from agg_optimizer.service.onos import intent_digest
from int_collector import children

from .conftest import START_S, Served
from .onos_standin import StandinOnos
from .test_failures import APP, JOBS, spines_of


def ours(onos: StandinOnos) -> dict[str, str]:
    return {k: intent_digest(b) for (app, k), b in onos.intents.items() if app == APP}


def place_all(s: Served, onos: StandinOnos) -> None:
    onos.set_link("device:leaf1", "device:leaf2", "INACTIVE")
    for j in JOBS:
        assert s.api("POST", "/api/v1/jobs", json=j).status_code == 201
    res = s.api("POST", "/api/v1/placements", json={}).json()
    assert {r["status"] for r in res} == {"applied"}, res


def test_a_second_instance_withdraws_nothing_it_does_not_own(serve: Any, onos: StandinOnos) -> None:
    a = serve("a.sqlite")
    place_all(a, onos)
    held = ours(onos)
    assert len(held) == 10  # 5 workers, an intent each way
    # The same port: it stops at the bind, before it reads or changes anything.
    b = serve("b.sqlite", port=a.port, wait=False)
    assert b.proc.wait(START_S) == 2
    assert "cannot listen on 127.0.0.1" in b.log.read_text()
    assert ours(onos) == held
    # Another port, another database: ONOS holds intents it does not own.
    b = serve("b.sqlite", wait=False)
    assert b.proc.wait(START_S) == 2
    text = b.log.read_text()
    assert "another optimizer owns this ONOS" in text and "Refusing to start" in text, text
    assert "Traceback" not in text
    assert ours(onos) == held
    res = a.api("POST", "/api/v1/placements", json={}).json()
    assert all(r["status"] == "applied" for r in res), res


def test_replicas_on_one_database_one_leads_a_standby_takes_over(
    serve: Any, onos: StandinOnos
) -> None:
    a = serve("shared.sqlite")
    place_all(a, onos)
    held = ours(onos)
    b = serve("shared.sqlite")
    assert "standby" in b.api("GET", "/readyz").json()["role"]
    # A standby serves changes too: through the database's apply lock, one at a time
    r = b.api("POST", "/api/v1/jobs/a/placement")
    assert r.status_code == 200 and r.json()["status"] == "applied", r.text
    assert b.api("GET", "/api/v1/jobs").status_code == 200
    assert ours(onos) == held
    a.proc.kill()  # SIGKILL: no release of the lease
    a.proc.wait(30)

    def leads() -> bool:
        return bool(b.api("GET", "/readyz").json()["role"] == "leader")

    children.wait_ready(leads, "the standby taking over", timeout_s=60, proc=b.proc, log=b.log)
    assert b.api("POST", "/api/v1/jobs/a/placement").json()["status"] == "applied"
    assert ours(onos) == held


@pytest.mark.parametrize("point", ["intent-submitted", "aggregation-posted"])
def test_a_sigkill_mid_move_is_repaired_on_restart(
    serve: Any, onos: StandinOnos, tmp_path: Path, point: str
) -> None:
    trace = tmp_path / "trace"
    a = serve("kill.sqlite", AGG_OPTIMIZER_FAULT_TRACE=str(trace))
    place_all(a, onos)
    spine = sorted(spines_of(a.api("GET", "/api/v1/jobs/a/placement").json()["placement"]))[0]
    before = len(trace.read_text().splitlines())
    onos.set_link("device:leaf1", spine, "INACTIVE")
    assert a.api("POST", "/api/v1/jobs/a/placement").json()["status"] == "applied"
    steps = trace.read_text().splitlines()[before:]
    n = next(int(line.split()[0]) for line in steps if line.split()[1] == point)
    children.stop(a.proc)
    # The same history again, killed at that step of the move.
    onos.intents.clear()
    onos.aggregation = {}
    onos.job_numbers.clear()
    onos.set_link("device:leaf1", spine, "ACTIVE")
    a = serve("kill2.sqlite", AGG_OPTIMIZER_FAULT_KILL_AT=str(n))
    place_all(a, onos)
    onos.set_link("device:leaf1", spine, "INACTIVE")
    with pytest.raises(requests.ConnectionError):
        a.api("POST", "/api/v1/jobs/a/placement")
    assert a.proc.wait(30) == -9
    b = serve("kill2.sqlite")
    assert b.api("GET", "/readyz").json()["role"] == "leader"
    cur = b.api("GET", "/api/v1/jobs/a/placement").json()
    assert cur["status"] == "applied" and spine not in spines_of(cur["placement"]), cur
    doc = onos.aggregation["a"]
    assert [x for jp in doc["jobs"] for x in jp["aggregators"]] == cur["placement"]["aggregators"]
    for (app, key), body in onos.intents.items():
        if app == APP and key.startswith("ia-a-"):
            assert spine not in str(body), (key, body)
    again = b.api("POST", "/api/v1/reconcile").json()
    assert again["repaired"] == again["resubmitted"] == again["removed"] == [], again


def test_a_second_instance_never_writes_even_when_the_first_holds_nothing(
    serve: Any, onos: StandinOnos
) -> None:
    """The owner claim in our ONOS app (service/ownership.py): the first instance holds it
    before it holds any intent, so a second with its own database refuses to start; one
    started while ONOS is down comes up, writes nothing, and once ONOS answers reports the
    other owner (/healthz degraded, 503 naming it) instead of writing."""
    ttl = {"AGG_OPTIMIZER_LEASE_TTL_S": "600"}  # the first's claim outlives the outage
    a = serve("a.sqlite", **ttl)
    assert onos.owner is not None
    assert ours(onos) == {}  # it holds nothing
    b = serve("b.sqlite", wait=False, **ttl)
    assert b.proc.wait(START_S) == 2
    text = b.log.read_text()
    assert "another optimizer owns this ONOS" in text and "Refusing to start" in text, text
    # ONOS down while the second starts: it starts, and holds off.
    onos.stop()
    c = serve("c.sqlite", **ttl)
    assert "ownership not checked" in c.log.read_text()
    r = c.api("POST", "/api/v1/jobs", json=JOBS[0])
    assert r.status_code in (201, 503), r.text  # registering needs ONOS's hosts
    onos.start()
    deadline = time.monotonic() + START_S
    while (h := c.api("GET", "/healthz").json())["status"] != "degraded":
        assert time.monotonic() < deadline, h
        time.sleep(0.2)
    assert "another optimizer owns this ONOS" in h["writer"], h
    r = c.api("POST", "/api/v1/jobs", json=JOBS[0])
    assert r.status_code in (201, 409), r.text  # 409: created while ONOS was down
    r = c.api("POST", f"/api/v1/jobs/{JOBS[0]['id']}/placement")
    assert r.status_code == 503 and "another optimizer owns this ONOS" in r.text, r.text
    assert ours(onos) == {}, "the second instance wrote intents"
    r = c.api("POST", "/api/v1/reconcile")
    assert r.status_code == 503 and "another optimizer owns this ONOS" in r.text, r.text
    # The first still writes.
    place_all(a, onos)
    assert len(ours(onos)) == 10
