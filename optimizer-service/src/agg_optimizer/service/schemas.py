"""What the REST API accepts: request bodies, validated by pydantic, each bad field named
in the 422 answer (docs/service.md, "API")."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    StrictBool,
)

from agg_optimizer.model.documents import MAX_WEIGHT, MIN_WEIGHT
from agg_optimizer.peers.selection import POLICIES as PEER_POLICIES
from agg_optimizer.placement.engine import STRATEGIES
from agg_optimizer.scheduling.policies import POLICIES


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
