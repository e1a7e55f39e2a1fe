"""The local search of `popviz tune`: from a layout, move one split by one segment at a
time while the plan gets better (first improvement, in the order `_moves` gives: the last
successful move, then those shrinking the out-of-memory or bottleneck stage, then every
other). With an executor the next moves are fitted side by side and the first better one
in that order is taken, so the path is the one a search one at a time follows."""

from __future__ import annotations

import numpy as np

from popviz.advise.tune_layers import Segments
from popviz.advise.tune_search import Candidate, Layout, Search


def _better(new: Candidate, old: Candidate) -> bool:
    return new.key() < old.key() and (not new.fits or not old.fits
                                      or new.throughput > old.throughput * (1 + 1e-9))


def _moves(c: Candidate, last: tuple[int, int] | None) -> list[tuple[int, int]]:
    """(split index, +-1) moves: the last successful move again, then those shrinking
    the out-of-memory or bottleneck stage (stage b starts at split b-1 and ends before
    split b), then every other."""
    k = len(c.splits)
    first = [last] if last else []
    if c.num_ipus > 1:
        focus = c.oom_ipus[0] if c.oom_ipus else int(np.argmax(c.stage_cycles))
        first += [(focus - 1, +1), (focus, -1)]
    every = [(i, d) for i in range(k) for d in (-1, +1)]
    return [m for m in first + every if 0 <= m[0] < k]


def local_search(search: Search, start: Candidate, segs: Segments, source: str,
                  reserve: int) -> Candidate:
    cur = start
    bounds = segs.bounds(cur.splits)
    if bounds is None:
        return cur
    improved, last = True, None
    while improved and search.count < search.max - reserve:
        improved = False
        moved: list[tuple[tuple[int, int], list[int]]] = []
        for i, d in dict.fromkeys(_moves(cur, last)):  # each move once, in order
            b = list(bounds)
            b[i] += d
            lo = b[i - 1] if i else 0
            hi = b[i + 1] if i + 1 < len(b) else segs.count
            if lo < b[i] < hi:
                moved.append(((i, d), b))
        # first improvement, in the moves' order; with an executor the next moves the
        # budget holds at their most are fitted side by side and the first better one is
        # taken, the others forgotten: the path and count of one move at a time
        at = 0
        while at < len(moved) and search.count < search.max - reserve:
            room = search.max - reserve - search.count
            size = max(1, min(search.width, room // max(1, len(search.ladder))))
            chunk, at = moved[at:at + size], at + size
            layouts: list[Layout] = [(segs.splits(b), cur.recomputation, cur.schedule, source,
                                      cur.recompute_granularity) for _, b in chunk]
            found = search.fit_many(layouts, limit=search.max - reserve)
            taken = None
            for k, c in enumerate(found):
                if c is None:  # the budget's end, where one at a time stops too
                    return cur
                if _better(c, cur):
                    taken = (k, c)
                    break
            if taken is not None:
                search.forget(layouts[taken[0] + 1:])
                (last, bounds), cur = chunk[taken[0]], taken[1]
                improved = True
                break
    return cur
