"""The two documents the project exchanges: the instance (input) and the placement (output).

Both are pydantic models so the CLI, the REST API and the ONOS app share one schema
(`agg-optimizer schema instance|placement`). Units are in field names: `_gbps`, `_us`,
`_bytes`, `_s`. Structural checks that need the whole document (unknown nodes, reachability)
live in `validation.py`, so that every error names the field it is about.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveInt

# Documented defaults for links and switches with no telemetry (docs/documents.md).
DEFAULT_LINK_LATENCY_US = 2.0
DEFAULT_HOP_LATENCY_US = 1.0
DEFAULT_SLOTS = 1024
DEFAULT_POOL_SLOTS = 128


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Node(_Doc):
    id: str = Field(min_length=1, description="Unique node id (ONOS device id or host id).")
    kind: Literal["host", "switch"]
    programmable: bool = Field(
        True, description="Switch can aggregate (runs our P4 pipeline). Ignored for hosts."
    )
    slots: int = Field(
        DEFAULT_SLOTS,
        ge=0,
        description="Aggregator register slots on this switch; a job's pool takes "
        "`pool_slots` of them. Ignored for hosts.",
    )
    tier: str | None = Field(None, description="Informational: core, agg, edge, spine, leaf.")


class Link(_Doc):
    """A full-duplex link; capacity is per direction."""

    src: str
    dst: str
    capacity_gbps: float = Field(10.0, gt=0)
    src_port: int | None = None
    dst_port: int | None = None


class Topology(_Doc):
    nodes: list[Node]
    links: list[Link]


class LinkTelemetry(_Doc):
    """State of one direction of a link, as INT reports it at the egress port of `src`."""

    src: str
    dst: str
    utilization: float = Field(0.0, ge=0.0, le=1.0, description="Fraction of capacity in use.")
    queue_bytes: NonNegativeFloat = 0.0
    latency_us: NonNegativeFloat = DEFAULT_LINK_LATENCY_US
    flows: NonNegativeFloat | None = Field(
        None,
        description="Competing flows seen on this link (INT per-flow reports). Busy links of "
        "elastic flows still give a newcomer a fair share: with it, the residual rate is at "
        "least capacity / (flows + 1).",
    )


class SwitchTelemetry(_Doc):
    switch: str
    hop_latency_us: NonNegativeFloat = DEFAULT_HOP_LATENCY_US


class Telemetry(_Doc):
    """Smoothed INT snapshot. Directed links or switches absent here get the defaults."""

    links: list[LinkTelemetry] = []
    switches: list[SwitchTelemetry] = []


class Job(_Doc):
    id: str = Field(min_length=1)
    workers: list[str] = Field(min_length=1, description="Worker host ids.")
    ps: str = Field(description="Parameter-server host id.")
    update_bytes: PositiveInt = Field(description="Bytes each worker sends per iteration.")
    weight: float = Field(1.0, gt=0)
    max_aggregators: PositiveInt | None = Field(
        None, description="Cap K_j on aggregation switches for this job; none means no cap."
    )
    pool_slots: PositiveInt = Field(
        DEFAULT_POOL_SLOTS,
        description="Slots of the pool this job takes on each aggregation switch. Equal for "
        "all jobs keeps the LP exact; unequal sizes make a knapsack and go to the MILP path.",
    )


class SlotPool(_Doc):
    base: int = Field(ge=0)
    size: int = Field(ge=1)


class Instance(_Doc):
    topology: Topology
    telemetry: Telemetry = Telemetry()
    jobs: list[Job]
    current: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Current aggregation switches per job id, for hysteresis.",
    )
    switching_penalty_s: NonNegativeFloat = Field(
        0.0, description="Cost added to a placement for each aggregator not in `current`."
    )
    reserved: dict[str, list[SlotPool]] = Field(
        default_factory=dict,
        description="Slot pools held on each switch by jobs outside this instance (placed "
        "by another strategy, or applied and not re-placed now): placements leave them "
        "alone, so that no two jobs ever sum into the same registers.",
    )


# --- placement -----------------------------------------------------------------------------


class Aggregator(_Doc):
    switch: str
    children: list[str] = Field(description="Workers and child aggregators whose streams it sums.")
    fan_in: int = Field(ge=1)
    next_hop: str = Field(description="Next aggregator switch, or the parameter server host.")
    pool: SlotPool


class JobPlacement(_Doc):
    job_id: str
    aggregators: list[Aggregator]
    worker_paths: dict[str, list[str]] = Field(description="Each worker's path to the PS.")
    ps_fan_in: int = Field(description="Streams the parameter server receives.")
    predicted_cct_s: float = Field(
        description="Predicted CCT of one round with every job of the placement sharing the "
        "fabric (max-min fair shares on the capacity the measured background leaves; "
        "`shared.py`), plus the job's path latency."
    )
    predicted_cct_isolated_s: float | None = Field(
        None,
        description="The same job alone: its slowest link, shared only among its own "
        "unsummed streams (`network.evaluate`). A lower bound of the shared figure.",
    )
    surrogate_s: float = Field(description="The objective term: sum of per-link stream times.")


class SolverStats(_Doc):
    path: Literal["lp", "milp", "heuristic"] = "heuristic"
    reason: str | None = None
    status: str = "ok"
    build_s: float = 0.0
    solve_s: float = 0.0
    total_s: float = 0.0
    iterations: int = 0
    reroutes: int = Field(0, description="Re-routing rounds AGG kept (engine.REROUTE_ROUNDS)")
    objective: float | None = None
    max_integrality_gap: float = 0.0
    columns: int = 0
    rows: int = 0


class Placement(_Doc):
    strategy: str
    jobs: list[JobPlacement]
    objective_s: float = Field(description="Weighted sum of the jobs' surrogate costs.")
    mean_predicted_cct_s: float
    cct_model: Literal["shared", "isolated"] = Field(
        "isolated",
        description="What `predicted_cct_s` means: `shared` (every job of the placement "
        "sharing the fabric, up to 64 jobs) or `isolated` (each job alone).",
    )
    stats: SolverStats
