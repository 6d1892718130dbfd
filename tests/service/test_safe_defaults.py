"""Safe by default (issue 14, items 6 and 9): no open mutations on a published port,
no cross-site form posts, a strict bearer scheme, a bounded what-if; and the small things
a user trips over (offline /docs, the state directory, history of a deleted job, a status
that says what was not applied, error responses in the OpenAPI document, 413 for a
chunked body)."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from fastapi.testclient import TestClient
from pydantic import SecretStr

from agg_optimizer.service.app import create_app
from agg_optimizer.service.settings import Settings, resolve_token

from .conftest import make_settings
from .onos_standin import StandinOnos

H1, H2, H3, H4 = (f"00:00:00:00:00:0{i}/None" for i in range(1, 5))
JOB = {"id": "j", "workers": [H1, H2], "ps": H3, "update_bytes": 10_000_000}
JSON = {"Content-Type": "application/json"}


def serve(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AGG_OPTIMIZER_")}
    return subprocess.run(
        [sys.executable, "-c", "from agg_optimizer.cli import main; main()", "serve", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


# --- 6. safe by default ------------------------------------------------------------------


def test_serve_refuses_a_public_address_without_a_token(tmp_path: Path) -> None:
    env = {"AGG_OPTIMIZER_DB_PATH": str(tmp_path / "db")}
    r = serve("--host", "0.0.0.0", "--port", "1", env=env)
    assert r.returncode == 2, r.stderr
    assert "refusing to listen on 0.0.0.0 without an API token" in r.stderr
    assert "AGG_OPTIMIZER_API_TOKEN" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "db").exists()


def test_a_token_file_is_generated_once_private_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "state" / "api-token"
    s = Settings(api_token_file=path, db_path=tmp_path / "db")
    first = resolve_token(s)
    assert first and len(first) >= 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert resolve_token(s) == first  # a restart keeps it
    assert resolve_token(s.model_copy(update={"api_token": SecretStr("given")})) == "given"
    path.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        resolve_token(s)


@pytest.fixture
def open_client(settings: Settings) -> Iterator[TestClient]:
    """No token (loopback use), and no default content type: what a browser form sends."""
    app = create_app(settings, loop=False)
    with TestClient(app) as c:
        yield c
    app.state.service.close()


def test_body_less_mutations_need_json_content_type_without_a_token(
    open_client: TestClient,
) -> None:
    c = open_client
    assert c.post("/api/v1/jobs", json=JOB).status_code == 201
    # What a cross-site form can send: refused before anything runs.
    for ct in (None, "application/x-www-form-urlencoded", "text/plain", "multipart/form-data"):
        headers = {"Content-Type": ct} if ct else {}
        for path in ("/api/v1/reconcile", "/api/v1/jobs/j/placement"):
            r = c.post(path, headers=headers)
            assert r.status_code == 415, (path, ct, r.text)
            assert "application/json" in r.json()["detail"]
    assert c.get("/api/v1/jobs/j/placement").status_code == 404  # nothing was placed
    # With JSON's content type (a browser asks first, and we never allow it), it runs.
    r = c.post(
        "/api/v1/jobs/j/placement", headers={"Content-Type": "application/json; charset=utf-8"}
    )
    assert r.status_code == 200 and r.json()["status"] == "applied", r.text
    assert c.post("/api/v1/reconcile", headers=JSON).status_code == 200


def test_the_bearer_scheme_is_strict(onos, influx, bucket, tmp_path) -> None:
    s = make_settings(onos, influx, bucket, tmp_path / "db", api_token="s3cret")
    with TestClient(create_app(s, loop=False)) as c:
        for auth in ("s3cret", "Bearer  s3cret", "Token s3cret", "Bearer s3cret2", "Bearer"):
            r = c.post("/api/v1/jobs", json=JOB, headers={"Authorization": auth})
            assert r.status_code == 401, auth
            assert r.headers["WWW-Authenticate"] == "Bearer"
        assert c.get("/api/v1/jobs").json() == []
        ok = {"Authorization": "bearer s3cret"}  # the scheme is case-insensitive (RFC 7235)
        assert c.post("/api/v1/jobs", json=JOB, headers=ok).status_code == 201
        # With the token, a body-less mutation needs no content type (a form cannot send it).
        r = c.post("/api/v1/jobs/j/placement", headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 200, r.text


def test_what_if_computations_are_rate_limited_without_the_token(
    onos, influx, bucket, tmp_path
) -> None:
    s = make_settings(
        onos, influx, bucket, tmp_path / "db", what_if_per_minute=2, view_max_age_s=600
    )
    with TestClient(create_app(s, loop=False), headers=JSON) as c:
        for jid in "abc":
            assert c.post("/api/v1/jobs", json={**JOB, "id": jid}).status_code == 201
        assert c.get("/api/v1/jobs/a/what-if").status_code == 200
        for _ in range(5):  # the same answer again: from the cache, not counted
            assert c.get("/api/v1/jobs/a/what-if").status_code == 200
        assert c.get("/api/v1/jobs/b/what-if").status_code == 200
        r = c.get("/api/v1/jobs/c/what-if")
        assert r.status_code == 429, r.text
        assert 1 <= int(r.headers["Retry-After"]) <= 30
        assert "what-if" in r.json()["detail"]
    s2 = s.model_copy(update={"api_token": SecretStr("t"), "db_path": tmp_path / "db2"})
    with TestClient(create_app(s2, loop=False), headers=JSON) as c:
        auth = {"Authorization": "Bearer t"}
        for jid in "abc":
            assert c.post("/api/v1/jobs", json={**JOB, "id": jid}, headers=auth).status_code == 201
        for jid in "abc":  # the token holder is not limited
            assert c.get(f"/api/v1/jobs/{jid}/what-if", headers=auth).status_code == 200
        assert c.get("/api/v1/jobs/a/what-if").status_code == 200  # cached: free for anyone


# --- 9. smaller things ---------------------------------------------------------------------


def test_docs_load_without_a_cdn(client: TestClient) -> None:
    page = client.get("/docs").text
    assert "cdn." not in page and "unpkg" not in page
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css"):
        src = next(part for part in page.split('"') if part.endswith(asset))
        r = client.get(src)
        assert r.status_code == 200 and len(r.content) > 10_000, src


def test_the_default_database_is_in_the_state_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("AGG_OPTIMIZER_DB_PATH", raising=False)
    monkeypatch.chdir(tmp_path)
    assert Settings().db_path == tmp_path / "state" / "agg-optimizer" / "agg-optimizer.sqlite"


def test_a_deleted_jobs_history_does_not_reappear_under_its_id(client: TestClient) -> None:
    assert client.post("/api/v1/jobs", json=JOB).status_code == 201
    assert client.post("/api/v1/jobs/j/placement").json()["status"] == "applied"
    assert client.delete("/api/v1/jobs/j").status_code == 200
    assert client.post("/api/v1/jobs", json=JOB).status_code == 201
    assert client.get("/api/v1/jobs/j/placements").json() == []
    assert client.get("/api/v1/jobs/j/placement").status_code == 404


def test_the_status_says_when_aggregation_was_not_applied(
    client: TestClient, onos: StandinOnos
) -> None:
    onos.aggregation = None  # ONOS without our app
    assert client.post("/api/v1/jobs", json=JOB).status_code == 201
    res = client.post("/api/v1/jobs/j/placement").json()
    assert res["placement"]["aggregators"], "a placement with aggregators, else nothing to say"
    assert res["status"] == "intents-only", res
    assert "aggregation not applied" in res["reason"] and "org.innetagg.app" in res["reason"]
    assert client.get("/api/v1/jobs/j/placement").json()["status"] == "intents-only"
    # Once the app is there, the control loop applies what was missing.
    onos.aggregation = {}
    svc = client.app.state.service  # type: ignore[attr-defined]
    svc.step()
    assert client.get("/api/v1/jobs/j/placement").json()["status"] == "applied"
    assert "j" in onos.aggregation


def test_reconcile_writes_the_aggregation_once_the_app_is_installed(
    client: TestClient, onos: StandinOnos
) -> None:
    """Reconcile alone, without a loop pass (the loop off, or a standby that just took the
    lead): a job placed while the app was missing gets its aggregation once the app answers,
    and not before."""
    onos.aggregation = None
    assert client.post("/api/v1/jobs", json=JOB).status_code == 201
    assert client.post("/api/v1/jobs/j/placement").json()["status"] == "intents-only"
    svc = client.app.state.service  # type: ignore[attr-defined]
    assert svc.reconcile()["repaired"] == []  # still no app: nothing to repair
    assert client.get("/api/v1/jobs/j/placement").json()["status"] == "intents-only"
    onos.aggregation = {}
    assert svc.reconcile()["repaired"] == ["j"]
    assert client.get("/api/v1/jobs/j/placement").json()["status"] == "applied"
    assert "j" in onos.aggregation
    assert svc.reconcile()["repaired"] == []  # converged: nothing more


def test_error_responses_are_in_the_openapi_document(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    paths = doc["paths"]
    assert "detail" in doc["components"]["schemas"]["ErrorOut"]["properties"]
    want = {
        ("/api/v1/jobs", "post"): {"401", "409", "413", "415", "422"},
        ("/api/v1/jobs/{job_id}", "get"): {"404"},
        ("/api/v1/jobs/{job_id}", "delete"): {"401", "404"},
        ("/api/v1/jobs/{job_id}/placement", "post"): {"404", "409", "415"},
        ("/api/v1/jobs/{job_id}/placement", "get"): {"404"},
        ("/api/v1/placements", "post"): {"409", "413", "415"},
        ("/api/v1/jobs/{job_id}/what-if", "get"): {"404", "409", "429"},
        ("/api/v1/reconcile", "post"): {"401", "415", "503"},
    }
    for (path, method), codes in want.items():
        got = set(paths[path][method]["responses"])
        assert codes <= got, (path, method, codes - got)
        err = paths[path][method]["responses"][sorted(codes)[0]]
        assert err["description"], err
        if err["content"]["application/json"]["schema"] != {
            "$ref": "#/components/schemas/HTTPValidationError"
        }:
            assert err["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorOut"), err


def test_a_chunked_body_over_the_limit_gets_413_over_real_http(settings: Settings) -> None:
    app = create_app(settings, loop=False)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)

        def post_chunked(total: int) -> tuple[int, bytes]:
            body = b'{"id": "big", "pad": "' + b"x" * total + b'"}'
            c = socket.create_connection(("127.0.0.1", port), timeout=10)
            c.sendall(
                b"POST /api/v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
                b"Connection: close\r\n\r\n"
            )
            try:
                for i in range(0, len(body), 65536):
                    part = body[i : i + 65536]
                    c.sendall(b"%x\r\n%s\r\n" % (len(part), part))
                c.sendall(b"0\r\n\r\n")
            except OSError:
                pass  # the server answered and closed before the whole body went
            reply = b""
            while chunk := c.recv(65536):
                reply += chunk
            c.close()
            return int(reply.split(b" ", 2)[1]), reply

        status, reply = post_chunked(2_200_000)
        assert status == 413, reply[:300]
        assert b"request body over" in reply
        # Under the limit, the same way of sending is read whole (a 422 on its content).
        status, reply = post_chunked(50_000)
        assert status == 422, reply[:300]
    finally:
        server.should_exit = True
        t.join(10)
        app.state.service.close()


# --- issue 28, item 6: blank tokens, Host names, slow bodies ------------------------------


@pytest.mark.parametrize("blank", ["", " ", "\t \n"])
def test_a_blank_token_is_refused_naming_the_setting(tmp_path: Path, blank: str) -> None:
    """Whitespace is refused naming the setting; empty is unset (compose passes an empty
    one to mean "use the token file"), so without a file the public address is refused."""
    env = {"AGG_OPTIMIZER_DB_PATH": str(tmp_path / "db"), "AGG_OPTIMIZER_API_TOKEN": blank}
    r = serve("--host", "0.0.0.0", "--port", "1", env=env)
    assert r.returncode == 2, r.stderr
    if blank:
        assert "api_token" in r.stderr and "blank" in r.stderr, r.stderr
    else:
        assert "refusing to listen on 0.0.0.0 without an API token" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "db").exists()


def test_without_a_token_only_loopback_host_names_are_answered(onos, influx, bucket, tmp_path):
    s = make_settings(onos, influx, bucket, tmp_path / "db", allowed_hosts=[])
    with TestClient(create_app(s, loop=False), base_url="http://127.0.0.1:8080") as c:
        for host in ("evil.example", "evil.example:8080", "10.0.0.1", "127.0.0.1.evil.example"):
            r = c.post("/api/v1/jobs", json=JOB, headers={**JSON, "Host": host})
            assert r.status_code == 421 and "AGG_OPTIMIZER_API_TOKEN" in r.text, (host, r.text)
            assert c.get("/api/v1/jobs", headers={"Host": host}).status_code == 421
        assert c.get("/api/v1/jobs").json() == []  # nothing was created
        for host in ("127.0.0.1:8080", "localhost:8080", "localhost", "[::1]:8080"):
            assert c.get("/api/v1/jobs", headers={"Host": host}).status_code == 200, host
        assert c.post("/api/v1/jobs", json=JOB, headers=JSON).status_code == 201
    # With a token, any name (the token is what guards it).
    s2 = make_settings(onos, influx, bucket, tmp_path / "db2", api_token="t", allowed_hosts=[])
    with TestClient(create_app(s2, loop=False)) as c:
        assert c.get("/api/v1/jobs", headers={"Host": "optimizer:8080"}).status_code == 200


def test_a_body_that_does_not_arrive_is_cut_off(onos, influx, bucket, tmp_path) -> None:
    """Half a body, then silence: 408 after `body_timeout_s`, the connection closed."""
    s = make_settings(onos, influx, bucket, tmp_path / "db", body_timeout_s=1.0)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(s, loop=False), log_level="warning"))
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 120
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        with socket.create_connection(("127.0.0.1", port), timeout=60) as c:
            c.sendall(
                b"POST /api/v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"id": '
            )
            t0 = time.monotonic()
            answer = b""
            while chunk := c.recv(4096):
                answer += chunk
            waited = time.monotonic() - t0
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert b"within 1 s" in answer and 0.9 <= waited < 60, waited
    finally:
        server.should_exit = True
        t.join(30)
        app_svc = server.config.app
        del app_svc
