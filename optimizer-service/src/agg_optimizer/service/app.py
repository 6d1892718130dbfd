"""The FastAPI application: /api/v1 jobs, placements, what-if, topology, telemetry; health.

Every route is a plain `def`: FastAPI runs it on its thread pool, so the LP and the blocking
ONOS and InfluxDB calls never run on the event loop.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from ..engine import STRATEGIES
from .core import BadField, Conflict, NotFound, Service, TooLarge, Unavailable
from .settings import Settings

JOB_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
HOST_REF = r"^[0-9A-Za-z:./_-]{1,64}$"
Strategy = Literal[tuple(STRATEGIES)]  # type: ignore[valid-type]


class JobIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
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
    update_bytes: PositiveInt = Field(le=10**12)
    weight: float = Field(1.0, gt=0, le=1e6)
    max_aggregators: PositiveInt | None = Field(None, le=10_000)
    pool_slots: PositiveInt = Field(128, le=1 << 20)
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
    dry_run: bool = False


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


class BodyLimit:
    """ASGI middleware: 413 when a request body exceeds `max_bytes` (declared or streamed)."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

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
        seen = 0

        async def counted() -> dict:
            nonlocal seen
            msg = await receive()
            seen += len(msg.get("body", b""))
            if seen > limit:
                raise _BodyTooLarge
            return msg

        try:
            await self.app(scope, counted, send)
        except _BodyTooLarge:
            await too_big(scope, receive, send)


class _BodyTooLarge(Exception):
    pass


def create_app(settings: Settings, service: Service | None = None, *, loop: bool = True) -> FastAPI:
    svc = service or Service(settings)
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Iterator[None]:  # type: ignore[misc]
        try:
            svc.reconcile()
        except Unavailable as e:
            metrics.events.labels("reconcile_deferred").inc()
            app.state.reconcile_error = str(e)
        if loop:
            svc.start_loop()
        yield
        svc.stop_loop()

    app = FastAPI(
        title="innet-agg optimizer",
        version="1",
        description="Places in-network aggregation for training jobs and applies it in ONOS.",
        lifespan=lifespan,
    )
    app.state.service = svc
    app.state.reconcile_error = None

    @app.middleware("http")
    async def observe(request: Request, call_next: Callable[..., Awaitable[Any]]) -> Any:
        t0 = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        name = getattr(route, "path", "unmatched")
        metrics.requests.labels(name, str(response.status_code)).inc()
        metrics.latency.labels(name).observe(time.perf_counter() - t0)
        return response

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

    def mutating(authorization: Annotated[str | None, Header()] = None) -> None:
        token = settings.api_token.get_secret_value() if settings.api_token else None
        if not token:
            return
        given = (authorization or "").removeprefix("Bearer ").strip()
        if not authorization or not secrets.compare_digest(given.encode(), token.encode()):
            raise HTTPException(401, "bearer token required", {"WWW-Authenticate": "Bearer"})

    auth = [Depends(mutating)]
    v1 = "/api/v1"

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"], responses={503: {"description": "a dependency is down"}})
    def readyz() -> Any:
        checks = svc.readiness()
        ok = all(v == "ok" for v in checks.values())
        return JSONResponse({"ready": ok, "checks": checks}, 200 if ok else 503)

    @app.get("/metrics", tags=["health"], response_class=PlainTextResponse)
    def metrics_text() -> str:
        for k, v in svc.counters.items():
            c = metrics.events.labels(k)
            c.inc(v - c._value.get())
        return generate_latest(metrics.registry).decode()

    @app.post(f"{v1}/jobs", status_code=201, tags=["jobs"], dependencies=auth)
    def create_job(job: JobIn) -> dict[str, Any]:
        spec = job.model_dump(exclude={"strategy"})
        return errors(lambda: svc.create_job(spec, job.strategy))

    @app.get(f"{v1}/jobs", tags=["jobs"])
    def list_jobs() -> list[dict[str, Any]]:
        return [svc.get_job(j["id"]) for j in svc.store.jobs()]

    @app.get(f"{v1}/jobs/{{job_id}}", tags=["jobs"])
    def get_job(job_id: str) -> dict[str, Any]:
        return errors(lambda: svc.get_job(job_id))

    @app.delete(f"{v1}/jobs/{{job_id}}", tags=["jobs"], dependencies=auth)
    def delete_job(job_id: str) -> dict[str, Any]:
        return errors(lambda: svc.delete_job(job_id))

    @app.put(f"{v1}/jobs/{{job_id}}/strategy", tags=["jobs"], dependencies=auth)
    def set_strategy(job_id: str, body: StrategyIn) -> dict[str, Any]:
        return errors(lambda: svc.set_strategy(job_id, body.strategy))

    @app.post(f"{v1}/jobs/{{job_id}}/placement", tags=["placements"], dependencies=auth)
    def place_job(job_id: str, dry_run: bool = False) -> dict[str, Any]:
        return errors(lambda: svc.place([job_id], dry_run))[0]

    @app.post(f"{v1}/placements", tags=["placements"], dependencies=auth)
    def place_all(body: PlaceAllIn) -> list[dict[str, Any]]:
        return errors(lambda: svc.place(body.jobs, body.dry_run))

    @app.get(f"{v1}/jobs/{{job_id}}/placement", tags=["placements"])
    def current(job_id: str) -> dict[str, Any]:
        def get() -> dict[str, Any]:
            svc.get_job(job_id)
            cur = svc.store.current(job_id)
            if cur is None:
                raise NotFound(f"placement of job {job_id!r} (none computed yet)")
            return cur

        return errors(get)

    @app.get(f"{v1}/jobs/{{job_id}}/placements", tags=["placements"])
    def history(job_id: str, limit: Annotated[int, Query(ge=1, le=1000)] = 50) -> Any:
        return errors(lambda: (svc.get_job(job_id), svc.store.placements(job_id, limit))[1])

    @app.get(f"{v1}/jobs/{{job_id}}/what-if", tags=["placements"])
    def what_if(job_id: str) -> dict[str, Any]:
        return errors(lambda: svc.what_if(job_id))

    @app.post(f"{v1}/reconcile", tags=["placements"], dependencies=auth)
    def reconcile() -> dict[str, Any]:
        return errors(svc.reconcile)

    @app.get(f"{v1}/topology", tags=["network"])
    def topology() -> dict[str, Any]:
        return errors(lambda: svc.view(with_telemetry=False).topology.model_dump(mode="json"))

    @app.get(f"{v1}/telemetry", tags=["network"])
    def telemetry() -> dict[str, Any]:
        def get() -> dict[str, Any]:
            view = svc.view()
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

    app.add_middleware(BodyLimit, max_bytes=settings.max_request_bytes)
    return app
