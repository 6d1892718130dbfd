"""The ASGI layers in front of the routes: metrics, the body limit, the loopback `Host`
check, request observation, and the what-if rate limit."""

from __future__ import annotations

import asyncio
import ipaddress
import threading
import time
from collections.abc import Callable
from typing import Any

from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, Counter, Histogram


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
