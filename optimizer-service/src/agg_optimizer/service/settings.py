"""Service settings, read once from `AGG_OPTIMIZER_*` environment variables (or a .env file)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from agg_optimizer.model.documents import MAX_GBPS, MIN_GBPS


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AGG_OPTIMIZER_", env_file=None, extra="forbid")

    onos_url: str = Field(
        "http://127.0.0.1:8181/onos/v1",
        description="ONOS REST base URL; an ONOS cluster's nodes separated by commas: every "
        "call goes to a live one (the one that answered last first).",
    )
    onos_user: str = "onos"
    onos_password: SecretStr = SecretStr("rocks")
    onos_app_id: str = Field("org.innetagg.optimizer", description="Application id of the intents.")
    onos_timeout_s: float = Field(5.0, gt=0)
    onos_retries: int = Field(2, ge=0, le=10, description="Retries of idempotent ONOS calls.")
    intent_wait_s: float = Field(20.0, gt=0, description="How long to wait for INSTALLED.")
    intent_priority: int = Field(40000, ge=1, le=65535)
    link_capacity_gbps: float = Field(10.0, ge=MIN_GBPS, le=MAX_GBPS)

    influx_url: str = "http://127.0.0.1:8086"
    influx_token: SecretStr = SecretStr("")
    influx_org: str = "-"
    influx_bucket: str = Field("telemetry/autogen", description="Bucket (2.x) or db/rp (1.8).")
    decisions_bucket: str | None = Field(None, description="Where decisions go; default: bucket.")
    telemetry_window_s: int = Field(300, ge=1, description="Flux range of the latest-state query.")
    telemetry_stale_s: float = Field(
        60.0, gt=0, description="A link whose newest point is older than this is stale."
    )

    view_max_age_s: float = Field(
        1.0,
        ge=0,
        description="Reads (dry runs, what-if, topology, telemetry) reuse an ONOS and "
        "InfluxDB view this young; applies and the control loop always read afresh.",
    )
    hosts_max_age_s: float = Field(
        60.0,
        ge=0,
        description="Registration resolves host references in the newest ONOS topology any "
        "call fetched, if this young; a reference it does not know fetches the topology "
        "again before it is refused (0: every registration fetches it).",
    )
    dry_run_cache: bool = Field(
        True,
        description="Answer a dry run from the last one for the same view and store (and, "
        "once the view expired, up to 4 view ages old while one refresh runs). False: "
        "compute every one (benchmarks of the uncached path).",
    )
    probe_period_s: float = Field(1.0, gt=0, description="Background readiness probe period.")
    require_onos_app: bool = Field(
        True,
        description="/readyz is not ready while the innet-agg ONOS app does not serve its REST "
        "on every ONOS node (placements would be applied without aggregation); off for a "
        "fabric that runs intents only.",
    )
    http_head_timeout_s: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="A request's head (request line and headers) must arrive within this "
        "from the connection's opening, or from its first byte on a kept-alive connection; "
        "else the connection is closed (a client that sends nothing, or half a head).",
    )
    http_idle_timeout_s: float = Field(
        5.0,
        gt=0,
        le=3600,
        description="A kept-alive connection idle this long after a response is closed "
        "(uvicorn's timeout_keep_alive).",
    )
    http_max_connections: int = Field(
        2048,
        ge=1,
        le=1_000_000,
        description="Connections and requests in progress past this are answered 503 "
        "(uvicorn's limit_concurrency). The body of a request has its own deadline (10 s).",
    )

    api_token: SecretStr | None = Field(
        None,
        description="Bearer token for mutating calls (`Authorization: Bearer <token>`). "
        "Required to listen on anything but loopback.",
    )
    api_token_file: Path | None = Field(
        None,
        description="Where the token is kept when `api_token` is not set: read from it, or, "
        "if it does not exist, generated into it (mode 0600). Compose uses this.",
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Without an API token only loopback Host names are answered (DNS "
        "rebinding); names listed here are answered too.",
    )
    body_timeout_s: float = Field(
        10.0, gt=0, le=600, description="A request body must arrive whole within this."
    )
    what_if_per_minute: int = Field(
        30,
        ge=1,
        description="What-if runs every strategy: computed answers per minute for callers "
        "without the token (a cached answer costs nothing and is not counted).",
    )
    db_path: Path = Field(
        default_factory=lambda: _state_dir() / "agg-optimizer.sqlite",
        description="SQLite state (jobs, placements, intents); default "
        "$XDG_STATE_HOME/agg-optimizer/, i.e. ~/.local/state/agg-optimizer/.",
    )
    database_url: SecretStr | None = Field(
        None,
        description="postgresql://user:password@host:port/db: the state in PostgreSQL, "
        "shared by replicas of the service (one leads the loop, the scheduler and "
        "reconcile; all answer the API). Unset: SQLite at db_path.",
    )
    fabric: str | None = Field(
        None,
        description="The name replicas sharing a database lead under (one leader per "
        "fabric); default: the ONOS URLs, sorted, and the app id.",
    )
    max_request_bytes: int = Field(1_000_000, ge=1024)
    max_jobs: int = Field(256, ge=1)
    max_workers_per_job: int = Field(512, ge=1)

    reoptimize_period_s: float = Field(30.0, ge=0, description="0 disables the control loop.")
    utilization_threshold: float = Field(
        0.1, gt=0, le=1, description="A link's utilisation moving this much triggers a re-run."
    )
    min_improvement: float = Field(
        0.1,
        ge=0,
        lt=1,
        description="The control loop moves an applied job only when the new placement's "
        "predicted CCT is at least this fraction below the current one's, both on the same "
        "telemetry (hysteresis: routing ties and telemetry noise otherwise move jobs back "
        "and forth).",
    )
    min_improvement_s: float = Field(
        0.005,
        ge=0,
        description="Hysteresis, absolute: the move must also save at least this many "
        "seconds of predicted CCT. Where a job's CCT is a few ms, the relative threshold "
        "alone lets telemetry noise of a few percent utilisation move it (the demo moved a "
        "job for 23.6 -> 20.3 ms with no congestion, then back).",
    )
    switching_penalty_s: float = Field(
        0.01, ge=0, description="Hysteresis: cost of each aggregator not in the current placement."
    )
    default_strategy: str = "agg"
    schedule_policy: str | None = Field(
        None,
        description="Push every placed job's priority class to the switches under this "
        "policy (docs/scheduling.md: fair, fifo, varys, sincronia, baraat, grouper, jpas); "
        "none: classes are only computed on request (GET /api/v1/schedule).",
    )
    schedule_classes: int = Field(4, ge=2, le=8, description="Priority queues per port.")

    withdraw_foreign_intents: bool = Field(
        False,
        description="Withdraw intents of `onos_app_id` that this instance's database does "
        "not own (by default they are left alone and the service refuses to start while "
        "ONOS holds any: another instance with another database may own them). For taking "
        "a fabric over after its database was lost.",
    )
    lease_ttl_s: float = Field(
        15.0,
        gt=0,
        description="Replicas sharing one database: the leader (which runs the loop, the "
        "scheduler and reconcile, and applies) renews its lease every third of this; a "
        "standby takes over once it expires.",
    )
    fault_trace: Path | None = Field(
        None, description="Testing: append each apply step passed to this file."
    )
    fault_kill_at: int | None = Field(
        None, ge=1, description="Testing: SIGKILL the service at this apply step (1-based)."
    )

    @field_validator("api_token")
    @classmethod
    def _token_not_blank(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and v.get_secret_value() == "":
            return None  # unset (compose passes an empty one to mean: use the token file)
        if v is not None and not v.get_secret_value().strip():
            raise ValueError(
                "blank (empty or whitespace): unset it to run on loopback without a token, "
                "or give a real one"
            )
        if v is not None and v.get_secret_value() != v.get_secret_value().strip():
            raise ValueError("has leading or trailing whitespace")
        return v

    @field_validator("onos_url")
    @classmethod
    def _onos_urls(cls, v: str) -> str:
        urls = [u.strip() for u in v.split(",")]
        for u in urls:
            if not u.startswith(("http://", "https://")):
                raise ValueError(
                    f"{u!r} is no ONOS REST base URL (http://host:8181/onos/v1); several are "
                    "separated by commas"
                )
        return ",".join(urls)

    @field_validator("database_url")
    @classmethod
    def _pg_url(cls, v: SecretStr | None) -> SecretStr | None:
        if v is None or v.get_secret_value() == "":
            return None
        if not v.get_secret_value().startswith(("postgresql://", "postgres://")):
            raise ValueError("must start with postgresql:// (unset it for SQLite at db_path)")
        return v

    def onos_urls(self) -> list[str]:
        return self.onos_url.split(",")

    def fabric_name(self) -> str:
        """What one leader is elected for: replicas of one fabric must agree on it."""
        if self.fabric:
            return self.fabric
        urls = sorted(u.rstrip("/") for u in self.onos_urls())
        return f"{','.join(urls)}#{self.onos_app_id}"

    def store_target(self) -> str:
        """The PostgreSQL URL, or the SQLite file."""
        if self.database_url is not None:
            return self.database_url.get_secret_value()
        return str(self.db_path)

    @field_validator("schedule_policy")
    @classmethod
    def _known_policy(cls, v: str | None) -> str | None:
        from agg_optimizer.scheduling.policies import POLICIES

        if v is not None and v not in POLICIES:
            raise ValueError(f"unknown policy {v!r}; one of {', '.join(POLICIES)}")
        return v

    schedule_period_s: float = Field(
        10.0,
        ge=0,
        description="Re-order and push classes this often (and when a job reports a new "
        "stage); 0: only on a stage change or POST /api/v1/schedule/apply.",
    )


def _state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "agg-optimizer"


def resolve_token(settings: Settings) -> str | None:
    """The API token: `api_token`, else the one in `api_token_file` (generated there on
    first use). None when neither is set."""
    if settings.api_token is not None:
        return settings.api_token.get_secret_value()
    path = settings.api_token_file
    if path is None:
        return None
    if path.exists():
        token = path.read_text().strip()
        if not token:
            raise ValueError(f"api_token_file: {path} is empty")
        return token
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token
