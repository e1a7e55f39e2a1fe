"""One clock for every rank: where t = 0 is and how far each rank's clock is off.

torch.profiler stamps a rank's events in ns since its `baseTimeNanoseconds` (the host's
wall clock). Ranks on one host, or hosts whose clocks agree, line up as they are; across
hosts a live run measures how far each rank's clock reads ahead of rank 0's
(`clock_offsets`, from readings taken right after shared barriers) and `align` takes the
offsets off. An import has no such readings: its offsets are 0. t = 0 is the earliest
event over all ranks. Both `popviz import` and `popviz.measure` use this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class Shiftable(Protocol):
    """What `align` needs of a rank (ingest.import_rank.RankPart has it)."""

    rank: int
    base_ns: int
    first_ns: int | None

    def shift(self, origin: int) -> None: ...


def clock_offsets(readings: Sequence[Sequence[int]], hosts: Sequence[str]
                  ) -> tuple[dict[int, int], dict[str, Any]]:
    """Each rank's clock minus rank 0's, in ns, from `readings[rank][k]`: the clock read by
    every rank right after the k-th of the same barriers. The median over the rounds
    (a barrier releases ranks within its own skew, reported as spread_ns); 0 for every
    rank when all share one host (one clock)."""
    if not readings or any(len(r) != len(readings[0]) or not r for r in readings):
        raise ValueError("clock readings must hold the same number (>= 1) of rounds per rank")
    ref = readings[0]
    one_host = len(set(hosts)) <= 1
    offsets: dict[int, int] = {}
    spread = 0
    for rank, mine in enumerate(readings):
        diffs = sorted(a - b for a, b in zip(mine, ref))
        spread = max(spread, diffs[-1] - diffs[0])
        offsets[rank] = 0 if one_host else int(diffs[len(diffs) // 2])
    return offsets, {"offsets_ns": {str(r): o for r, o in offsets.items()},
                     "spread_ns": int(spread), "rounds": len(ref), "one_host": one_host}


def align(parts: Sequence[Shiftable], offsets: Mapping[int, int] | None = None) -> int:
    """Move every rank's times onto one clock (ns, 0 = the first event of any rank) after
    taking each rank's clock offset off its base; returns the origin in ns on rank 0's
    clock."""
    for t in parts:
        t.base_ns = int(t.base_ns - (offsets or {}).get(t.rank, 0))
    firsts = [t.base_ns + t.first_ns for t in parts if t.first_ns is not None]
    origin = min(firsts) if firsts else 0
    for t in parts:
        t.shift(origin)
    return origin
