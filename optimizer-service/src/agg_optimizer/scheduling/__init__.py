"""The order in which jobs' communication goes (FIFO, fair, Varys, Sincronia, Baraat, JPAS,
Grouper), as traffic classes for the switches' priority queues (`policies`)."""

from agg_optimizer.scheduling.policies import (
    POLICIES,
    Demand,
    Schedule,
    bssi,
    demands_from,
    link_bytes,
    schedule,
    to_classes,
)

__all__ = [
    "POLICIES",
    "Demand",
    "Schedule",
    "bssi",
    "demands_from",
    "link_bytes",
    "schedule",
    "to_classes",
]
