"""Service settings, read once from `AGG_OPTIMIZER_*` environment variables (or a .env file)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AGG_OPTIMIZER_", env_file=None, extra="forbid")

    onos_url: str = Field("http://127.0.0.1:8181/onos/v1", description="ONOS REST base URL.")
    onos_user: str = "onos"
    onos_password: SecretStr = SecretStr("rocks")
    onos_app_id: str = Field("org.innetagg.optimizer", description="Application id of the intents.")
    onos_timeout_s: float = Field(5.0, gt=0)
    onos_retries: int = Field(2, ge=0, le=10, description="Retries of idempotent ONOS calls.")
    intent_wait_s: float = Field(20.0, gt=0, description="How long to wait for INSTALLED.")
    intent_priority: int = Field(40000, ge=1, le=65535)
    link_capacity_gbps: float = Field(10.0, gt=0)

    influx_url: str = "http://127.0.0.1:8086"
    influx_token: SecretStr = SecretStr("")
    influx_org: str = "-"
    influx_bucket: str = Field("telemetry/autogen", description="Bucket (2.x) or db/rp (1.8).")
    decisions_bucket: str | None = Field(None, description="Where decisions go; default: bucket.")
    telemetry_window_s: int = Field(300, ge=1, description="Flux range of the latest-state query.")
    telemetry_stale_s: float = Field(
        60.0, gt=0, description="A link whose newest point is older than this is stale."
    )

    api_token: SecretStr | None = Field(None, description="Bearer token for mutating calls.")
    db_path: Path = Path("agg-optimizer.sqlite")
    max_request_bytes: int = Field(1_000_000, ge=1024)
    max_jobs: int = Field(256, ge=1)
    max_workers_per_job: int = Field(512, ge=1)

    reoptimize_period_s: float = Field(30.0, ge=0, description="0 disables the control loop.")
    utilization_threshold: float = Field(
        0.1, gt=0, le=1, description="A link's utilisation moving this much triggers a re-run."
    )
    switching_penalty_s: float = Field(
        0.01, ge=0, description="Hysteresis: cost of each aggregator not in the current placement."
    )
    default_strategy: str = "agg"
