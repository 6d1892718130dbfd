"""Settings: environment variables `INT_COLLECTOR_*`, or a TOML file, read once at start.

Precedence: keyword arguments (CLI options), then environment, then the TOML file named by
`--config` (keys as below, top level or under `[int_collector]`). A bad value stops the
program with one line naming the setting.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class SettingsError(Exception):
    """A setting is missing or invalid; the message names it."""


class StartError(Exception):
    """The service cannot start (an address cannot be bound, a worker fails); one line."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="INT_COLLECTOR_", extra="forbid")

    # Where reports arrive
    listen_host: str = "0.0.0.0"
    listen_port: int = Field(32766, ge=0, le=65535)
    # Receiving processes `serve` starts, each with its own socket on the same port
    # (SO_REUSEPORT): a Telemetry Report v2.0 goes to the worker its reporting switch's
    # Node ID hashes to (a BPF program on the group, listen.balancer), anything else to the
    # one the kernel's hash of its addresses and ports picks, so each switch's reports all
    # reach one process (docs/collector.md).
    # 1 by default: one process holds one view of every link; raise it when one core cannot
    # keep up (see docs/benchmarks/collector.md).
    workers: int = Field(1, ge=1, le=64)
    # A worker that dies is restarted; more than this many restarts within a minute stop
    # the service (exit status 1) so that its supervisor sees the failure.
    worker_restart_limit: int = Field(5, ge=0, le=1000)
    # How long `serve` waits for every worker to read its socket before it gives up (one
    # line, status 2). Loading the compiled receive path takes about a second; compiling it,
    # where `int-collector compile` has not run since install, 15 CPU-seconds, minutes of
    # wall time on a loaded 2-core machine.
    start_timeout_s: float = Field(600.0, gt=0)
    # Each socket's receive buffer: what waits while a worker is not scheduled. Asked with
    # SO_RCVBUFFORCE where the process may (CAP_NET_ADMIN), else capped by
    # net.core.rmem_max.
    receive_buffer_bytes: int = Field(8 * 1024 * 1024, ge=65536)
    # The compiled receive path (int_collector/fast.py, numba): recvmmsg batches decoded
    # and folded at machine speed, the Python decoder for any other shape. False: the
    # Python reference path only.
    fast_path: bool = True
    # This collector's name where several collectors write one bucket, each receiving the
    # reports of its own switches (docs/collector.md, "Several collectors"). Set, it tags
    # every point `collector=<id>` (`<id>/<worker>` with workers > 1), so each series has
    # one writer; the service merges a link's series (a utilisation from byte counts,
    # `utilization_from_bytes`, covers only the packets this collector's sinks reported,
    # and adds up). Empty (default): no tag.
    collector_id: str = Field("", pattern=r"^[A-Za-z0-9_.-]{0,64}$")
    http_host: str = "127.0.0.1"
    http_port: int = Field(9273, ge=0, le=65535, description="/metrics and /healthz; 0: any")

    # How the monitored packet marks INT after its L4 header (INT v2.1 §4.6)
    int_dscp: int | None = Field(0x17, ge=0, le=63)
    int_dscp_mask: int = Field(0x3F, ge=0, le=63)
    int_udp_ports: list[int] = Field(default_factory=list)
    # INT domains whose INT source adds 'source-only' domain-specific metadata at the bottom
    # of the INT-MD stack (INT v2.1 §5.8; Hop ML excludes it): {Domain Specific ID: {DS
    # Instruction bit (0 = MSB): words it adds}}, e.g. {21587: {0: 2}} for the spec's
    # example (domain 0x5453, a MAC address in two words). Bits not listed are per-hop DS
    # metadata. A report of a domain not listed whose DS Instruction asks for more than Hop
    # ML leaves room for has hops that cannot be told apart from its source-only metadata:
    # its stack is not read (reason `source_only_unknown`, docs/protocols.md).
    source_only_metadata: dict[int, dict[int, int]] = Field(default_factory=dict)

    # Units of the devices' metadata
    v2_time_unit_ns: float = Field(1.0, gt=0, description="tick of v2 latency and timestamps")
    v1_time_unit_ns: float = Field(1000.0, gt=0, description="bmv2 counts microseconds")
    # ONOS's bmv2 int.p4 adds the sink's hop to the report's clone, with the mirror port
    # towards the collector as its egress port: that newest hop of a v1 report is kept on
    # the flow's path but attributed to no link (its latency is not the flow's either).
    v1_sink_hop_is_mirror: bool = True
    tx_utilization_full_scale: float = Field(
        1_000_000.0, gt=0, description="tx-utilisation field value meaning 100%"
    )
    link_speed_bps: float = Field(10e9, gt=0, description="for utilisation from byte counts")
    # The in-network aggregation protocol's UDP destination port (p4/include/defines.p4):
    # the share of reported packets of each port that carry it is kept as
    # `aggregation_share`, so the optimizer can tell its jobs' own traffic from congestion.
    # None: not kept.
    aggregation_udp_port: int | None = Field(48879, ge=1, le=65535)
    utilization_window_ns: float = Field(10e6, gt=0)

    # Derived state
    ewma_alpha: float = Field(0.2, gt=0, le=1)
    max_links: int = Field(65536, ge=1)
    max_flows: int = Field(10000, ge=1)
    # int_flow points written per tick at most (oldest news first; the rest wait for the
    # next tick): past max_flows active flows every report is a new flow, and a point each
    # cost the receive loop 4-10x its rate (issue 29). A flow evicted before its point was
    # written is counted (`flows_evicted_unwritten`).
    max_flow_points: int = Field(1000, ge=1)
    # Plausibility: what bad input on the report port can create (docs/collector.md). With
    # allowed_switches, datagrams of other reporting nodes are dropped
    # (`switch_not_allowed`) and hops of other nodes make no link. Without it, a link, and
    # a reporting switch, becomes a series only once link_min_reports distinct datagrams
    # (by sequence number, and ingress timestamp for v1) showed it; until then it waits,
    # not written, in a table of max_pending_links that drops its oldest when full.
    allowed_switches: list[int] = Field(default_factory=list)
    link_min_reports: int = Field(3, ge=1, le=64)
    max_pending_links: int = Field(4096, ge=1)

    # Change detection: write a series when a smoothed value moves by at least
    # max(absolute, relative * last written), or when keepalive_s has passed.
    latency_threshold_ns: float = Field(1000.0, ge=0)
    queue_threshold: float = Field(4.0, ge=0)
    utilization_threshold: float = Field(0.02, ge=0)
    relative_threshold: float = Field(0.1, ge=0)
    keepalive_s: float = Field(30.0, gt=0)
    # A link or report-sequence series with observations not yet in a point (its `samples`,
    # `received`) is written within this long whatever the thresholds say: it bounds what
    # a SIGKILL loses (with keepalive_s alone, up to 30 s of a steady series' hops). Flows
    # carry no counts and follow the thresholds and keepalive_s.
    max_unwritten_s: float = Field(0.2, gt=0)
    tick_s: float = Field(0.2, gt=0, le=60)

    # InfluxDB (2.x: token, org, bucket; 1.8: token "user:password" or "", org "-",
    # bucket "database/retention-policy")
    influx_url: str = "http://127.0.0.1:8086"
    influx_token: str = ""
    influx_org: str = "-"
    influx_bucket: str = "telemetry/autogen"
    influx_timeout_s: float = Field(5.0, gt=0)
    batch_size: int = Field(5000, ge=1)
    flush_interval_s: float = Field(0.2, gt=0)
    buffer_points: int = Field(100_000, ge=1, description="backlog bound; oldest dropped")
    retry_initial_s: float = Field(0.5, gt=0)
    retry_max_s: float = Field(30.0, gt=0)

    @field_validator("int_udp_ports")
    @classmethod
    def _ports(cls, v: list[int]) -> list[int]:
        for p in v:
            if not 0 < p < 65536:
                raise ValueError(f"UDP port {p} is not in 1..65535")
        return v

    @field_validator("source_only_metadata")
    @classmethod
    def _source_only(cls, v: dict[int, dict[int, int]]) -> dict[int, dict[int, int]]:
        for domain, bits in v.items():
            if not 0 <= domain <= 0xFFFF:
                raise ValueError(f"Domain Specific ID {domain} is not in 0..65535")
            for bit, words in bits.items():
                if not 0 <= bit <= 15 or not 0 <= words <= 255:
                    raise ValueError(
                        f"domain {domain}: DS Instruction bit {bit} (0-15) with {words} words "
                        "(0-255)"
                    )
        return v

    @field_validator("influx_url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return v.rstrip("/")

    @model_validator(mode="after")
    def _retry(self) -> Settings:
        if self.retry_max_s < self.retry_initial_s:
            raise ValueError("retry_max_s must be >= retry_initial_s")
        return self


def _describe(e: ValidationError, source: str) -> str:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"]) or "settings"
    msg = "unknown setting" if err["type"] == "extra_forbidden" else err["msg"]
    if source.startswith("INT_COLLECTOR_"):
        return f"{source}: {msg}"
    return f"{source}: {loc}: {msg}"


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Settings from overrides, environment and an optional TOML file; SettingsError if bad."""
    file_values: dict[str, Any] = {}
    if config_file is not None:
        try:
            file_values = tomllib.loads(Path(config_file).read_text())
        except OSError as e:
            raise SettingsError(f"{config_file}: cannot read ({e.strerror})") from None
        except tomllib.TOMLDecodeError as e:
            raise SettingsError(f"{config_file}: not valid TOML ({e})") from None
        file_values = file_values.get("int_collector", file_values)
    try:
        env_only = Settings()  # environment and defaults
    except ValidationError as e:
        loc = e.errors()[0]["loc"]
        raise SettingsError(
            _describe(e, f"INT_COLLECTOR_{str(loc[0]).upper()}" if loc else "environment")
        ) from None
    env_set = {k: v for k, v in env_only.model_dump().items() if k in env_only.model_fields_set}
    merged = {**file_values, **env_set, **overrides}
    try:
        return Settings.model_validate(merged)
    except ValidationError as e:
        bad = str(e.errors()[0]["loc"][0]) if e.errors()[0]["loc"] else ""
        if bad in overrides:
            source = "option"
        elif bad in env_set:
            source = f"INT_COLLECTOR_{bad.upper()}"
        else:
            source = str(config_file) if config_file else "settings"
        raise SettingsError(_describe(e, source)) from None
