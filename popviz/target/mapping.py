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
    """Sum of rectangles [s0, s1] x [t0, t1) of `per_tile` bytes each: (steps, tiles) float64.

    A 2-D difference array and two cumulative sums, so cost does not grow with the
    rectangles' area."""
    diff = np.zeros((steps + 1, tiles + 1), dtype=np.float64)
    if len(s0):
        s1p = np.asarray(s1) + 1
        flat = diff.reshape(-1)
        width = tiles + 1
        w = np.asarray(per_tile, dtype=np.float64)
        np.add.at(flat, s0 * width + t0, w)
        np.add.at(flat, s0 * width + t1, -w)
        np.add.at(flat, s1p * width + t0, -w)
        np.add.at(flat, s1p * width + t1, w)
    np.cumsum(diff, axis=0, out=diff)
    np.cumsum(diff, axis=1, out=diff)
    return diff[:steps, :tiles]


def per_tile_sum(tiles: int, t0: np.ndarray, t1: np.ndarray, per_tile: np.ndarray) -> np.ndarray:
    """Sum of ranges [t0, t1) of `per_tile` bytes each: (tiles,) float64."""
    diff = np.zeros(tiles + 1, dtype=np.float64)
    if len(t0):
        w = np.asarray(per_tile, dtype=np.float64)
        np.add.at(diff, np.asarray(t0), w)
        np.add.at(diff, np.asarray(t1), -w)
    return np.cumsum(diff)[:tiles]
