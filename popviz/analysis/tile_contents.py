"""What one tile holds, from the tile liveness (steps x tiles of not-always-live bytes):
its own peak and the step of it, the tile map's per-tile not-always-live peak where the
stored one is one flat value per IPU, and the variables on the tile at its peak: exactly,
with their bytes on that tile, where the profile records each variable's tiles (format
1.3), else the IPU's candidates."""

from __future__ import annotations

import numpy as np
import pandas as pd

from popviz.analysis.memory import NOT_ALWAYS_LIVE, memory_categories
from popviz.target.mapping import bytes_on_tile

PLACED = ("first_tile", "tiles", "grain_bytes")  # a variable's tile range (format 1.3)


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


def row_width(rows: int, liveness: pd.DataFrame, ipu: int) -> int:
    """Program steps per tile-liveness row: 1, or a binned program's bin width."""
    steps = liveness.loc[liveness["ipu"] == ipu, "step"] if len(liveness) else pd.Series()
    n = int(steps.max()) + 1 if len(steps) else rows
    return max(1, -(-n // max(rows, 1)))


def row_to_step(row: int, rows: int, liveness: pd.DataFrame, ipu: int) -> int:
    """The program step of a tile-liveness row: one row per step, or, for a program
    binned into fewer rows, the first step of the row's bin."""
    return int(row) * row_width(rows, liveness, ipu)


def placed(variables: pd.DataFrame) -> bool:
    """Whether a variables table records where each variable sits (format 1.3)."""
    return not variables.empty and set(PLACED) <= set(variables.columns)


def on_tile(variables: pd.DataFrame, always_live: pd.DataFrame, ipu: int, tile: int,
            step: int, width: int = 1) -> pd.DataFrame:
    """Every variable on the tile at `step` with its bytes there, largest first: the
    not-always-live ones live in the step's tile-liveness row (a binned program's row
    holds every step of its bin, `width` steps), and the always-live ones. Their bytes
    sum to the tile's always-live plus not-always-live bytes at that row (the tile
    liveness sums the same grains). Columns: name, category, bytes (on this tile),
    variable_bytes (the whole variable), tiles (it spreads over), live."""
    cols = ["name", "category", "bytes", "variable_bytes", "tiles", "live"]
    parts = []
    row = step // max(width, 1)
    if placed(variables):
        v = variables[(variables["ipu"] == ipu)
                      & (variables["first_step"] // width <= row)
                      & (variables["last_step"] // width >= row)]
        parts.append(v.assign(live=f"at step {step}"))
    if placed(always_live):
        parts.append(always_live[always_live["ipu"] == ipu].assign(live="always"))
    if not parts:
        return pd.DataFrame(columns=cols)
    cand = pd.concat(parts, ignore_index=True)
    first = cand["first_tile"].to_numpy(np.int64)
    here = bytes_on_tile(first, first + cand["tiles"].to_numpy(np.int64),
                         cand["bytes"].to_numpy(np.float64),
                         cand["grain_bytes"].to_numpy(np.int64), tile)
    keep = here > 0
    out = pd.DataFrame({"name": cand["name"].astype(str).to_numpy()[keep],
                        "category": cand["category"].astype(str).to_numpy()[keep],
                        "bytes": here[keep],
                        "variable_bytes": cand["bytes"].to_numpy(np.int64)[keep],
                        "tiles": cand["tiles"].to_numpy(np.int64)[keep],
                        "live": cand["live"].astype(str).to_numpy()[keep]})
    return out.sort_values("bytes", ascending=False, kind="stable").reset_index(drop=True)


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
