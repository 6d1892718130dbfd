"""Schema-driven fuzz of the API (schemathesis against the OpenAPI document): no 500."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from agg_optimizer.service.app import create_app

from .conftest import make_settings
from .onos_standin import StandinOnos


@pytest.fixture(scope="module")
def fuzz_app(influx, tmp_path_factory) -> Iterator[object]:
    onos = StandinOnos()
    onos.start()
    influx.query_v1('CREATE DATABASE "fuzz"')
    s = make_settings(
        onos, influx, "fuzz/autogen", tmp_path_factory.mktemp("f") / "db", intent_wait_s=1.0
    )
    app = create_app(s, loop=False)
    yield app
    app.state.service.close()
    onos.stop()


def test_no_server_error(fuzz_app) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", fuzz_app)
    seen = []
    for result in schema.get_all_operations():
        op = result.ok()

        @given(case=op.as_strategy())
        @settings(
            max_examples=12,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def run(case) -> None:
            response = case.call()
            seen.append(response.status_code)
            assert response.status_code < 500 or response.status_code == 503, (
                f"{case.method} {case.path}: {response.status_code} {response.text[:300]}"
            )

        run()
    assert len(seen) > 50 and any(code == 422 for code in seen)
