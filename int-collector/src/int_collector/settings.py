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
    # (SO_REUSEPORT): the kernel hashes a datagram's source and destination address and port
    # to one socket, so each switch's reports all reach one process (docs/collector.md).
    # 1 by default: one process holds one view of every link; raise it when one core cannot
    # keep up (see docs/benchmarks/collector.md).
    workers: int = Field(1, ge=1, le=64)
    # A worker that dies is restarted; more than this many restarts within a minute stop
    # the service (exit status 1) so that its supervisor sees the failure.
    worker_restart_limit: int = Field(5, ge=0, le=1000)
    receive_buffer_bytes: int = Field(8 * 1024 * 1024, ge=65536)
    http_host: str = "127.0.0.1"
    http_port: int = Field(9273, ge=0, le=65535, description="/metrics and /healthz; 0: any")

    # How the monitored packet marks INT after its L4 header (INT v2.1 §4.6)
    int_dscp: int | None = Field(0x17, ge=0, le=63)
    int_dscp_mask: int = Field(0x3F, ge=0, le=63)
    int_udp_ports: list[int] = Field(default_factory=list)

    # Units of the devices' metadata
    v2_time_unit_ns: float = Field(1.0, gt=0, description="tick of v2 latency and timestamps")
    v1_time_unit_ns: float = Field(1000.0, gt=0, description="bmv2 counts microseconds")
    tx_utilization_full_scale: float = Field(
        1_000_000.0, gt=0, description="tx-utilisation field value meaning 100%"
    )
    link_speed_bps: float = Field(10e9, gt=0, description="for utilisation from byte counts")
    utilization_window_ns: float = Field(10e6, gt=0)

    # Derived state
    ewma_alpha: float = Field(0.2, gt=0, le=1)
    max_links: int = Field(65536, ge=1)
    max_flows: int = Field(10000, ge=1)

    # Change detection: write a series when a smoothed value moves by at least
    # max(absolute, relative * last written), or when keepalive_s has passed.
    latency_threshold_ns: float = Field(1000.0, ge=0)
    queue_threshold: float = Field(4.0, ge=0)
    utilization_threshold: float = Field(0.02, ge=0)
    relative_threshold: float = Field(0.1, ge=0)
    keepalive_s: float = Field(30.0, gt=0)
    tick_s: float = Field(0.2, gt=0, le=60)

    # InfluxDB (2.x: token, org, bucket; 1.8: token "user:password" or "", org "-",
    # bucket "database/retention-policy")
    influx_url: str = "http://127.0.0.1:8086"
    influx_token: str = ""
    influx_org: str = "-"
    influx_bucket: str = "telemetry/autogen"
    influx_timeout_s: float = Field(5.0, gt=0)
    batch_size: int = Field(5000, ge=1)
    flush_interval_s: float = Field(1.0, gt=0)
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
