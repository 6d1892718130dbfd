"""What the endpoints report: a PS's completed step (`IterationResult`) and its serving
totals (`ServeStats`), from the Python loops (`endpoints`) and the C one (`native`) alike."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(slots=True)
class IterationResult:
    iteration: int
    total: npt.NDArray[np.float64]
    seconds: float  # first packet of the iteration to its last chunk complete
    aggregated_packets: int = 0
    raw_packets: int = 0
    duplicates: int = 0


@dataclass(slots=True)
class ServeStats:
    chunks: int = 0  # chunks completed (all runs)
    steps: int = 0  # steps completed (chunks flagged FLAG_END)
    aggregated_packets: int = 0
    raw_packets: int = 0
    duplicates: int = 0
    runs: int = 1
