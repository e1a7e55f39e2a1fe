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


def rectangle_runs(steps: int, tiles: int, s0: np.ndarray, s1: np.ndarray, t0: np.ndarray,
                   t1: np.ndarray, per_tile: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sum of rectangles [s0, s1] x [t0, t1) of `per_tile` bytes each, as runs: a (K, L)
    float64 grid, the first step of each of its rows and
    the first tile of each of its columns (both start at 0); step s, tile t is the value
    of the row and column whose runs hold them.

    A 2-D difference array and two cumulative sums, so cost does not grow with the
    rectangles' area. Only the steps and tiles where a rectangle starts or ends get a row
    or column (the others repeat the one before, exactly: x + 0.0 == x), and the sums run
    in the same order as over every step and tile, so the values are the same bit for bit
    (the tile liveness of a GPT-2 step is ~2,000 distinct steps x ~700 distinct tiles
    instead of 3,630 x 1,472)."""
    s0 = np.asarray(s0, dtype=np.int64)
    s1p = np.asarray(s1, dtype=np.int64) + 1
    t0 = np.asarray(t0, dtype=np.int64)
    t1 = np.asarray(t1, dtype=np.int64)
    row_starts = _starts(s0, s1p, steps)
    col_starts = _starts(t0, t1, tiles)
    # an end at `steps` / `tiles` lands in the extra last row / column, which is dropped
    k0, k1 = np.searchsorted(row_starts, s0), np.searchsorted(row_starts, s1p)
    c0, c1 = np.searchsorted(col_starts, t0), np.searchsorted(col_starts, t1)
    width = len(col_starts) + 1
    diff = np.zeros((len(row_starts) + 1, width), dtype=np.float64)
    if len(s0):
        flat = diff.reshape(-1)
        w = np.asarray(per_tile, dtype=np.float64)
        np.add.at(flat, k0 * width + c0, w)
        np.add.at(flat, k0 * width + c1, -w)
        np.add.at(flat, k1 * width + c0, -w)
        np.add.at(flat, k1 * width + c1, w)
    # down the steps one row at a time: contiguous, several times faster than numpy's
    # cumsum(axis=0) and the same sequential sum
    for k in range(1, len(row_starts)):
        np.add(diff[k - 1], diff[k], out=diff[k])
    np.cumsum(diff, axis=1, out=diff)
    return diff[:len(row_starts), :len(col_starts)], row_starts, col_starts


def _starts(lo: np.ndarray, hi: np.ndarray, n: int) -> np.ndarray:
    """Sorted distinct edges in [0, n), 0 always among them."""
    edges = np.unique(np.concatenate([np.zeros(1, dtype=np.int64), lo, hi]))
    return edges[(edges >= 0) & (edges < max(n, 1))]


def run_index(starts: np.ndarray, n: int) -> np.ndarray:
    """For each of n positions, the run (index into `starts`) that holds it."""
    return np.repeat(np.arange(len(starts)), np.diff(np.append(starts, n)))


def grain_split(t0: np.ndarray, t1: np.ndarray, nbytes: np.ndarray, grain: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """How each tensor's whole grains sit on its tile range [t0, t1): a tensor of g grains
    over n tiles gives g // n grains to each and one more to its first g % n tiles (so 1.5
    grains a tile is 2 on half the tiles and 1 on the rest, as Poplar's linear mapping
    does). Returns (mid, bytes on each tile of [t0, mid), bytes on each of [mid, t1))
    and the bytes of one grain."""
    t0 = np.asarray(t0, dtype=np.int64)
    t1 = np.asarray(t1, dtype=np.int64)
    nbytes = np.asarray(nbytes, dtype=np.float64)
    n = np.maximum(t1 - t0, 1)
    g = np.maximum(np.ceil(nbytes / grain), 1)
    per_grain = nbytes / g
    base = np.floor(g / n)
    extra = (g - base * n).astype(np.int64)
    return t0 + np.minimum(extra, n), (base + 1) * per_grain, base * per_grain, per_grain


def bytes_on_tile(t0: np.ndarray, t1: np.ndarray, nbytes: np.ndarray, grain: int | np.ndarray,
                  tile: int) -> np.ndarray:
    """Bytes each tensor holds on `tile` (0 where its range does not reach it), the same
    split the tile liveness sums (`grain_split`)."""
    t0 = np.asarray(t0, dtype=np.int64)
    t1 = np.asarray(t1, dtype=np.int64)
    grains = np.broadcast_to(np.asarray(grain, dtype=np.int64), t0.shape)
    out = np.zeros(len(t0))
    for g in np.unique(grains):  # one grain size in a profile; a loop keeps it general
        m = grains == g
        mid, high, low, _ = grain_split(t0[m], t1[m], np.asarray(nbytes)[m], int(g))
        out[m] = np.where((t0[m] <= tile) & (tile < mid), high,
                          np.where((mid <= tile) & (tile < t1[m]), low, 0.0))
    return out


def per_tile_sum(tiles: int, t0: np.ndarray, t1: np.ndarray, per_tile: np.ndarray) -> np.ndarray:
    """Sum of ranges [t0, t1) of `per_tile` bytes each: (tiles,) float64."""
    diff = np.zeros(tiles + 1, dtype=np.float64)
    if len(t0):
        w = np.asarray(per_tile, dtype=np.float64)
        np.add.at(diff, np.asarray(t0), w)
        np.add.at(diff, np.asarray(t1), -w)
    return np.cumsum(diff)[:tiles]
