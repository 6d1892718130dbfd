"""`int-collector`: serve, compile, generate, decode.

Bad settings or arguments end the program with status 2 and one line naming the field.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from .settings import SettingsError, StartError, load_settings
from .wire import DecodeError, Decoder, IntMarking

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Collect INT telemetry reports into InfluxDB.",
)


class UserError(Exception):
    """A problem with what the user gave us; printed as one line."""


def _host_port(value: str, what: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"{what}: expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


@app.command()
def serve(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="TOML settings file")
    ] = None,
    listen: Annotated[
        str | None, typer.Option(help="HOST:PORT for reports (default 0.0.0.0:32766)")
    ] = None,
    collector_id: Annotated[
        str | None,
        typer.Option(help="this collector's name when several write one bucket (collector tag)"),
    ] = None,
    log_level: str = "INFO",
) -> None:
    """Receive reports on UDP and keep per-link state in InfluxDB (settings: env or file)."""
    overrides: dict[str, Any] = {}
    if collector_id is not None:
        overrides["collector_id"] = collector_id
    if listen is not None:
        overrides["listen_host"], overrides["listen_port"] = _host_port(listen, "--listen")
    settings = load_settings(config, **overrides)
    # Bind first: from here on reports wait in the sockets while the rest loads and the
    # workers start (`/readyz` says when they are read).
    from .listen import bind_udp

    socks = bind_udp(settings, settings.workers)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    from .supervisor import prestart
    from .supervisor import serve as run

    prestart(settings)

    raise typer.Exit(run(settings, socks))


@app.command()
def compile() -> None:
    """Compile the receive path into numba's cache, once after install (`make sync` and the
    image build run it), so that `serve` loads it in about a second instead of compiling."""
    import time

    t = time.monotonic()
    typer.echo("compiling the receive path into numba's cache (once per install: 15 CPU-s)")
    from . import fast

    fast.warm()
    from . import blast

    blast.warm()  # the generator's compiled sender (`generate --fast`)
    took = time.monotonic() - t
    typer.echo(f"receive path compiled, or loaded from numba's cache, in {took:.1f} s")


@app.command()
def generate(
    target: Annotated[str, typer.Option(help="HOST:PORT of the collector")] = "127.0.0.1:32766",
    rate: Annotated[float, typer.Option(help="reports per second")] = 1000.0,
    switches: Annotated[int, typer.Option(help="switches in the synthetic leaf-spine")] = 8,
    duration: Annotated[float | None, typer.Option(help="seconds (default: until Ctrl-C)")] = None,
    count: Annotated[int | None, typer.Option(help="stop after this many reports")] = None,
    seed: int = 0,
    format: Annotated[str, typer.Option(help="v2 (Telemetry Report 2.0) or v1 (ONOS)")] = "v2",
    per_datagram: Annotated[
        int, typer.Option(help="individual reports per datagram (v2 only; 1-256)")
    ] = 1,
    processes: Annotated[
        int, typer.Option(help="sender processes, each sending for its share of the switches")
    ] = 1,
    fast: Annotated[
        bool, typer.Option(help="send with sendmmsg from compiled code (needs --duration)")
    ] = False,
    flows: Annotated[
        int, typer.Option(help="--fast, v2: distinct flows, round robin over the datagrams")
    ] = 0,
) -> None:
    """Emit valid reports from a changing synthetic fabric."""
    from .generator import generate as run

    if rate <= 0:
        raise UserError(f"--rate: must be > 0, got {rate}")
    if switches < 2:
        raise UserError(f"--switches: need at least 2, got {switches}")
    if format not in ("v1", "v2"):
        raise UserError(f"--format: 'v1' or 'v2', got {format!r}")
    if not 1 <= per_datagram <= 256 or (format == "v1" and per_datagram != 1):
        raise UserError(
            f"--per-datagram: 1-256 for v2, 1 for v1 (one report per datagram), got {per_datagram}"
        )
    if flows < 0 or flows >= 1 << 24 or (flows and (not fast or format != "v2")):
        raise UserError(f"--flows: 0-16777215, with --fast and v2 only, got {flows}")
    if not 1 <= processes <= 64:
        raise UserError(f"--processes: 1-64, got {processes}")
    if fast and (duration is None or count is not None or processes != 1):
        raise UserError("--fast: sends for a --duration, from one process (no --count)")
    try:
        sent = run(
            _host_port(target, "--target"), rate, switches, duration, count, seed, format,
            per_datagram=per_datagram, processes=processes, fast=fast, flows=flows,
        )  # fmt: skip
    except KeyboardInterrupt:
        return
    if fast:
        from .blast import LAST_CPU_S, LAST_ELAPSED_S

        per_s = sent / max(LAST_ELAPSED_S, 1e-9)
        typer.echo(
            f"sent {sent} reports in {LAST_ELAPSED_S:.2f} s ({per_s:.0f}/s), "
            f"{LAST_CPU_S:.2f} s of CPU while sending",
            err=True,
        )
    else:
        typer.echo(f"sent {sent} reports", err=True)


def _jsonable(o: Any) -> Any:
    if isinstance(o, bytes):
        return str(ipaddress.ip_address(o)) if len(o) in (4, 16) else o.hex()
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return {
            f.name: _jsonable(getattr(o, f.name))
            for f in dataclasses.fields(o)
            if getattr(o, f.name) is not None
        }
    if isinstance(o, tuple) and hasattr(o, "_asdict"):
        return {k: _jsonable(v) for k, v in o._asdict().items()}
    if isinstance(o, list | tuple):
        return [_jsonable(x) for x in o]
    return o


@app.command()
def decode(
    hex_data: Annotated[
        list[str] | None, typer.Argument(help="UDP payload in hex, may be split (default: stdin)")
    ] = None,
    int_udp_port: Annotated[list[int] | None, typer.Option(help="UDP ports that mark INT")] = None,
) -> None:
    """Decode one report (hex) and print it as JSON."""
    text = "".join(hex_data) if hex_data else sys.stdin.read()
    try:
        data = bytes.fromhex("".join(text.split()))
    except ValueError as e:
        raise UserError(f"hex: {e}") from None
    decoder = Decoder(IntMarking(udp_ports=frozenset(int_udp_port or ())))
    try:
        reports = decoder.decode(data)
    except DecodeError as e:
        raise UserError(f"report: {e}") from None
    out = []
    for r in reports:
        doc = {
            k: _jsonable(getattr(r, k))
            for k in ("family", "node_id", "hw_id", "seq", "dropped", "congested", "tracked",
                      "intermediate", "flow", "packet_length", "instruction_bitmap", "hop_ml",
                      "remaining_hop_count", "hop_count", "partial_stack", "local", "ingress_ts")
            if getattr(r, k) is not None
        }  # fmt: skip
        doc["hops"] = _jsonable(r.hops())
        out.append(doc)
    typer.echo(json.dumps(out, indent=2))


def main() -> None:
    try:
        app()
    except (UserError, SettingsError, StartError, ValueError) as e:
        print(f"int-collector: error: {e}", file=sys.stderr)
        sys.exit(2)
    except OSError as e:
        print(f"int-collector: error: {e.strerror or e}", file=sys.stderr)
        sys.exit(2)
