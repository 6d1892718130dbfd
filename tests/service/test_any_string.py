"""Any string in any JSON field gets a 4xx naming the field, never a 500: lone surrogates
(`"\\ud800"` is valid JSON and decodes to one), control characters, escapes. Before, the
422 handler could not encode a lone surrogate it echoed, answered 500 and closed the
connection, on every route that takes a body."""

from __future__ import annotations

import json
from typing import Any

from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

NASTY = ["\ud800", "\udfff", "a\udc80b", "\x00", "\x1b[31m", "\u202e", "\ufeff", "\r\n"]

strings = st.one_of(
    st.sampled_from(NASTY),
    st.lists(st.one_of(st.sampled_from(NASTY), st.text(max_size=4)), min_size=1, max_size=4).map(
        "".join
    ),
    st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=3),
)

BODIES: list[tuple[str, str, Any]] = [
    ("POST", "/api/v1/jobs", lambda s: {"id": s, "workers": ["h1"], "ps": "h2", "update_bytes": 1}),
    ("POST", "/api/v1/jobs", lambda s: {"id": "j", "workers": [s], "ps": s, "update_bytes": 1}),
    ("POST", "/api/v1/jobs", lambda s: {"id": "j", "workers": ["h1"], "ps": "h2", s: 1}),
    ("POST", "/api/v1/jobs", lambda s: {"id": "j", "workers": ["h1"], "ps": "h2", "strategy": s}),
    ("PUT", "/api/v1/jobs/j/strategy", lambda s: {"strategy": s}),
    ("POST", "/api/v1/placements", lambda s: {"jobs": [s]}),
    ("POST", "/api/v1/placements", lambda s: {"jobs": ["j"], "dry_run": s}),
    ("POST", "/api/v1/jobs/j/progress", lambda s: {"cojob": s}),
    ("POST", "/api/v1/jobs/j/progress", lambda s: {s: s}),
]


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(which=st.integers(0, len(BODIES) - 1), s=strings)
def test_any_string_in_a_body_is_a_4xx(client: TestClient, which: int, s: str) -> None:
    method, path, body = BODIES[which]
    raw = json.dumps(body(s))  # ASCII: a lone surrogate travels as its JSON escape
    r = client.request(method, path, content=raw)
    assert 400 <= r.status_code < 500 or r.status_code == 503, (path, repr(s), r.text[:200])
    r.json()  # a JSON answer, not a closed connection


def test_a_lone_surrogate_is_echoed_escaped(client: TestClient) -> None:
    r = client.post("/api/v1/jobs", content='{"id": "\\ud800", "workers": [], "ps": "x"}')
    assert r.status_code == 422, r.text
    fields = {tuple(e["loc"]) for e in r.json()["detail"]}
    assert ("body", "id") in fields, fields
    assert "\\ud800" in r.text
