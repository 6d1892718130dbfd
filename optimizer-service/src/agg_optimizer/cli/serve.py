"""`agg-optimizer serve`: the REST service under uvicorn."""

from __future__ import annotations

import ipaddress
import socket
import sys
from typing import TYPE_CHECKING, Annotated

import typer

# Everything else is imported by the command that needs it: a command pays only for its own
# libraries (numpy, scipy, networkx, highspy and pydantic's models take about 1.7 s together
# on a small machine; `--help` needs none of them). docs/benchmarks/cli.md.
if TYPE_CHECKING:
    pass

from agg_optimizer.cli.common import UserError, app


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Listen address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Listen port.")] = 8080,
) -> None:
    """Run the REST service (settings from AGG_OPTIMIZER_* variables, docs/service.md)."""
    import gc

    import uvicorn
    from pydantic import ValidationError

    from agg_optimizer.model.validation import describe_validation_error
    from agg_optimizer.service.app import create_app
    from agg_optimizer.service.settings import Settings, resolve_token

    try:
        settings = Settings()
    except ValidationError as e:
        raise UserError(f"settings: {describe_validation_error(e)}") from None
    try:
        token = resolve_token(settings)
    except (OSError, ValueError) as e:
        raise UserError(f"settings: api_token_file: {e}") from None
    if token is None and not _loopback(host):
        raise UserError(
            f"refusing to listen on {host} without an API token: anyone who reaches it could "
            "create and delete jobs and rewrite ONOS intents. Set AGG_OPTIMIZER_API_TOKEN "
            "(e.g. export AGG_OPTIMIZER_API_TOKEN=$(python3 -c 'import secrets; "
            "print(secrets.token_urlsafe(32))')) or AGG_OPTIMIZER_API_TOKEN_FILE (generated "
            "there if missing), or listen on 127.0.0.1"
        )
    if settings.api_token_file is not None and not settings.api_token:
        print(f"agg-optimizer: API token in {settings.api_token_file}", file=sys.stderr)
    import logging

    # The port first: a second instance stops here, before it reads or changes anything
    # (uvicorn alone runs the app's start-up, reconcile included, before it binds).
    sock = _bind(host, port)
    # The service's own decisions (why a job moved) at INFO, beside uvicorn's access log.
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("agg_optimizer").setLevel(logging.INFO)
    from agg_optimizer.service.core import Service
    from agg_optimizer.service.onos import OnosError, OnosUnavailable

    svc = Service(settings)
    # The owner claim in our ONOS app (service/ownership.py): taken by another database, this
    # instance stops here; ONOS not answering, it starts but writes nothing until it holds it.
    svc.ownership.check()
    taken = svc.invariants.health().get("writer")
    if taken:
        svc.close()
        sock.close()
        raise UserError(
            f"{taken}. Refusing to start. Share its database (replicas: one leads, the "
            "others stand by) or give this one another AGG_OPTIMIZER_ONOS_APP_ID"
        )
    try:
        foreign = [] if settings.withdraw_foreign_intents else svc.applier.foreign()
    except (OnosUnavailable, OnosError) as e:
        foreign = []
        print(
            f"agg-optimizer: ownership not checked, ONOS not answering ({e}): nothing is "
            "written to ONOS until this instance holds its owner claim",
            file=sys.stderr,
        )
    if foreign:
        svc.close()
        sock.close()
        raise UserError(
            f"ONOS holds {len(foreign)} intent(s) of app id {settings.onos_app_id} that this "
            f"instance's database ({settings.db_path}) does not own (e.g. {foreign[0]}): "
            "another optimizer instance with another database may be running against this "
            "ONOS. Refusing to start. Share its database (replicas: one leads, the others "
            "stand by), give this one another AGG_OPTIMIZER_ONOS_APP_ID, or, to take the "
            "fabric over after its database was lost, set "
            "AGG_OPTIMIZER_WITHDRAW_FOREIGN_INTENTS=true"
        )
    from agg_optimizer.service.connections import protocol

    config = uvicorn.Config(
        create_app(settings, svc),
        log_level="info",
        http=protocol(settings.http_head_timeout_s),
        timeout_keep_alive=settings.http_idle_timeout_s,  # type: ignore[arg-type]
        limit_concurrency=settings.http_max_connections,
    )
    server = uvicorn.Server(config)
    # What is loaded by now (modules, the app, its schemas) lives as long as the process:
    # out of the collector's sight, a full collection scans only what requests made since.
    # Each full collection scanned ~120,000 objects for 60-90 ms, about once a second under
    # load, pausing every request in flight: it was the uncached dry runs' p95 and p99
    # (docs/benchmarks/service-load.md).
    gc.collect()
    gc.freeze()
    server.run(sockets=[sock])


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, or a one-line error naming them."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise UserError(f"--host {host}: {e.strerror}") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise UserError(
            f"cannot listen on {host}:{port}: {e.strerror} (another instance running?)"
        ) from None
    sock.set_inheritable(True)
    return sock


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve anywhere
