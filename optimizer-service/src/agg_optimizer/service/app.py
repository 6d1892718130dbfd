"""The FastAPI application: /api/v1 jobs, placements, what-if, topology, telemetry; health.

Every route is a plain `def`: FastAPI runs it on its thread pool, so the LP and the blocking
ONOS and InfluxDB calls never run on the event loop.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Iterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi_offline import FastAPIOffline
from prometheus_client import generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from agg_optimizer.service.core import BadField, Conflict, NotFound, Service, TooLarge, Unavailable
from agg_optimizer.service.middleware import BodyLimit, LoopbackHost, Metrics, Observe, RateLimit
from agg_optimizer.service.responses import SafeJSONResponse, error_responses, json_safe_error
from agg_optimizer.service.schemas import (
    JobIn,
    PeerPolicy,
    PlaceAllIn,
    Policy,
    ProgressIn,
    StrategyIn,
)
from agg_optimizer.service.settings import Settings, resolve_token


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
        return SafeJSONResponse({"detail": [json_safe_error(e) for e in exc.errors()]}, 422)

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
        view = svc.views.cached()
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
        responses=error_responses(401, 409, 413, 415, 422, 503),
    )
    def create_job(job: JobIn) -> dict[str, Any]:
        spec = job.model_dump(exclude={"strategy"})
        return errors(lambda: svc.create_job(spec, job.strategy))

    @app.get(f"{v1}/jobs", tags=["jobs"])
    def list_jobs() -> list[dict[str, Any]]:
        return [svc.get_job(j["id"]) for j in svc.store.jobs()]

    @app.get(f"{v1}/jobs/{{job_id}}", tags=["jobs"], responses=error_responses(404))
    def get_job(job_id: str) -> dict[str, Any]:
        return errors(lambda: svc.get_job(job_id))

    @app.delete(
        f"{v1}/jobs/{{job_id}}",
        tags=["jobs"],
        dependencies=auth,
        responses=error_responses(401, 404, 503),
    )
    def delete_job(job_id: str) -> dict[str, Any]:
        return errors(lambda: svc.delete_job(job_id))

    @app.put(
        f"{v1}/jobs/{{job_id}}/strategy",
        tags=["jobs"],
        dependencies=auth,
        responses=error_responses(401, 404, 422),
    )
    def set_strategy(job_id: str, body: StrategyIn) -> dict[str, Any]:
        return errors(lambda: svc.set_strategy(job_id, body.strategy))

    @app.post(
        f"{v1}/jobs/{{job_id}}/placement",
        tags=["placements"],
        dependencies=auth,
        responses=error_responses(401, 404, 409, 415, 503),
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
        responses=error_responses(401, 404, 409, 413, 415, 422, 503),
    )
    async def place_all(body: PlaceAllIn) -> Any:
        # Dry runs are served from the service's cache of encoded answers: a hit is answered
        # on the event loop, without a worker thread (under 50 concurrent clients the hop
        # to the thread pool and the GIL convoy it caused set the latency); a miss is
        # computed in the thread pool, once for every identical request waiting.
        if body.dry_run:
            return Response(await dry_run_json(body.jobs), 200, media_type="application/json")
        return await run_in_threadpool(errors, lambda: svc.place(body.jobs, False))

    @app.get(f"{v1}/jobs/{{job_id}}/placement", tags=["placements"], responses=error_responses(404))
    def current(job_id: str) -> dict[str, Any]:
        def get() -> dict[str, Any]:
            svc.get_job(job_id)
            cur = svc.observed(svc.store.current(job_id))
            if cur is None:
                raise NotFound(f"placement of job {job_id!r} (none computed yet)")
            return cur

        return errors(get)

    @app.get(
        f"{v1}/jobs/{{job_id}}/placements", tags=["placements"], responses=error_responses(404)
    )
    def history(job_id: str, limit: Annotated[int, Query(ge=1, le=1000)] = 50) -> Any:
        return errors(lambda: (svc.get_job(job_id), svc.store.placements(job_id, limit))[1])

    @app.get(
        f"{v1}/jobs/{{job_id}}/what-if",
        tags=["placements"],
        responses=error_responses(404, 409, 429, 503),
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
        f"{v1}/reconcile",
        tags=["placements"],
        dependencies=auth,
        responses=error_responses(401, 415, 503),
    )
    def reconcile() -> dict[str, Any]:
        return errors(svc.reconcile)

    @app.post(
        f"{v1}/jobs/{{job_id}}/progress",
        tags=["scheduling"],
        dependencies=auth,
        responses=error_responses(401, 404, 415, 422),
    )
    def report_progress(job_id: str, body: ProgressIn) -> dict[str, Any]:
        """The job (or its agent) reports its training progress, for the scheduler."""
        return errors(lambda: svc.report_progress(job_id, body.model_dump()))

    @app.get(f"{v1}/schedule", tags=["scheduling"], responses=error_responses(422))
    def get_schedule(
        policy: Annotated[Policy, Query(description="docs/scheduling.md")] = "sincronia",  # type: ignore[valid-type]
        classes: Annotated[int, Query(ge=2, le=8, description="Priority queues per port")] = 4,
    ) -> dict[str, Any]:  # fmt: skip
        """Every placed job's priority class under `policy` (docs/scheduling.md): jobs on
        classes 1 .. classes-1 in the policy's order, background on 0."""
        return errors(lambda: svc.schedule(policy, classes))

    @app.get(
        f"{v1}/jobs/{{job_id}}/peers", tags=["peers"], responses=error_responses(404, 422, 503)
    )
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
        responses=error_responses(401, 415, 422, 503),
    )
    def apply_schedule() -> dict[str, Any]:
        """Re-order now and push the classes that changed (the loop does so every
        `schedule_period_s` and when a job reports a new stage)."""
        return errors(lambda: svc.push_schedule("request"))

    @app.get(f"{v1}/topology", tags=["network"], responses=error_responses(503))
    def topology() -> dict[str, Any]:
        return errors(lambda: svc.view(fresh=False).topology.model_dump(mode="json"))

    @app.get(f"{v1}/telemetry", tags=["network"], responses=error_responses(503))
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
