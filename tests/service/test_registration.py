"""Registration at scale: host references resolved in the topology the service already
holds (fetched in the background as it starts; a dict per view, not a scan), ONOS asked
again only for a reference that topology does not know, and an unknown host still refused
naming its field (docs/service.md)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from agg_optimizer.service.app import create_app
from agg_optimizer.service.settings import Settings

from .conftest import make_settings
from .onos_standin import StandinOnos
from .test_api import H1, JOB


def topology_fetches(onos: StandinOnos) -> int:
    return sum(1 for m, p in onos.requests if m == "GET" and p.split("?")[0].endswith("/hosts"))


NEW_HOST = {
    "id": "00:00:00:00:00:09/None",
    "mac": "00:00:00:00:00:09",
    "vlan": "None",
    "ipAddresses": ["10.0.0.9"],
    "locations": [{"elementId": "device:leaf1", "port": "9"}],
}


def warmed(client: TestClient) -> None:
    """Until the topology fetch the service starts with has ended."""
    assert client.app.state.service.warmed.wait(60)  # type: ignore[attr-defined]


def test_registration_uses_the_view_it_holds_and_asks_onos_only_for_unknown_hosts(
    client: TestClient, onos: StandinOnos
) -> None:
    warmed(client)
    n = topology_fetches(onos)
    assert client.post("/api/v1/jobs", json=JOB).status_code == 201
    assert topology_fetches(onos) == n  # the view fetched at the start
    r = client.post("/api/v1/jobs", json={**JOB, "id": "b", "workers": [H1]})
    assert r.status_code == 201, r.text
    assert topology_fetches(onos) == n

    # An unknown host: ONOS is asked again, and the answer still names the field.
    r = client.post("/api/v1/jobs", json={**JOB, "id": "c", "workers": [H1, "10.9.9.9"]})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "workers", "1"]
    assert "10.9.9.9" in r.json()["detail"][0]["msg"]
    assert topology_fetches(onos) == n + 1
    r = client.post("/api/v1/jobs", json={**JOB, "id": "c", "ps": "00:00:00:00:00:0f"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "ps"]
    assert topology_fetches(onos) == n + 2
    assert client.get("/api/v1/jobs/c").status_code == 404

    # A host ONOS learnt after the view: found by that second look, then by the view.
    onos.hosts["hosts"].append(NEW_HOST)
    r = client.post("/api/v1/jobs", json={**JOB, "id": "d", "workers": ["10.0.0.9"]})
    assert r.status_code == 201, r.text
    assert r.json()["workers"] == [NEW_HOST["id"]]
    assert topology_fetches(onos) == n + 3
    r = client.post("/api/v1/jobs", json={**JOB, "id": "e", "workers": ["00:00:00:00:00:09"]})
    assert r.status_code == 201 and r.json()["workers"] == [NEW_HOST["id"]]
    assert topology_fetches(onos) == n + 3

    # Still refused without any fetch: a host twice, the PS among the workers.
    r = client.post("/api/v1/jobs", json={**JOB, "id": "f", "workers": [H1, "10.0.0.1"]})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "workers", "1"]
    r = client.post("/api/v1/jobs", json={**JOB, "id": "f", "ps": H1})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "ps"]
    assert topology_fetches(onos) == n + 3


def test_registration_reads_onos_again_once_the_view_is_older_than_its_age(
    onos: StandinOnos, influx, bucket, tmp_path
) -> None:
    s = make_settings(onos, influx, bucket, tmp_path / "db", hosts_max_age_s=0)
    app = create_app(s, loop=False)
    with TestClient(app, headers={"Content-Type": "application/json"}) as c:
        warmed(c)
        n = topology_fetches(onos)
        for i in range(3):
            r = c.post("/api/v1/jobs", json={**JOB, "id": f"j{i}", "workers": [H1]})
            assert r.status_code == 201, r.text
        assert topology_fetches(onos) == n + 3
        # a host gone from ONOS is refused once the view is too old to say otherwise
        onos.hosts["hosts"] = [h for h in onos.hosts["hosts"] if h["id"] != H1]
        r = c.post("/api/v1/jobs", json={**JOB, "id": "gone", "workers": [H1]})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "workers", "0"]
    app.state.service.close()


def test_onos_not_answering_at_the_start_leaves_the_fetch_to_registration(
    onos: StandinOnos, influx, bucket, tmp_path, caplog
) -> None:
    """The start's topology fetch failing (no ONOS yet) is logged, not fatal: the service
    serves, and a registration asks ONOS itself (here: still none, a 503 naming it)."""
    import logging

    from int_collector.influxd import free_port

    dead = f"http://127.0.0.1:{free_port()}/onos/v1"
    s = make_settings(onos, influx, bucket, tmp_path / "db", onos_url=dead)
    app = create_app(s, loop=False)
    with (
        caplog.at_level(logging.INFO, logger="agg_optimizer.service.views"),
        TestClient(app, headers={"Content-Type": "application/json"}) as c,
    ):
        warmed(c)
        assert "topology not fetched at start" in caplog.text
        assert c.get("/healthz").status_code == 200
        r = c.post("/api/v1/jobs", json=JOB)
        assert r.status_code == 503 and "ONOS" in r.text, r.text
    app.state.service.close()


def test_a_large_fabric_loads_the_compiled_routing_at_start(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the fabric's solves would use the compiled routing once loaded, the service
    loads it as it starts, not on its first placement; a small fabric does not."""
    from agg_optimizer.model import shortest_paths

    def started(large: bool) -> bool:
        monkeypatch.setattr(shortest_paths, "_ready", False)
        monkeypatch.setattr(shortest_paths, "_failed", None)
        if large:  # the stand-in's fabric counted as large
            monkeypatch.setattr(shortest_paths, "LOADED_MIN_WORK", 1)
        app = create_app(settings, loop=False)
        with TestClient(app):
            svc = app.state.service
            svc.views._warm_thread.join(300)  # a cold numba load on a loaded 2-core machine
            assert not svc.views._warm_thread.is_alive()
            loaded = svc.routing_warmed
        svc.close()
        assert shortest_paths._ready == loaded
        return loaded

    assert started(large=False) is False
    assert started(large=True) is True
