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
