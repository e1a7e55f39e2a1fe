"""Tile mapping: where tensors and ops sit on an IPU's tiles (deterministic, vectorised).

A tensor of b bytes is spread evenly over n = clamp(ceil(b / grain), 1, tiles) contiguous
tiles starting at a start tile; small tensors are scattered by a fixed stride so that they
do not all pile up on tile 0 (Poplar's mapper spreads them in a similar way).
"""

from __future__ import annotations

import numpy as np

GRAIN_BYTES = 128
START_STRIDE = 997  # prime: consecutive small tensors land on far-apart tiles


def tiles_for(nbytes: np.ndarray, tiles_per_ipu: int, grain: int = GRAIN_BYTES) -> np.ndarray:
    n = np.ceil(np.asarray(nbytes, dtype=np.float64) / grain)
    return np.clip(n, 1, tiles_per_ipu).astype(np.int64)


def start_tiles(ntiles: np.ndarray, keys: np.ndarray, tiles_per_ipu: int) -> np.ndarray:
    """Start tile for each range so that start + n <= tiles; `keys` (e.g. ids) decide it."""
    ntiles = np.asarray(ntiles, dtype=np.int64)
    room = tiles_per_ipu - ntiles + 1
    return (np.asarray(keys, dtype=np.int64) * START_STRIDE) % np.maximum(room, 1)


def rectangles(steps: int, tiles: int, s0: np.ndarray, s1: np.ndarray, t0: np.ndarray,
               t1: np.ndarray, per_tile: np.ndarray) -> np.ndarray:
    """Sum of rectangles [s0, s1] x [t0, t1) of `per_tile` bytes each: (steps, tiles) float64."""
    grid, starts = rectangle_runs(steps, tiles, s0, s1, t0, t1, per_tile)
    return expand_runs(grid, starts, steps)


def rectangle_runs(steps: int, tiles: int, s0: np.ndarray, s1: np.ndarray, t0: np.ndarray,
                   t1: np.ndarray, per_tile: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`rectangles` as runs of equal steps: (K, tiles) float64 rows and the first step of
    each (starts[0] == 0); step s is row k for starts[k] <= s < starts[k + 1].

    A 2-D difference array and two cumulative sums, so cost does not grow with the
    rectangles' area; only the steps where a rectangle starts or ends get a row (the
    others repeat the row before, exactly: x + 0.0 == x), and the sums run in the same
    order as over every step, so the values are the same bit for bit."""
    s0 = np.asarray(s0, dtype=np.int64)
    s1p = np.asarray(s1, dtype=np.int64) + 1
    starts = np.unique(np.concatenate([[0], s0, s1p]))
    starts = starts[(starts >= 0) & (starts < max(steps, 1))]
    k0 = np.searchsorted(starts, s0)
    k1 = np.searchsorted(starts, s1p)  # len(starts) when the rectangle runs to the end
    diff = np.zeros((len(starts) + 1, tiles + 1), dtype=np.float64)
    if len(s0):
        flat = diff.reshape(-1)
        width = tiles + 1
        w = np.asarray(per_tile, dtype=np.float64)
        np.add.at(flat, k0 * width + t0, w)
        np.add.at(flat, k0 * width + t1, -w)
        np.add.at(flat, k1 * width + t0, -w)
        np.add.at(flat, k1 * width + t1, w)
    # down the steps one row at a time: contiguous, several times numpy's cumsum(axis=0)
    # and the same sequential sum
    for k in range(1, len(starts)):
        np.add(diff[k - 1], diff[k], out=diff[k])
    np.cumsum(diff, axis=1, out=diff)
    return diff[:len(starts), :tiles], starts


def expand_runs(rows: np.ndarray, starts: np.ndarray, steps: int) -> np.ndarray:
    """The (steps, ...) array of runs from `rectangle_runs` (rows repeated)."""
    counts = np.diff(np.append(starts, steps))
    return np.repeat(rows, counts, axis=0)


def per_tile_sum(tiles: int, t0: np.ndarray, t1: np.ndarray, per_tile: np.ndarray) -> np.ndarray:
    """Sum of ranges [t0, t1) of `per_tile` bytes each: (tiles,) float64."""
    diff = np.zeros(tiles + 1, dtype=np.float64)
    if len(t0):
        w = np.asarray(per_tile, dtype=np.float64)
        np.add.at(diff, np.asarray(t0), w)
        np.add.at(diff, np.asarray(t1), -w)
    return np.cumsum(diff)[:tiles]
