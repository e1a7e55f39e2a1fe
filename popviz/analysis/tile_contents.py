"""What one tile holds, from the tile liveness (steps x tiles of not-always-live bytes):
its own peak and the step of it, the tile map's per-tile not-always-live peak where the
stored one is one flat value per IPU, and the variables live at the tile's peak."""

from __future__ import annotations

import numpy as np
import pandas as pd

from popviz.analysis.memory import NOT_ALWAYS_LIVE, memory_categories


def tile_peaks(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per tile of a steps x tiles matrix: its largest not-always-live bytes and the
    first row (step) where it is reached. Empty arrays for an empty matrix."""
    if matrix.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return matrix.max(axis=0).astype(np.int64), matrix.argmax(axis=0).astype(np.int64)


def flat_per_ipu(tile_memory: pd.DataFrame, ipu: int) -> bool:
    """True when an IPU's stored not-always-live peak is one value on every tile (a file
    that kept only the IPU's peak): a tile map of it is one flat colour."""
    if NOT_ALWAYS_LIVE not in tile_memory.columns:
        return False
    col = tile_memory.loc[tile_memory["ipu"] == ipu, NOT_ALWAYS_LIVE]
    return len(col) > 1 and col.nunique() == 1


def with_tile_peaks(tile_memory: pd.DataFrame, ipu: int, peaks: np.ndarray) -> pd.DataFrame:
    """`tile_memory` with one IPU's not-always-live peak taken per tile from the tile
    liveness (`tile_peaks`) where the stored one is flat, and its total redone; other rows
    and a profile whose peaks already vary are returned as they are."""
    if not flat_per_ipu(tile_memory, ipu) or peaks.size == 0:
        return tile_memory
    out = tile_memory.copy()
    rows = out["ipu"] == ipu
    tiles = out.loc[rows, "tile"].to_numpy(np.int64)
    inside = tiles < peaks.size
    new = out.loc[rows, NOT_ALWAYS_LIVE].to_numpy(np.int64).copy()
    new[inside] = peaks[tiles[inside]]
    out.loc[rows, NOT_ALWAYS_LIVE] = new
    cats = memory_categories(out)
    out.loc[rows, "total_bytes"] = out.loc[rows, cats].sum(axis=1).astype(np.int64)
    return out


def row_to_step(row: int, rows: int, liveness: pd.DataFrame, ipu: int) -> int:
    """The program step of a tile-liveness row: one row per step, or, for a program
    binned into fewer rows, the first step of the row's bin."""
    steps = liveness.loc[liveness["ipu"] == ipu, "step"] if len(liveness) else pd.Series()
    n = int(steps.max()) + 1 if len(steps) else rows
    width = max(1, -(-n // max(rows, 1)))
    return int(row) * width


def live_on_tile(variables: pd.DataFrame, oom: pd.DataFrame, ipu: int, tile: int,
                 step: int, limit: int = 12) -> pd.DataFrame:
    """What the tile holds: the compiler's list of its largest variables where it kept one
    (the out-of-memory table), else the not-always-live variables of its IPU live at the
    tile's peak step, largest first (a profile stores no per-tile placement of every
    variable: these are the candidates, each spread over its op's tiles). Columns:
    name, category, bytes, source."""
    cols = ["name", "category", "bytes", "source"]
    if len(oom) and "variables" in oom.columns:
        hit = oom[(oom["ipu"] == ipu) & (oom["tile"] == tile)]
        if len(hit):
            names = [v.strip() for v in str(hit.iloc[0]["variables"]).split(",") if v.strip()]
            return pd.DataFrame({"name": names, "category": "", "bytes": np.nan,
                                 "source": "the compiler's list for this tile"})[cols]
    if variables.empty:
        return pd.DataFrame(columns=cols)
    live = variables[(variables["ipu"] == ipu) & (variables["first_step"] <= step)
                     & (variables["last_step"] >= step)]
    live = live.sort_values("bytes", ascending=False, kind="stable").head(limit)
    return pd.DataFrame({"name": live["name"].astype(str).to_numpy(),
                         "category": live["category"].astype(str).to_numpy(),
                         "bytes": live["bytes"].to_numpy(),
                         "source": f"live on the IPU at step {step}"})[cols]
