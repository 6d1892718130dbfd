"""Numbers JSON cannot hold (NaN, Infinity, 1e400) and values of the wrong JSON type are
refused with a 422 that names the field, never a 500; nothing is stored."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

H1, H2, H3 = (f"00:00:00:00:00:0{i}/None" for i in range(1, 4))
HEAD = f'{{"id": "j", "workers": ["{H1}", "{H2}"], "ps": "{H3}", "update_bytes": 1000'


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (', "weight": NaN', "weight"),
        (', "weight": Infinity', "weight"),
        (', "weight": -Infinity', "weight"),
        (', "update_bytes": 1e400', "update_bytes"),
        (', "update_bytes": true', "update_bytes"),
        (', "pool_slots": false', "pool_slots"),
        (', "weight": true', "weight"),
    ],
)
def test_non_finite_and_wrongly_typed_numbers(client: TestClient, extra: str, field: str) -> None:
    body = HEAD + extra + "}"  # a later key wins in JSON objects
    r = client.post("/api/v1/jobs", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert any(field in map(str, e["loc"]) for e in r.json()["detail"]), r.text
    assert client.get("/api/v1/jobs").json() == []


def test_dry_run_must_be_a_boolean(client: TestClient) -> None:
    r = client.post("/api/v1/placements", json={"dry_run": 0})
    assert r.status_code == 422 and "dry_run" in r.text, r.text
    assert client.post("/api/v1/placements", json={"dry_run": True}).status_code == 200


def test_a_pool_larger_than_every_switch_is_refused(client: TestClient) -> None:
    body = {"id": "j", "workers": [H1, H2], "ps": H3, "update_bytes": 1000}
    r = client.post("/api/v1/jobs", json={**body, "pool_slots": 1 << 20})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "pool_slots"]
    assert "could aggregate nowhere" in r.text, r.text
    assert client.get("/api/v1/jobs").json() == []


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (', "rounds_left": 1e309', "rounds_left"),
        (', "rounds_left": 10000000000000000000000000000000000', "rounds_left"),
        (', "stage": 1e30', "stage"),
        (', "loss": Infinity', "loss"),
        (', "iterations_total": 1e400', "iterations_total"),
    ],
)
def test_progress_numbers_are_bounded(client: TestClient, extra: str, field: str) -> None:
    body = {"id": "j", "workers": [H1, H2], "ps": H3, "update_bytes": 1000}
    assert client.post("/api/v1/jobs", json=body).status_code == 201
    r = client.post(
        "/api/v1/jobs/j/progress",
        content='{"progress": 0.5' + extra + "}",
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 422, r.text
    assert any(field in map(str, e["loc"]) for e in r.json()["detail"]), r.text
    assert client.get("/api/v1/schedule?policy=grouper").status_code == 200


def test_openapi_publishes_bounds_as_json_schema(client: TestClient) -> None:
    """`minimum`/`maximum`, never pydantic's `ge`/`le`, on every field of every schema."""
    schemas = client.get("/openapi.json").json()["components"]["schemas"]

    def walk(node: object, where: str) -> None:
        if isinstance(node, dict):
            assert not {"ge", "le", "gt", "lt"} & set(node), (where, node)
            for k, v in node.items():
                walk(v, f"{where}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{where}[{i}]")

    walk(schemas, "schemas")
    progress = schemas["ProgressIn"]["properties"]["progress"]["anyOf"][0]
    assert (progress["minimum"], progress["maximum"]) == (0.0, 1.0)
    assert schemas["ProgressIn"]["properties"]["rounds_left"]["maximum"] == 10**9
