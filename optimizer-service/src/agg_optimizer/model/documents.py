"""The two documents the project exchanges: the instance (input) and the placement (output).

Both are pydantic models so the CLI, the REST API and the ONOS app share one schema
(`agg-optimizer schema instance|placement`). Units are in field names: `_gbps`, `_us`,
`_bytes`, `_s`. Structural checks that need the whole document (unknown nodes, reachability)
live in `validation.py`, so that every error names the field it is about.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

# Documented defaults for links and switches with no telemetry (docs/documents.md).
DEFAULT_LINK_LATENCY_US = 2.0
DEFAULT_HOP_LATENCY_US = 1.0
DEFAULT_SLOTS = 1024
DEFAULT_POOL_SLOTS = 128


# Upper bounds: what the solver, int64 arithmetic and the switches' registers take. A value
# past them is refused naming its field (1e400 or 1e30 slots used to overflow in the engine).
MAX_SLOTS = 1 << 20
MAX_BYTES = 10**15
MAX_GBPS = 1e6
MAX_US = 1e9
MAX_WEIGHT = 1e6
# Lower bounds: below them a link's or a job's numbers span more than the LP's float64 can
# hold apart (1e-300 Gb/s put infinite costs in the LP); a smaller value is refused.
MIN_GBPS = 1e-9  # one bit a second
MIN_WEIGHT = 1e-6
MAX_COUNT = 10**6


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Input(_Doc):
    # NaN and Infinity are no input numbers (they turned into NaN weights in the LP).
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Node(_Input):
    id: str = Field(min_length=1, description="Unique node id (ONOS device id or host id).")
    kind: Literal["host", "switch"]
    programmable: bool = Field(
        True, description="Switch can aggregate (runs our P4 pipeline). Ignored for hosts."
    )
    slots: int = Field(
        DEFAULT_SLOTS,
        ge=0,
        le=MAX_SLOTS,
        description="Aggregator register slots on this switch; a job's pool takes "
        "`pool_slots` of them. Ignored for hosts.",
    )
    tier: str | None = Field(None, description="Informational: core, agg, edge, spine, leaf.")


class Link(_Input):
    """A full-duplex link; capacity is per direction."""

    src: str
    dst: str
    capacity_gbps: float = Field(10.0, ge=MIN_GBPS, le=MAX_GBPS)
    src_port: int | None = None
    dst_port: int | None = None


class Topology(_Input):
    nodes: list[Node]
    links: list[Link]


class LinkTelemetry(_Input):
    """State of one direction of a link, as INT reports it at the egress port of `src`."""

    src: str
    dst: str
    utilization: float = Field(0.0, ge=0.0, le=1.0, description="Fraction of capacity in use.")
    queue_bytes: float = Field(0.0, ge=0, le=MAX_BYTES)
    latency_us: float = Field(DEFAULT_LINK_LATENCY_US, ge=0, le=MAX_US)
    flows: Annotated[float, Field(ge=0, le=MAX_COUNT)] | None = Field(
        None,
        description="Competing flows seen on this link (INT per-flow reports). Busy links of "
        "elastic flows still give a newcomer a fair share: with it, the residual rate is at "
        "least capacity / (flows + 1).",
    )


class SwitchTelemetry(_Input):
    switch: str
    hop_latency_us: float = Field(DEFAULT_HOP_LATENCY_US, ge=0, le=MAX_US)


class Telemetry(_Input):
    """Smoothed INT snapshot. Directed links or switches absent here get the defaults."""

    links: list[LinkTelemetry] = []
    switches: list[SwitchTelemetry] = []


class Job(_Input):
    id: str = Field(min_length=1)
    workers: list[str] = Field(min_length=1, description="Worker host ids.")
    ps: str = Field(description="Parameter-server host id.")
    update_bytes: PositiveInt = Field(
        le=MAX_BYTES, description="Bytes each worker sends per iteration."
    )
    weight: float = Field(1.0, ge=MIN_WEIGHT, le=MAX_WEIGHT)
    max_aggregators: Annotated[PositiveInt, Field(le=MAX_COUNT)] | None = Field(
        None, description="Cap K_j on aggregation switches for this job; none means no cap."
    )
    pool_slots: PositiveInt = Field(
        DEFAULT_POOL_SLOTS,
        le=MAX_SLOTS,
        description="Slots of the pool this job takes on each aggregation switch. Equal for "
        "all jobs keeps the LP exact; unequal sizes make a knapsack and go to the MILP path.",
    )


class SlotPool(_Input):
    base: int = Field(ge=0, le=MAX_SLOTS)
    size: int = Field(ge=1, le=MAX_SLOTS)


class Instance(_Input):
    topology: Topology
    telemetry: Telemetry = Telemetry()
    jobs: list[Job]
    current: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Current aggregation switches per job id, for hysteresis.",
    )
    switching_penalty_s: float = Field(
        0.0,
        ge=0,
        le=MAX_US,
        description="Cost added to a placement for each aggregator not in `current`.",
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
        "unsummed streams (`trees.evaluate`). A lower bound of the shared figure.",
    )
    surrogate_s: float = Field(description="The objective term: sum of per-link stream times.")
    floor_cct_s: float | None = Field(
        None,
        description="The network bound: the job's slowest worker uplink or its PS's downlink "
        "carrying one stream, as if the fabric between were infinite and summed for free "
        "(`trees.floor_cct`). No placement's predicted CCT for the job is lower.",
    )


class SolverStats(_Doc):
    path: Literal["lp", "milp", "heuristic", "search"] = "heuristic"
    reason: str | None = None
    status: str = "ok"
    build_s: float = 0.0
    solve_s: float = 0.0
    total_s: float = 0.0
    iterations: int = 0
    reroutes: int = Field(0, description="Re-routing rounds AGG kept (engine.REROUTE_ROUNDS)")
    family_choice: str | None = Field(
        None,
        description="Which of AGG's family AGG returned (agg, agg-own, agg-mm, greedy-rr): "
        "the lowest weighted predicted CCT, on instances of up to engine.FAMILY_MAX_JOBS jobs",
    )
    polish_moves: int = Field(
        0,
        description="Moves of AGG's local search on the predicted CCT that AGG kept "
        "(engine.POLISH, on instances of up to engine.FAMILY_MAX_JOBS jobs)",
    )
    objective: float | None = None
    max_integrality_gap: float = 0.0
    columns: int = 0
    rows: int = 0


class Placement(_Doc):
    strategy: str
    jobs: list[JobPlacement]
    objective_s: float = Field(description="Weighted sum of the jobs' surrogate costs.")
    mean_predicted_cct_s: float
    mean_floor_cct_s: float | None = Field(
        None, description="The jobs' mean `floor_cct_s`: what no placement's mean beats."
    )
    cct_model: Literal["shared", "isolated"] = Field(
        "isolated",
        description="What `predicted_cct_s` means: `shared` (every job of the placement "
        "sharing the fabric, up to 64 jobs) or `isolated` (each job alone).",
    )
    stats: SolverStats
