"""Level of detail on the server, in numpy: keep every peak, draw at most ~pixels points.

- `minmax_indices`: per pixel bucket keep the min and the max sample (a plain LTTB or
  stride would drop narrow peaks, which are exactly the liveness bumps users look for).
- `maxpool2d`: the 2-D version for step x tile heat maps (max per cell).
- `TraceIndex`: per-IPU, per-category prefix sums of event durations, so the time a
  category covers in any bucket costs two binary searches: a zoomed view of a
  million-event trace costs O(pixels x log n), not O(n).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from popviz import vocab
from popviz.vocab import SHORT

# trace categories (popviz.vocab, in its priority order), named by pass (F/B/R/WU) for
# compute: the legend's and colours' keys
CATEGORIES = tuple(SHORT.get(c, c) for c in vocab.CATEGORIES)
IDLE = CATEGORIES.index("idle")


def minmax_indices(values: np.ndarray, buckets: int) -> np.ndarray:
    """Sorted indices of the min and max of each of `buckets` equal slices of `values`
    (all indices when there are few enough)."""
    n = len(values)
    if n <= 2 * buckets or buckets <= 0:
        return np.arange(n)
    k = -(-n // buckets)
    rows = -(-n // k)
    padded = np.empty(rows * k, dtype=float)
    padded[:n] = values
    padded[n:] = values[-1]
    grid = padded.reshape(rows, k)
    base = np.arange(rows) * k
    idx = np.concatenate([base + grid.argmin(axis=1), base + grid.argmax(axis=1), [0, n - 1]])
    return np.unique(np.clip(idx, 0, n - 1))


def maxpool2d(array: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, int, int]:
    """Max over blocks so the result has at most rows x cols cells.
    Returns (pooled, row_block, col_block)."""
    r, c = array.shape
    if r == 0 or c == 0:
        return array, 1, 1
    kr, kc = max(1, -(-r // rows)), max(1, -(-c // cols))
    pr, pc = -(-r // kr) * kr, -(-c // kc) * kc
    if (pr, pc) != (r, c):
        padded = np.zeros((pr, pc), dtype=array.dtype)
        padded[:r, :c] = array
        array = padded
    pooled = array.reshape(pr // kr, kr, pc // kc, kc).max(axis=(1, 3))
    return pooled, kr, kc


def category_codes(trace: pd.DataFrame) -> np.ndarray:
    """Category index of each event: compute events by pass (F/B/R/WU), others by kind;
    a kind outside the contract counts as compute, as in every other view (vocab)."""
    passes = trace["pass"].astype(str).to_numpy() if "pass" in trace else None
    return vocab.category_codes(trace["kind"].astype(str).to_numpy(),
                                passes).astype(np.int8)


@dataclass
class _Lane:
    start: np.ndarray  # all events of one IPU, sorted by start
    end: np.ndarray
    end_max: np.ndarray  # running max of end: searchable even if events overlap
    rows: np.ndarray  # row numbers into the source frame
    cat_start: list[np.ndarray]  # per category: sorted starts, durations, prefix sums
    cat_dur: list[np.ndarray]
    cat_cum: list[np.ndarray]


class TraceIndex:
    """Everything needed to draw any time range of a trace quickly (build once, reuse)."""

    def __init__(self, trace: pd.DataFrame) -> None:
        self.frame = trace.reset_index(drop=True)
        self.ipus: list[int] = sorted(int(i) for i in self.frame["ipu"].unique())
        start = self.frame["start"].to_numpy(dtype=np.float64)
        end = self.frame["end"].to_numpy(dtype=np.float64)
        codes = category_codes(self.frame)
        ipu = self.frame["ipu"].to_numpy()
        self.lanes: dict[int, _Lane] = {}
        for i in self.ipus:
            rows = np.flatnonzero(ipu == i)
            rows = rows[np.argsort(start[rows], kind="stable")]
            s, e, c = start[rows], end[rows], codes[rows]
            cs, cd, cc = [], [], []
            for k in range(len(CATEGORIES)):
                m = c == k
                dur = e[m] - s[m]
                cs.append(s[m])
                cd.append(dur)
                cc.append(np.cumsum(dur))
            self.lanes[i] = _Lane(s, e, np.maximum.accumulate(e) if len(e) else e, rows,
                                  cs, cd, cc)
        self.start = float(start.min()) if len(start) else 0.0
        self.end = float(end.max()) if len(end) else 1.0

    def __len__(self) -> int:
        return len(self.frame)

    def visible_rows(self, ipu: int, lo: float, hi: float) -> np.ndarray:
        """Row numbers of `ipu`'s events overlapping [lo, hi)."""
        lane = self.lanes[ipu]
        a = int(np.searchsorted(lane.end_max, lo, side="right"))
        b = int(np.searchsorted(lane.start, hi, side="left"))
        rows = lane.rows[a:max(a, b)]
        return rows[self.frame["end"].to_numpy()[rows] > lo] if len(rows) else rows

    def count_visible(self, lo: float, hi: float) -> int:
        total = 0
        for lane in self.lanes.values():
            a = int(np.searchsorted(lane.end_max, lo, side="right"))
            b = int(np.searchsorted(lane.start, hi, side="left"))
            total += max(0, b - a)
        return total

    def occupancy(self, ipu: int, edges: np.ndarray) -> np.ndarray:
        """Cycles each category covers in each bucket: shape (categories, buckets)."""
        lane = self.lanes[ipu]
        out = np.zeros((len(CATEGORIES), len(edges) - 1))
        for k in range(len(CATEGORIES)):
            s, d, cum = lane.cat_start[k], lane.cat_dur[k], lane.cat_cum[k]
            if not len(s):
                continue
            j = np.searchsorted(s, edges, side="left")  # events starting before each edge
            last = np.maximum(j - 1, 0)
            covered = np.where(j > 0, cum[last] - d[last] + np.clip(edges - s[last], 0, d[last]),
                               0.0)
            out[k] = np.diff(covered)
        return out

    def count_between(self, ipu: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Events of `ipu` overlapping each [lo[i], hi[i])."""
        lane = self.lanes[ipu]
        b = np.searchsorted(lane.start, hi, side="left")
        a = np.searchsorted(lane.end_max, lo, side="right")
        return np.maximum(b - a, 0)


def share_of_row(occ: np.ndarray, edges: np.ndarray, min_share: float = 0.04) -> np.ndarray:
    """Fraction of a row's height each category gets in each bucket: its share of the
    bucket's time, but at least `min_share` if it ran there at all (so a short exchange or
    sync stays visible next to long compute), normalised to sum to 1 in busy buckets and
    0 in buckets where nothing was recorded. Shape (categories, buckets)."""
    width = np.diff(edges)
    present = occ > 0
    raw = occ / np.where(width > 0, width, 1.0)
    drawn = np.where(present, np.maximum(raw, min_share), 0.0)
    total = drawn.sum(axis=0)
    return np.divide(drawn, total, out=np.zeros_like(drawn), where=total > 0)


def _pool_rows(raw: np.ndarray, k: int) -> np.ndarray:
    """Max over each run of k rows (the last run may be shorter)."""
    if k == 1 or raw.shape[0] == 0:
        return raw
    rows = -(-raw.shape[0] // k)
    padded = np.zeros((rows * k, raw.shape[1]), dtype=raw.dtype)
    padded[:raw.shape[0]] = raw
    return padded.reshape(rows, k, raw.shape[1]).max(axis=1)


class StepPyramid:
    """A max-pooled copy of one IPU's (steps x tiles) liveness, built once by reading
    blocks, so an overview never reads the whole array again; narrow views read their raw
    slice (at most `raw_rows` steps)."""

    def __init__(self, read: Callable[[int, int], np.ndarray], steps: int,
                 rows: int = 2048, raw_rows: int = 2000) -> None:
        self.read, self.steps, self.raw_rows = read, steps, raw_rows
        self.k = max(1, -(-steps // rows))
        block = self.k * max(1, 65536 // self.k)  # whole coarse rows per read
        parts = []
        for s0 in range(0, steps, block):
            raw = read(s0, min(steps, s0 + block))
            parts.append(_pool_rows(raw, self.k))
        self.coarse = np.concatenate(parts) if parts else np.zeros((0, 0), np.uint32)

    def view(self, start: float, stop: float) -> tuple[np.ndarray, int, int]:
        """(rows covering [start, stop), first step, steps per row)."""
        start, stop = max(0, int(start)), min(self.steps, int(stop))
        if stop <= start:
            start, stop = 0, self.steps
        if self.k == 1 or stop - start <= self.raw_rows:
            return self.read(start, stop), start, 1
        a, b = start // self.k, -(-stop // self.k)
        return self.coarse[a:b], a * self.k, self.k
