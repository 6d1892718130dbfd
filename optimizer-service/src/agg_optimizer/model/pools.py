"""Slot pools on a switch: what is free around the pools other jobs hold, and first-fit
allocation in it. One ledger for every job, whatever strategy placed it: two pools that
overlap on a switch would sum two jobs' gradients into the same registers."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from agg_optimizer.model.documents import SlotPool


def free_gaps(slots: int, held: Iterable[SlotPool]) -> list[tuple[int, int]]:
    """The free (base, size) ranges of a switch's `slots` registers outside `held`, in
    ascending order."""
    gaps = []
    at = 0
    for p in sorted(held, key=lambda p: p.base):
        if p.base > at:
            gaps.append((at, min(p.base, slots) - at))
        at = max(at, p.base + p.size)
        if at >= slots:
            break
    if at < slots:
        gaps.append((at, slots - at))
    return [g for g in gaps if g[1] > 0]


def usable(slots: int, held: Iterable[SlotPool], pool: int) -> int:
    """Slots the solvers may count on: the free ranges rounded down to whole pools of
    `pool` slots, so that pools of that size placed by count always fit."""
    return sum(size // pool * pool for _, size in free_gaps(slots, held))


class PoolAllocator:
    """First-fit pools per switch around what others hold."""

    def __init__(self, slots: dict[str, int], held: dict[str, list[SlotPool]]) -> None:
        self.slots = slots
        self.gaps = {s: free_gaps(n, held.get(s, [])) for s, n in slots.items()}

    def take(self, switch: str, size: int) -> SlotPool:
        gaps = self.gaps[switch]
        for i, (base, free) in enumerate(gaps):
            if free >= size:
                gaps[i] = (base + size, free - size)
                return SlotPool(base=base, size=size)
        raise ValueError(
            f"switch {switch!r}: no {size} contiguous free slots left (free ranges: "
            f"{[g for g in gaps if g[1]]}); pools of unequal sizes can fragment a switch"
        )


# A job's claim on a switch's registers: (job, switch, first slot, one past the last).
Claim = tuple[str, str, int, int]


def doc_claims(job_id: str, doc: Mapping[str, Any] | None) -> list[Claim]:
    """The claims of a placement document (`JobPlacement` as JSON): one per aggregator."""
    if not doc:
        return []
    return [
        (job_id, a["switch"], a["pool"]["base"], a["pool"]["base"] + a["pool"]["size"])
        for a in doc.get("aggregators", [])
    ]


def overlaps(claims: Iterable[Claim]) -> list[tuple[Claim, Claim]]:
    """Every pair of claims of two different jobs that share a register on a switch (each
    pair once, in switch and slot order). A job's own claims may overlap (its old and new
    pool while it moves): those are not conflicts."""
    by_switch: dict[str, list[Claim]] = {}
    for c in claims:
        by_switch.setdefault(c[1], []).append(c)
    out = []
    for sw in sorted(by_switch):
        spans = sorted(set(by_switch[sw]), key=lambda c: (c[2], c[3], c[0]))
        for i, a in enumerate(spans):
            for b in spans[i + 1 :]:
                if b[2] >= a[3]:
                    break
                if a[0] != b[0]:
                    out.append((a, b))
    return out


def describe(pair: tuple[Claim, Claim]) -> str:
    """One overlap in words, naming both jobs."""
    (ja, sw, la, ha), (jb, _, lb, hb) = pair
    return f"on {sw!r}: job {ja!r} slots [{la}, {ha}) and job {jb!r} slots [{lb}, {hb}) overlap"
