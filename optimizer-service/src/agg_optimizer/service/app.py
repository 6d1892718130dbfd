"""The FastAPI application: /api/v1 jobs, placements, what-if, topology, telemetry; health.

Every route is a plain `def`: FastAPI runs it on its thread pool, so the LP and the blocking
ONOS and InfluxDB calls never run on the event loop.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi_offline import FastAPIOffline
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    StrictBool,
)
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..documents import MAX_WEIGHT, MIN_WEIGHT
from ..engine import STRATEGIES
from ..peers import POLICIES as PEER_POLICIES
from ..scheduling import POLICIES
from .core import BadField, Conflict, NotFound, Service, TooLarge, Unavailable
from .settings import Settings, resolve_token


def _no_bool(v: Any) -> Any:
    """JSON `true` is not a number here (pydantic's lax mode would read it as 1)."""
    if isinstance(v, bool):
        raise ValueError("a number is required, not a boolean")
    return v


Count = Annotated[PositiveInt, BeforeValidator(_no_bool)]
JOB_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
HOST_REF = r"^[0-9A-Za-z:./_-]{1,64}$"
Strategy = Literal[tuple(STRATEGIES)]  # type: ignore[valid-type]
Policy = Literal[tuple(POLICIES)]  # type: ignore[valid-type]
PeerPolicy = Literal[PEER_POLICIES]  # type: ignore[valid-type]


class JobIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        json_schema_extra={
            "examples": [
                {
                    "id": "resnet-a",
                    "workers": ["00:00:00:00:00:01/None", "10.0.0.2"],
                    "ps": "00:00:00:00:00:04",
                    "update_bytes": 100_000_000,
                    "strategy": "agg",
                }
            ]
        },
    )
    id: str = Field(pattern=JOB_ID, description="Job id: letters, digits, `_.-`, ≤ 64.")
    workers: list[Annotated[str, Field(pattern=HOST_REF)]] = Field(
        min_length=1, description="ONOS host ids, MACs or IPs of the workers."
    )
    ps: str = Field(pattern=HOST_REF, description="The parameter server (host id, MAC or IP).")
    update_bytes: Count = Field(le=10**12)
    weight: Annotated[float, BeforeValidator(_no_bool)] = Field(1.0, ge=MIN_WEIGHT, le=MAX_WEIGHT)
    # Bounds inside Annotated: on the `| None` union pydantic would publish `ge`/`le` as
    # unknown keywords instead of JSON Schema's `minimum`/`maximum`.
    max_aggregators: Annotated[int, Field(gt=0, le=10_000), BeforeValidator(_no_bool)] | None = None
    pool_slots: Count = Field(128, le=1 << 20)
    strategy: Strategy = "agg"  # type: ignore[valid-type]


class StrategyIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"strategy": "ps"}]})
    strategy: Strategy  # type: ignore[valid-type]


class PlaceAllIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"jobs": ["resnet-a"], "dry_run": True}]}
    )
    jobs: list[Annotated[str, Field(pattern=JOB_ID)]] | None = Field(
        None, max_length=10_000, description="Job ids; none means every job."
    )
    dry_run: StrictBool = False


class ProgressIn(BaseModel):
    """What a job reports of its training; the scheduler orders by it (JPAS: least progress
    first; Grouper: cojob and stage)."""

    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        json_schema_extra={
            "examples": [
                {"iterations_done": 120, "iterations_total": 1000},
                {"progress": 0.4, "cojob": "hp-search-7", "stage": 2, "rounds_left": 50},
            ]
        },
    )
    progress: Annotated[float, Field(ge=0.0, le=1.0), BeforeValidator(_no_bool)] | None = Field(
        None, description="Fraction of training done; or give iterations."
    )
    iterations_done: (
        Annotated[NonNegativeInt, Field(le=10**12), BeforeValidator(_no_bool)] | None
    ) = None
    iterations_total: Annotated[int, Field(gt=0, le=10**12), BeforeValidator(_no_bool)] | None = (
        None
    )
    loss: Annotated[float, Field(ge=0.0, le=1e12), BeforeValidator(_no_bool)] | None = None
    cojob: str | None = Field(None, pattern=JOB_ID, description="The search this trial is in.")
    stage: Annotated[NonNegativeInt, Field(le=10**6), BeforeValidator(_no_bool)] = 0
    rounds_left: Count = Field(1, le=10**9, description="Rounds left in the current stage.")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "agg_optimizer_requests", "HTTP requests", ["route", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "agg_optimizer_request_seconds",
            "HTTP request latency",
            ["route"],
            registry=self.registry,
        )
        self.events = Counter(
            "agg_optimizer_events", "Service events", ["event"], registry=self.registry
        )


DRAIN_FACTOR = 16  # a body over the limit is read and dropped up to this many times it


class BodyLimit:
    """ASGI middleware: 413 when a request body exceeds `max_bytes`, declared or streamed
    (chunked). The body is read here first, up to the limit, and handed on whole: a body
    cut off inside the app would surface as FastAPI's 400 "error parsing the body"."""

    def __init__(self, app: Any, max_bytes: int, timeout_s: float = 10.0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        declared = dict(scope.get("headers") or []).get(b"content-length")
        too_big = JSONResponse({"detail": f"request body over {limit} bytes"}, 413)
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await too_big(scope, receive, send)
            return
        if declared == b"0" or scope.get("method") in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        seen = 0
        # The whole body within `timeout_s`: a client that sends half a body and waits
        # would otherwise hold a connection and a buffer for as long as it likes.
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        while True:
            try:
                msg = await asyncio.wait_for(
                    receive(), max(0.0, deadline - asyncio.get_running_loop().time())
                )
            except TimeoutError:
                slow = JSONResponse(
                    {"detail": f"request body not received within {self.timeout_s:g} s"},
                    408,
                    headers={"Connection": "close"},
                )
                await slow(scope, receive, send)
                return
            if msg["type"] != "http.request":  # the client went away
                return
            body = msg.get("body", b"")
            seen += len(body)
            if seen > limit:
                # Read and drop what the client is still sending (up to a bound) before
                # answering: once the answer is complete the server stops reading, and
                # closing on unread data resets the connection, so the client may lose
                # the 413 it was about to read.
                while msg.get("more_body", False) and seen <= DRAIN_FACTOR * limit:
                    msg = await receive()
                    if msg["type"] != "http.request":
                        return  # the client went away
                    seen += len(msg.get("body", b""))
                await too_big(scope, receive, send)
                return
            chunks.append(body)
            if not msg.get("more_body", False):
                break
        whole = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        given = False

        async def replay() -> dict:
            nonlocal given
            if not given:
                given = True
                return whole
            return await receive()

        await self.app(scope, replay, send)


def _loopback_ip(name: str) -> bool:
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:  # a name, not an address: `127.0.0.1.evil.example` is no loopback
        return False


class LoopbackHost:
    """ASGI middleware for a service without an API token (it then listens on loopback
    only): a request whose Host is not a loopback name is refused (421). A web page whose
    name the attacker re-points at 127.0.0.1 (DNS rebinding) would otherwise reach the API
    from the user's browser as its own origin."""

    NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})

    def __init__(self, app: Any, extra: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.allowed = self.NAMES | {h.lower() for h in extra}

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1").lower()
        if raw.startswith("["):  # [v6]:port
            name = raw.split("]", 1)[0] + "]"
        elif raw.count(":") == 1:
            name = raw.split(":", 1)[0]
        else:
            name = raw
        if name in self.allowed or _loopback_ip(name):
            await self.app(scope, receive, send)
            return
        refused = JSONResponse(
            {
                "detail": f"Host {raw!r} refused: without an API token this service answers "
                "loopback names only (localhost, 127.0.0.1, [::1]); set "
                "AGG_OPTIMIZER_API_TOKEN, or list the name in AGG_OPTIMIZER_ALLOWED_HOSTS"
            },
            421,
        )
        await refused(scope, receive, send)


class Observe:
    """ASGI middleware: request count and latency per route. Plain ASGI, not
    `@app.middleware("http")`, whose request/response wrapping cost more per request than
    a cached dry run."""

    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 500

        async def sent(msg: dict) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            await send(msg)

        try:
            await self.app(scope, receive, sent)
        finally:
            name = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.requests.labels(name, str(status)).inc()
            self.metrics.latency.labels(name).observe(time.perf_counter() - t0)


class RateLimit:
    """A token bucket: `per_minute` events a minute, bursts up to that many."""

    def __init__(self, per_minute: int) -> None:
        self.rate = per_minute / 60.0
        self.capacity = float(per_minute)
        self.tokens = float(per_minute)
        self.at = time.monotonic()
        self.lock = threading.Lock()

    def take(self) -> float:
        """0 if an event may go now (and count it), else the seconds until one may."""
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
            self.at = now
            if self.tokens >= 1.0:
                self.tokens -= 1.0
                return 0.0
            return (1.0 - self.tokens) / self.rate


def _encodable(value: Any) -> Any:
    """`value` with every string made encodable as UTF-8: a lone surrogate (JSON's
    `"\\ud800"` decodes to one) becomes its escape, `\\ud800`, so an answer that echoes
    the input can always be sent."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
        return value
    if isinstance(value, dict):
        return {_encodable(k): _encodable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_encodable(v) for v in value]
    return value


class SafeJSONResponse(JSONResponse):
    """JSONResponse that never fails on a string it cannot encode (see `_encodable`)."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return super().render(_encodable(content))


def _json_safe_error(err: dict[str, Any]) -> dict[str, Any]:
    out = {"loc": list(err.get("loc", ())), "msg": err.get("msg", ""), "type": err.get("type")}
    try:
        json.dumps(err.get("input"), allow_nan=False)
        out["input"] = err.get("input")
    except (TypeError, ValueError):
        out["input"] = repr(err.get("input"))[:100]
    return out


class ErrorOut(BaseModel):
    detail: Any = Field(description="What was wrong: a message, or FastAPI's list of fields.")


def _err(*codes: int) -> dict[int | str, dict[str, Any]]:
    what = {
        400: "a malformed request",
        401: "the bearer token is missing or wrong",
        404: "no such job, or no placement computed yet",
        409: "the placement cannot be made (the reason names the job and field)",
        413: "the request body is too large, or the job asks too much",
        415: "a mutation without the token must be sent as application/json",
        422: "a field is invalid (loc names it)",
        429: "too many what-if computations; Retry-After says when to try again",
        503: "ONOS or InfluxDB is unavailable",
    }
    return {c: {"model": ErrorOut, "description": what[c]} for c in codes}


def create_app(settings: Settings, service: Service | None = None, *, loop: bool = True) -> FastAPI:
    svc = service or Service(settings)
    metrics = Metrics()
    token = resolve_token(settings)
    what_if_limit = RateLimit(settings.what_if_per_minute)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Iterator[None]:  # type: ignore[misc]
        def lead() -> None:
            # A reconcile that cannot run (ONOS down, the owner claim not yet ours) records
            # that nothing is verified: no job reads `applied` until one has (Service.observed).
            try:
                svc.reconcile()
            except Unavailable as e:
                metrics.events.labels("reconcile_deferred").inc()
                app.state.reconcile_error = str(e)

        # Nothing is written to ONOS before this database's owner claim is in (ownership.py);
        # the first claim now, then renewed in the background.
        svc.ownership.check()
        svc.ownership.start()
        # Only the leader of the instances sharing this database touches the fabric; the
        # loop and the scheduler skip their passes while this instance stands by.
        svc.lease.start(lead, lambda: None)
        svc.start_probe()
        svc.warm_topology()
        if loop:
            svc.start_loop()
            svc.start_scheduler()
        yield
        svc.stop_loop()
        # A clean stop lets go of the claim (another database may take this ONOS over at
        # once); replicas of this database claim it again within a third of its TTL.
        svc.ownership.stop(release=True)
        svc.lease.stop()

    app = FastAPIOffline(
        default_response_class=SafeJSONResponse,
        title="innet-agg optimizer",
        version="1",
        description="Places in-network aggregation for training jobs and applies it in ONOS.",
        lifespan=lifespan,
    )
    app.state.service = svc
    app.state.reconcile_error = None

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        """FastAPI's own 422, without the offending input where JSON cannot carry it (NaN,
        Infinity: rendering them raised and answered 500)."""
        return SafeJSONResponse({"detail": [_json_safe_error(e) for e in exc.errors()]}, 422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        """FastAPI's own answer to an HTTPException, able to carry any string it names."""
        if exc.status_code in (204, 304):
            return Response(status_code=exc.status_code, headers=exc.headers)
        return SafeJSONResponse({"detail": exc.detail}, exc.status_code, exc.headers)

    @app.exception_handler(Unavailable)
    async def unavailable(request: Request, exc: Unavailable) -> JSONResponse:
        """A dependency down where no route mapped it (the database under a cached read):
        503 naming it, as everywhere else."""
        return JSONResponse({"detail": str(exc)}, 503, {"Retry-After": "1"})

    dry_flights: dict[tuple, asyncio.Future[bytes]] = {}

    async def dry_run_json(job_ids: list[str] | None) -> bytes:
        """A dry run's JSON: the cached answer if any (on the event loop); otherwise one
        computation in the thread pool for every request of the same jobs, store version
        and view that arrives while it runs. The waiting requests hold no thread (with one
        each, 50 clients of uncached per-job dry runs had a p99 of 81 ms; 60 ms so)."""
        data = svc.dry_run_cached(job_ids)
        if data is not None:
            return data
        view = svc._cached_view()
        key = (tuple(job_ids) if job_ids else None, svc.store.version, view and view.seq)
        flight = dry_flights.get(key)
        if flight is None:
            flight = asyncio.ensure_future(
                run_in_threadpool(errors, lambda: svc.dry_run_json(job_ids))
            )
            dry_flights[key] = flight
            flight.add_done_callback(lambda _: dry_flights.pop(key, None))
        return await asyncio.shield(flight)

    def errors(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except NotFound as e:
            raise HTTPException(404, f"unknown {e.args[0]}") from None
        except Conflict as e:
            raise HTTPException(409, str(e)) from None
        except TooLarge as e:
            raise HTTPException(413, str(e)) from None
        except BadField as e:
            raise HTTPException(
                422,
                [
                    {
                        "loc": ["body", *e.field.replace("[", ".").replace("]", "").split(".")],
                        "msg": e.message,
                        "type": "value_error",
                    }
                ],
            ) from None
        except Unavailable as e:
            raise HTTPException(503, str(e)) from None

    def authorized(authorization: str | None) -> bool:
        """`Authorization: Bearer <token>`, exactly (the scheme's case aside, RFC 7235)."""
        if not token or not authorization:
            return False
        scheme, _, given = authorization.partition(" ")
        return scheme.lower() == "bearer" and secrets.compare_digest(given.encode(), token.encode())

    async def mutating(
        request: Request,
        authorization: Annotated[str | None, Header()] = None,
        content_type: Annotated[str | None, Header()] = None,
    ) -> None:
        if token:
            if not authorized(authorization):
                raise HTTPException(
                    401,
                    "Authorization: Bearer <token> required (AGG_OPTIMIZER_API_TOKEN)",
                    {"WWW-Authenticate": "Bearer"},
                )
            return
        # No token (loopback only): a cross-site form can post here, but it cannot send
        # JSON's content type without the browser asking first, which we never allow.
        media = (content_type or "").split(";")[0].strip().lower()
        if request.method == "POST" and media != "application/json":
            raise HTTPException(
                415,
                "send Content-Type: application/json (required for mutations when no API "
                "token is set), or set AGG_OPTIMIZER_API_TOKEN and send it as a bearer token",
            )

    auth = [Depends(mutating)]
    v1 = "/api/v1"

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, Any]:  # on the event loop: never queued behind solves
        """ok, or degraded naming what must never happen and did: overlapping slot pools,
        another writer on this ONOS (docs/service.md, "Invariants")."""
        return svc.invariants.health()

    @app.get("/readyz", tags=["health"], responses={503: {"description": "a dependency is down"}})
    def readyz() -> Any:
        checks = svc.readiness()
        ok = all(v == "ok" for v in checks.values())
        role = "leader" if svc.lease.leading else f"standby (leader: {svc.lease.leader})"
        return JSONResponse({"ready": ok, "checks": checks, "role": role}, 200 if ok else 503)

    @app.get("/metrics", tags=["health"], response_class=PlainTextResponse)
    def metrics_text() -> str:
        for k, v in svc.counters.items():
            c = metrics.events.labels(k)
            c.inc(v - c._value.get())
        return generate_latest(metrics.registry).decode()

    @app.post(
        f"{v1}/jobs",
        status_code=201,
        tags=["jobs"],
        dependencies=auth,
        responses=_err(401, 409, 413, 415, 422, 503),
    )
    def create_job(job: JobIn) -> dict[str, Any]:
        spec = job.model_dump(exclude={"strategy"})
        return errors(lambda: svc.create_job(spec, job.strategy))

    @app.get(f"{v1}/jobs", tags=["jobs"])
    def list_jobs() -> list[dict[str, Any]]:
        return [svc.get_job(j["id"]) for j in svc.store.jobs()]

    @app.get(f"{v1}/jobs/{{job_id}}", tags=["jobs"], responses=_err(404))
    def get_job(job_id: str) -> dict[str, Any]:
        return errors(lambda: svc.get_job(job_id))

    @app.delete(
        f"{v1}/jobs/{{job_id}}", tags=["jobs"], dependencies=auth, responses=_err(401, 404, 503)
    )
    def delete_job(job_id: str) -> dict[str, Any]:
        return errors(lambda: svc.delete_job(job_id))

    @app.put(
        f"{v1}/jobs/{{job_id}}/strategy",
        tags=["jobs"],
        dependencies=auth,
        responses=_err(401, 404, 422),
    )
    def set_strategy(job_id: str, body: StrategyIn) -> dict[str, Any]:
        return errors(lambda: svc.set_strategy(job_id, body.strategy))

    @app.post(
        f"{v1}/jobs/{{job_id}}/placement",
        tags=["placements"],
        dependencies=auth,
        responses=_err(401, 404, 409, 415, 503),
    )
    async def place_job(job_id: str, dry_run: bool = False) -> Any:
        if dry_run:  # as for every job: the cached answer on the event loop, if any
            data = await dry_run_json([job_id])
            if data == b"[]":  # deleted since
                raise HTTPException(404, f"unknown job {job_id!r}")
            return Response(data[1:-1], 200, media_type="application/json")  # [one object]
        return (await run_in_threadpool(errors, lambda: svc.place([job_id], False)))[0]

    @app.post(
        f"{v1}/placements",
        tags=["placements"],
        dependencies=auth,
        response_model=list[dict[str, Any]],
        responses=_err(401, 404, 409, 413, 415, 422, 503),
    )
    async def place_all(body: PlaceAllIn) -> Any:
        # Dry runs are served from the service's cache of encoded answers: a hit is answered
        # on the event loop, without a worker thread (under 50 concurrent clients the hop
        # to the thread pool and the GIL convoy it caused set the latency); a miss is
        # computed in the thread pool, once for every identical request waiting.
        if body.dry_run:
            return Response(await dry_run_json(body.jobs), 200, media_type="application/json")
        return await run_in_threadpool(errors, lambda: svc.place(body.jobs, False))

    @app.get(f"{v1}/jobs/{{job_id}}/placement", tags=["placements"], responses=_err(404))
    def current(job_id: str) -> dict[str, Any]:
        def get() -> dict[str, Any]:
            svc.get_job(job_id)
            cur = svc.observed(svc.store.current(job_id))
            if cur is None:
                raise NotFound(f"placement of job {job_id!r} (none computed yet)")
            return cur

        return errors(get)

    @app.get(f"{v1}/jobs/{{job_id}}/placements", tags=["placements"], responses=_err(404))
    def history(job_id: str, limit: Annotated[int, Query(ge=1, le=1000)] = 50) -> Any:
        return errors(lambda: (svc.get_job(job_id), svc.store.placements(job_id, limit))[1])

    @app.get(
        f"{v1}/jobs/{{job_id}}/what-if", tags=["placements"], responses=_err(404, 409, 429, 503)
    )
    def what_if(
        job_id: str, authorization: Annotated[str | None, Header()] = None
    ) -> dict[str, Any]:
        """Every strategy on the job, on the current view. A computed answer is kept for
        that view and job set; callers without the token may make `what_if_per_minute`
        computations a minute (429 with Retry-After beyond that)."""

        def run() -> dict[str, Any]:
            hit = svc.what_if_cached(job_id)
            if hit is not None:
                return hit
            if not authorized(authorization):
                wait = what_if_limit.take()
                if wait:
                    raise HTTPException(
                        429,
                        f"what-if runs every strategy: at most {settings.what_if_per_minute} "
                        "computations a minute without the API token",
                        {"Retry-After": str(max(1, round(wait)))},
                    )
            return svc.what_if(job_id)

        return errors(run)

    @app.post(
        f"{v1}/reconcile", tags=["placements"], dependencies=auth, responses=_err(401, 415, 503)
    )
    def reconcile() -> dict[str, Any]:
        return errors(svc.reconcile)

    @app.post(
        f"{v1}/jobs/{{job_id}}/progress",
        tags=["scheduling"],
        dependencies=auth,
        responses=_err(401, 404, 415, 422),
    )
    def report_progress(job_id: str, body: ProgressIn) -> dict[str, Any]:
        """The job (or its agent) reports its training progress, for the scheduler."""
        return errors(lambda: svc.report_progress(job_id, body.model_dump()))

    @app.get(f"{v1}/schedule", tags=["scheduling"], responses=_err(422))
    def get_schedule(
        policy: Annotated[Policy, Query(description="docs/scheduling.md")] = "sincronia",  # type: ignore[valid-type]
        classes: Annotated[int, Query(ge=2, le=8, description="Priority queues per port")] = 4,
    ) -> dict[str, Any]:  # fmt: skip
        """Every placed job's priority class under `policy` (docs/scheduling.md): jobs on
        classes 1 .. classes-1 in the policy's order, background on 0."""
        return errors(lambda: svc.schedule(policy, classes))

    @app.get(f"{v1}/jobs/{{job_id}}/peers", tags=["peers"], responses=_err(404, 422, 503))
    def job_peers(
        job_id: str,
        policy: Annotated[PeerPolicy, Query(description="docs/peers.md")] = "netmax",  # type: ignore[valid-type]
        compute_s: Annotated[float, Query(ge=0, le=3600, description="Compute, s")] = 0.0,
        kappa: Annotated[float, Query(gt=0, le=1000, description="Consensus weight")] = 1.0,
        model_bytes: Annotated[int | None, Query(ge=1, description="Default: update_bytes")] = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Decentralized training: each worker's probability of picking each peer per
        iteration (NetMax, or a baseline: adpsgd, allreduce, ps, prague), from the job's
        workers and the fabric's current telemetry; re-asked as the telemetry changes."""
        return errors(lambda: svc.peers(job_id, policy, compute_s, kappa, model_bytes))

    @app.get(f"{v1}/schedule/status", tags=["scheduling"])
    def schedule_status() -> dict[str, Any]:
        """What the scheduler last pushed to the switches: the configured policy
        (`AGG_OPTIMIZER_SCHEDULE_POLICY`, none: `status` "off"), every job's class the ONOS
        app holds, and `status` ok / app-not-installed / onos-unavailable / onos-error."""
        return svc.schedule_status()

    @app.post(
        f"{v1}/schedule/apply",
        tags=["scheduling"],
        dependencies=auth,
        responses=_err(401, 415, 422, 503),
    )
    def apply_schedule() -> dict[str, Any]:
        """Re-order now and push the classes that changed (the loop does so every
        `schedule_period_s` and when a job reports a new stage)."""
        return errors(lambda: svc.push_schedule("request"))

    @app.get(f"{v1}/topology", tags=["network"], responses=_err(503))
    def topology() -> dict[str, Any]:
        return errors(lambda: svc.view(fresh=False).topology.model_dump(mode="json"))

    @app.get(f"{v1}/telemetry", tags=["network"], responses=_err(503))
    def telemetry() -> dict[str, Any]:
        def get() -> dict[str, Any]:
            view = svc.view(fresh=False)
            if view.snapshot is None:
                raise Unavailable(view.telemetry_error or "InfluxDB unavailable")
            s = view.snapshot
            return {
                **s.telemetry.model_dump(mode="json"),
                "stale": s.stale,
                "unmapped_rows": s.unmapped,
                "rows": s.rows,
            }

        return errors(get)

    app.add_middleware(
        BodyLimit, max_bytes=settings.max_request_bytes, timeout_s=settings.body_timeout_s
    )
    if not token:
        app.add_middleware(LoopbackHost, extra=frozenset(settings.allowed_hosts))
    app.add_middleware(Observe, metrics=metrics)
    return app
